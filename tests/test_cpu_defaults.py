"""Defaults that do not depend on the machine (issue 58): a command without precision options
computes in fp32 on every CPU, bf16 on a CPU is asked for by name (--cpu-amp), and config.json
records the precision that was applied, not the unresolved flag; config_id stays what the same
behaviour had before the record existed."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import vse

from pipeline.core import precision, runtime
from pipeline.core.config import TrainConfig, recorded_config, run_options, with_old_defaults
from pipeline.core.cpuinfo import cpu_native_bf16
from pipeline.training.run_folder import config_id, read_config

FP32 = {"network": "fp32", "loss": "fp32", "evaluation": "fp32", "label": "fp32/fp32/fp32"}
BF16 = {"network": "bf16", "loss": "fp32", "evaluation": "fp32", "label": "bf16/fp32/fp32"}


@pytest.fixture(scope="module")
def tiny_text(tiny_cache, tmp_path_factory):
    """CBoW caption vectors of the tiny cache: with them vse++ is the fast loop (two linear heads)."""
    from pipeline.data.caption_features import encode_text

    out = tmp_path_factory.mktemp("text") / "tiny_text.h5"
    encode_text(tiny_cache, "cbow", out, device="cpu")
    return out


def fast_loop(tiny_cache, tiny_text, run_dir, *flags):
    """`vse train` of the fast loop (vse++ over cached image and caption vectors), no precision
    option unless ``flags`` gives one; the device as the user's: auto."""
    return vse("train", "--features", tiny_cache, "--text-features", tiny_text, "--run-dir", run_dir,
               "--loss", "mh", "--epochs", 1, "--embed-dim", 8, "--batch-size", 8, "--val-every", 0,
               "--workers", 0, *flags)


def recorded(run_dir) -> tuple[dict, dict]:
    config = json.loads((run_dir / "config.json").read_text())
    state = torch.load(run_dir / "last.pt", weights_only=True, map_location="cpu")
    return config, state


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU default: this machine trains on its GPU")
def test_the_fast_loop_without_precision_options_records_fp32_on_this_cpu(tiny_cache, tiny_text, tmp_path):
    """Meaningful where the CPU has native bf16 (the old default trained the fast loop in bf16 there),
    and true on any CPU."""
    result = fast_loop(tiny_cache, tiny_text, tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "device cpu, fp32" in result.output
    config, state = recorded(tmp_path / "run")
    assert config["amp"] is False and config["cpu_amp"] is False  # as applied: no "amp": true on a CPU
    assert config["precision"] == {**FP32, "device": "cpu", "identity": {"amp": True, "cpu_amp": False}}
    assert state["precision"] == FP32 and state["train_config"] == config  # the checkpoint says the same
    # the same behaviour before the record: config_id as an older run's config.json ("amp": true) gives
    given = TrainConfig.from_dict(run_options(config)).to_dict()
    assert given["amp"] is True and "precision" not in given
    assert config_id(read_config(tmp_path / "run")) == config_id(given)
    assert config_id(config) == config_id(given)  # the raw file too


@pytest.mark.skipif(not cpu_native_bf16(), reason="this CPU has no native bf16: --cpu-amp is refused here "
                                                  "(test_cpu_bf16 checks the refusal)")
@pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu-amp applies on a CPU; this machine has a GPU")
def test_cpu_amp_by_name_records_bf16(tiny_cache, tiny_text, tmp_path):
    result = fast_loop(tiny_cache, tiny_text, tmp_path / "run", "--cpu-amp")
    assert result.exit_code == 0, result.output
    config, state = recorded(tmp_path / "run")
    assert config["cpu_amp"] is True and config["amp"] is False
    assert config["precision"]["label"] == BF16["label"] and state["precision"] == BF16
    fp32 = {**config, "cpu_amp": False, "precision": {**config["precision"], "identity": {"amp": True,
                                                                                         "cpu_amp": False}}}
    assert config_id(config) != config_id(fp32)  # another behaviour, another configuration


def test_no_cpu_decides_the_default_by_its_model(monkeypatch):
    """The config alone decides: the same on a CPU with native bf16 and one without."""
    fast = dict(features="f.h5", text_features="t.h5")
    seen = set()
    for native in (True, False):
        monkeypatch.setattr(runtime, "cpu_native_bf16", lambda native=native: native)
        monkeypatch.setattr("pipeline.core.cpuinfo.cpu_native_bf16", lambda native=native: native)
        seen.add(json.dumps(TrainConfig(**fast).to_dict(), sort_keys=True))
        assert runtime.train_dtype(torch.device("cpu"), TrainConfig(**fast).amp,
                                   TrainConfig(**fast).cpu_amp) is None
    assert len(seen) == 1 and TrainConfig(**fast).cpu_amp is False
    assert TrainConfig(**fast, cpu_amp=True).cpu_amp is True  # by name


@pytest.mark.parametrize("device, applied", [("cpu", {"amp": False, "cpu_amp": True}),
                                             ("cuda", {"amp": True, "cpu_amp": False})])
def test_config_json_holds_the_options_as_the_device_applied_them(device, applied):
    config = TrainConfig(features="f.h5", text_features="t.h5", cpu_amp=True)  # asked, and --amp's default
    used = precision.Precision(network="bf16" if device == "cpu" else "bf16+tf32")
    values = recorded_config(config, used, device)
    assert {name: values[name] for name in precision.OPTIONS} == applied
    assert values["precision"]["device"] == device and values["precision"]["label"] == used.label
    back = with_old_defaults(values)  # how --resume, vse sweep and config_id read it
    assert back["amp"] is True and back["cpu_amp"] is True and "precision" not in back
    assert TrainConfig.from_dict(values).to_dict() == config.to_dict()


def test_a_runs_config_json_is_a_config_file_for_vse_train(tiny_cache, tmp_path):
    """`vse train --config RUN/config.json` takes the run's options (its precision record is no option)."""
    values = recorded_config(TrainConfig(features=str(tiny_cache)), precision.Precision("fp32"), "cpu")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    from cli.train_cmd import _read_config_file

    assert _read_config_file(str(path)) == TrainConfig(features=str(tiny_cache)).to_dict()
