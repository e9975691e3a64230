"""bf16 autocast on a CPU that has native bf16 (--cpu-amp, only when asked for by name: every CPU
trains in fp32 by default, tests/test_cpu_defaults.py): detected from the CPU's own flags, refused
where it would be emulated, used by the training step only (validation is fp32)."""

from __future__ import annotations

import pytest
import torch
from conftest import train

from pipeline.core import runtime
from pipeline.core.errors import VseError

SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC_ROME = "processor\t: 0\nflags\t\t: fpu sse avx2 sha_ni\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    assert runtime.cpu_native_bf16(SAPPHIRE_RAPIDS) and runtime.cpu_native_bf16(GRAVITON3)
    assert not runtime.cpu_native_bf16(EPYC_ROME) and not runtime.cpu_native_bf16("")


def test_cpu_amp_is_refused_without_native_bf16_and_bf16_with_it(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: False)
    with pytest.raises(VseError, match="--cpu-amp: this CPU has no native bf16"):
        runtime.train_dtype(cpu, amp=True, cpu_amp=True)
    assert runtime.train_dtype(cpu, amp=True, cpu_amp=False) is None  # --amp alone: a GPU's
    monkeypatch.setenv(runtime.EMULATED_BF16_ENV, "1")  # code paths can be tested anywhere, said aloud
    assert runtime.train_dtype(cpu, amp=True, cpu_amp=True) is torch.bfloat16
    assert runtime.describe(cpu, True, cpu_amp=True) == "cpu, bf16 autocast (EMULATED, slow bf16)"
    monkeypatch.delenv(runtime.EMULATED_BF16_ENV)
    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: True)
    assert runtime.train_dtype(cpu, amp=True, cpu_amp=True) is torch.bfloat16
    layer = torch.nn.Linear(4, 3)
    with runtime.autocast(cpu, True, torch.bfloat16):
        assert layer(torch.randn(2, 4)).dtype is torch.bfloat16
    with runtime.autocast(cpu, True):  # no dtype asked for: fp32 on a CPU, as before
        assert layer(torch.randn(2, 4)).dtype is torch.float32
    assert runtime.describe(cpu, True, cpu_amp=True) == "cpu, bf16 autocast (native bf16)"
    assert runtime.describe(cpu, True) == "cpu, fp32 (this CPU has native bf16: --cpu-amp uses it)"


def test_a_run_with_cpu_amp_trains_and_its_set_up_line_says_bf16(tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: True)  # emulated here: correct, only slow
    result = train(tiny_cache, tmp_path / "run", "--cpu-amp", "--epochs", 2)
    assert result.exit_code == 0, result.output
    assert "device cpu, bf16 autocast (native bf16)" in result.output
    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: False)
    refused = train(tiny_cache, tmp_path / "other", "--cpu-amp")
    assert refused.exit_code == 1 and "no native bf16" in refused.output


def test_the_training_step_computes_the_heads_in_bf16_and_validation_in_fp32(tiny_cache, tmp_path,
                                                                             monkeypatch):
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: True)
    trainer = build_trainer(TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "r"), loss="sh",
                                        epochs=1, embed_dim=8, word_dim=8, batch_size=8, min_word_count=1,
                                        val_every=0, workers=0, device="cpu", cpu_amp=True),
                            echo=lambda *a, **k: None)
    seen = []
    linear = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    trainer.step(next(iter(trainer.loader(trainer.epoch_batches(0), 0))))
    assert seen == [torch.bfloat16]
    seen.clear()
    trainer.validate()
    assert seen and set(seen) == {torch.float32}


def test_sgr_and_saf_train_under_bf16_autocast_with_fp32_weights_and_gradients():
    """Under bf16 autocast the similarity stage (its own autograd node, ``sgraf_ops.similarity_nodes``) runs
    in bf16, the score layer in fp32 (bf16 scores tie and change MH: PROTOCOL, "Numeric precision"),
    and every gradient lands on the fp32 weights, finite."""
    from pipeline.networks.network import NetworkConfig, build_network

    for name in ("sgr", "saf"):
        torch.manual_seed(0)
        model = build_network(NetworkConfig(name, feature_dim=6, set_size=5, embed_dim=8, vocab_size=20,
                                            word_dim=4, options={"sim_dim": 4, "dropout": 0.0})).train()
        images, captions = torch.randn(3, 5, 6), torch.randint(1, 20, (3, 7))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            scores = model(images, captions, torch.tensor([7, 5, 3]))
        assert scores.dtype is torch.float32 and scores.shape == (3, 3)
        scores.float().sum().backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and g.dtype is torch.float32 and torch.isfinite(g).all() for g in grads)


def test_the_bf16_bench_measures_sgraf_scoring_and_training_side_by_side(tmp_path):
    import importlib.util
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("cpu_bf16_bench", bench / "cpu_bf16.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = tmp_path / "micro.json"
        assert module.main(["--micro", "--micro-sizes", "tiny", "--micro-captions", "6", "--rounds", "1",
                            "--allow-emulated", "--out", str(out)]) == 0
    finally:
        sys.path.remove(str(bench))
    report = json.loads(out.read_text())
    for name in ("sgr", "saf"):
        entry = report["networks"][name]
        assert set(entry["median_s"]) == {f"{part}_{p}" for part in ("train_step", "scoring")
                                          for p in ("fp32", "bf16")}
        assert entry["scoring_pairs_per_s"]["bf16"] > 0 and 0 <= entry["bf16_same_best_image_share"] <= 1


@pytest.mark.parametrize("native", [True, False])
def test_cpu_amp_is_off_unless_asked_for_on_every_cpu(monkeypatch, native):
    """Issue 58 replaced issue 43's rule (bf16 by default for the fast loop on a native-bf16 CPU): a
    command gives the same numerics on every CPU; an explicit value wins."""
    from pipeline.core import cpuinfo
    from pipeline.core.config import TrainConfig

    monkeypatch.setattr(cpuinfo, "cpu_native_bf16", lambda: native)
    fast = dict(features="f.h5", text_features="t.h5")
    assert TrainConfig(**fast).cpu_amp is False
    assert TrainConfig(**fast, cpu_amp=True).cpu_amp is True
    for other in (dict(features="f.h5"), dict(**fast, image_pool="gpo"), dict(**fast, network="sgr"),
                  dict(features="f.h5", network="vsrn")):
        assert TrainConfig(**other).cpu_amp is False


def test_no_cpu_amp_is_still_accepted_and_records_fp32(tiny_cache, tmp_path, monkeypatch):
    import json

    monkeypatch.setattr(runtime, "cpu_native_bf16", lambda: True)
    result = train(tiny_cache, tmp_path / "run", "--no-cpu-amp")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["cpu_amp"] is False and config["precision"]["label"] == "fp32/fp32/fp32"
