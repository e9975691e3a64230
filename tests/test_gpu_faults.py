"""Faults only a CUDA device or NCCL would show, each reproduced on the CPU by faking
the device facts (``torch.cuda.*`` answers, ranks), plus checks that run only on a real GPU.

1 CUDA RNG state per rank · 2 bf16 from compute capability · 3 the GRU in fp32 under autocast ·
4 resume across loss scaling · 5 --device cuda:N and LOCAL_RANK · 7 only rank 0 speaks ·
8 evaluation in fp32 · 9 one host sync per step · kernels (deterministic / benchmark) ·
the process group: gloo when ranks share a GPU, destroyed at exit.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import QUIET, TINY_TRAIN

from cli.main import cli
from pipeline.core import distributed, runtime
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.data.batches import Batch
from pipeline.data.captions import CachedCaptionVectors, GRUCaptions
from pipeline.networks.vse_model import ModelConfig, TextEncoder
from pipeline.training import factories as factories_module
from pipeline.training import trainer as train_module
from pipeline.training.build import build_trainer

ROOT = Path(__file__).resolve().parents[1]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

def _config(cache, run_dir, **overrides) -> TrainConfig:
    return TrainConfig(features=str(cache), run_dir=str(run_dir), **{**TINY_TRAIN, **overrides})


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two visible GPUs as far as the code can ask; returns the devices set_device was given."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return chosen


@pytest.fixture
def fake_generators(monkeypatch):
    """Per-device CUDA generator states (a dict device index → tensor)."""
    states = {0: torch.tensor([0], dtype=torch.uint8), 1: torch.tensor([1], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[torch.device(device).index])

    def set_state(state, device="cuda"):
        index = torch.device(device).index
        if index >= 2:
            raise IndexError("no such GPU")  # what torch does for a GPU that is not there
        states[index] = state

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_state)
    return states


# ---------------------------------------------------------------------------- 1 RNG per rank


def test_each_rank_gets_back_its_own_cuda_generator(fake_generators, tiny_cache, tmp_path, monkeypatch):
    rank_states = [torch.tensor([10], dtype=torch.uint8), torch.tensor([11], dtype=torch.uint8)]
    trainer = build_trainer(_config(tiny_cache, tmp_path / "run", loss="sh"), **QUIET)
    # the checkpoint's RNG entry on a 2-process GPU run: each rank's state, gathered in rank order
    monkeypatch.setattr(train_module, "device_rng_state", lambda device: rank_states[0])
    monkeypatch.setattr(distributed, "all_gather_object", lambda own: [own, rank_states[1]])
    state = trainer.rng_state()
    assert [s.item() for s in state["device"]] == [10, 11]

    runtime.set_rng_state(state, torch.device("cuda", 1), rank=1)  # rank 1 on GPU 1
    runtime.set_rng_state(state, torch.device("cuda", 0), rank=0)
    assert fake_generators[1].item() == 11 and fake_generators[0].item() == 10
    # resumed by one process on one GPU (the 2-GPU machine had cuda:1 too): no IndexError
    runtime.set_rng_state({**state, "device": state["device"][:1]}, torch.device("cuda", 0), rank=0)
    # a checkpoint of the old layout (rank 0's states of every visible GPU) on fewer GPUs
    legacy = {**{k: v for k, v in state.items() if k != "device"},
              "cuda": [torch.tensor([20], dtype=torch.uint8)] * 4}
    runtime.set_rng_state(legacy, torch.device("cuda", 1), rank=0)
    assert fake_generators[1].item() == 20
    runtime.set_rng_state(legacy, torch.device("cuda", 0), rank=1)  # not rank 1's: left as seeded
    assert fake_generators[0].item() == 10
    # CPU runs save no device state and restore none
    assert "device" not in runtime.rng_state([runtime.device_rng_state(torch.device("cpu"))])


@CUDA
def test_cuda_generator_round_trip_on_a_real_gpu():
    device = runtime.resolve_device("cuda")
    state = runtime.rng_state([runtime.device_rng_state(device)])
    expected = torch.rand(8, device=device)
    runtime.set_rng_state(state, device, rank=0)
    assert torch.equal(torch.rand(8, device=device), expected)


# ---------------------------------------------------------------------------- 2 bf16 or fp16


@pytest.mark.parametrize("capability,dtype", [((7, 0), torch.float16), ((7, 5), torch.float16),
                                              ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_bf16_only_from_compute_capability_8(monkeypatch, capability, dtype):
    asked = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what a V100 answers
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: asked.append(device) or capability)
    gpu = torch.device("cuda", 1)
    assert runtime.amp_dtype(gpu) == dtype
    assert runtime.needs_grad_scaler(gpu) is (dtype == torch.float16)
    assert not runtime.needs_grad_scaler(gpu, enabled=False)
    assert asked and all(device == gpu for device in asked)  # the given GPU, not the current one
    cpu = torch.device("cpu")
    assert runtime.amp_dtype(cpu) is None and not runtime.needs_grad_scaler(cpu)


# ---------------------------------------------------------------------------- 3 GRU in fp32


def _text_encoder():
    torch.manual_seed(0)
    return TextEncoder(ModelConfig(vocab_size=20, feature_dim=8, embed_dim=6, word_dim=4))


def test_the_gru_runs_in_fp32_under_autocast():
    encoder = _text_encoder()
    seen = []
    encoder.rnn.register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_autocast_enabled("cpu"), args[0].data.dtype)))
    tokens, lengths = torch.randint(1, 20, (5, 7)), torch.tensor([7, 3, 5, 1, 2])
    plain = encoder(tokens, lengths)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = encoder(tokens, lengths)
    assert seen == [(False, torch.float32)] * 2
    assert mixed.dtype == torch.float32 and torch.equal(mixed, plain)


@CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_gru_runs_in_fp32_under_cuda_autocast(dtype):
    encoder = _text_encoder().cuda()
    seen = []
    encoder.rnn.register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_autocast_enabled("cuda"), args[0].data.dtype)))
    tokens, lengths = torch.randint(1, 20, (5, 7)).cuda(), torch.tensor([7, 3, 5, 1, 2])
    with torch.autocast("cuda", dtype=dtype):
        out = encoder(tokens, lengths)
    out.sum().backward()
    assert seen == [(False, torch.float32)]
    assert all(p.grad.dtype == torch.float32 for p in encoder.rnn.parameters())


# ---------------------------------------------------------------------------- 4 scaler state


@pytest.mark.parametrize("first,second", [(False, True), (True, False), (True, True)])
def test_resume_across_loss_scaling(tiny_cache, tmp_path, monkeypatch, first, second):
    """A run saved without loss scaling (CPU, bf16, --no-amp) resumed where fp16 needs it, and
    the other way round.  CPU GradScalers stand in for the GPU's (same state, same code path)."""
    run = tmp_path / "run"
    monkeypatch.setattr(factories_module, "needs_grad_scaler", lambda device, enabled=True: first)
    build_trainer(_config(tiny_cache, run, loss="sh", epochs=1, batch_size=40), **QUIET).fit()
    saved = load_checkpoint(run / "last.pt")["scaler"]
    assert bool(saved) is first
    monkeypatch.setattr(factories_module, "needs_grad_scaler", lambda device, enabled=True: second)
    said = []
    trainer = build_trainer(_config(tiny_cache, run, loss="sh", epochs=2, batch_size=40), resume=True,
                      echo=said.append)
    if first and second:
        assert trainer.scaler.get_scale() == saved["scale"]
    assert any("fp16 loss scaling" in line for line in said) is (first != second)
    trainer.fit()
    assert load_checkpoint(run / "last.pt")["iteration"] == 6  # 120 training pairs / 40, twice


# ---------------------------------------------------------------------------- 5 device choice


def test_device_choice_follows_local_rank_and_sets_the_current_gpu(fake_gpus, monkeypatch):
    assert runtime.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert fake_gpus == [torch.device("cuda", 1)]  # not GPU 0's context for a cuda:1 run
    with pytest.raises(VseError, match=r"only 2 CUDA device\(s\) are visible"):
        runtime.resolve_device("cuda:2")
    with pytest.raises(VseError, match="unknown device"):
        runtime.resolve_device("cuda:one")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert runtime.resolve_device("cuda") == runtime.resolve_device("auto") == torch.device("cuda", 1)
    with pytest.raises(VseError, match="CUDA_VISIBLE_DEVICES"):
        runtime.resolve_device("cuda:0")  # every rank would land on GPU 0
    assert runtime.resolve_device("cpu") == torch.device("cpu")


def test_ranks_that_share_a_gpu_use_gloo(fake_gpus, monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.choose_backend(gpu) == "nccl"  # two GPUs for two processes
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.warns(UserWarning, match="NCCL cannot put two ranks on one GPU"):
        assert distributed.choose_backend(gpu) == "gloo"
    assert distributed.choose_backend(torch.device("cpu")) == distributed.choose_backend(None) == "gloo"


@pytest.mark.parametrize("finetune,freeze_bn,synced", [(True, False, True), (True, True, False),
                                                        (False, False, False)])
def test_ddp_syncs_buffers_under_the_name_this_torch_takes(monkeypatch, finetune, freeze_bn, synced):
    """torch 2.14 renamed DDP's broadcast_buffers to forward_sync_buffers; torch 2.11 (a lent H200)
    refused the new name, so every torchrun run died at build time there."""
    import inspect
    from types import SimpleNamespace

    from torch.nn.parallel import DistributedDataParallel

    taken = inspect.signature(DistributedDataParallel.__init__).parameters
    assert factories_module._BUFFER_SYNC in taken  # a name this torch's DDP accepts
    given = {}
    monkeypatch.setattr(factories_module, "DistributedDataParallel",
                        lambda model, **kwargs: given.update(kwargs) or model)
    model = torch.nn.Linear(2, 2)
    settings = SimpleNamespace(finetune=finetune, freeze_bn=freeze_bn)
    assert factories_module.wrap_ddp(model, settings, False) is model and not given  # one process: bare
    factories_module.wrap_ddp(model, settings, True)
    assert given[factories_module._BUFFER_SYNC] is synced and given["device_ids"] is None
    assert set(given) <= set(taken)


def test_the_process_group_is_destroyed_at_exit(tmp_path, monkeypatch):
    """init_from_env registers its shutdown; shutdown destroys a real (one-process) gloo group."""
    import torch.distributed as dist

    registered = []
    monkeypatch.setattr(distributed.atexit, "register", registered.append)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    real_init = dist.distributed_c10d.init_process_group
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend: real_init(backend, store=store, rank=0, world_size=1))
    try:
        assert distributed.init_from_env(torch.device("cpu"))
        assert dist.is_initialized() and registered == [distributed.shutdown]
        registered[0]()
        assert not dist.is_initialized()
    finally:
        distributed.shutdown()


# ---------------------------------------------------------------------------- 7 set-up echo


def test_only_rank_0_speaks_at_set_up(tiny_cache, tmp_path, monkeypatch):
    said = []
    # device cpu named: on a GPU machine auto would pick cuda (seen on a lent H200)
    trainer = build_trainer(_config(tiny_cache, tmp_path / "a", loss="sh", device="cpu"), echo=said.append)
    assert trainer.setup_line.startswith("device cpu")  # said by fit() once the run folder is locked
    trainer.echo("hello")
    assert said == ["hello"]

    def init_as_rank_1(device):  # the rank is known only once the process group exists
        monkeypatch.setattr(distributed, "rank", lambda: 1)
        return False

    monkeypatch.setattr(distributed, "init_from_env", init_as_rank_1)
    said = []
    build_trainer(_config(tiny_cache, tmp_path / "b", loss="sh"), echo=said.append).echo("hello")
    assert said == []


# ---------------------------------------------------------------------------- 8 evaluation precision


@pytest.fixture
def trained(sh_run):
    return sh_run


def test_evaluation_and_validation_run_in_fp32_unless_asked(trained, tiny_cache, tmp_path, monkeypatch):
    from pipeline.evaluation import inference

    asked = []
    real = inference.precision
    monkeypatch.setattr(inference, "precision", lambda device, amp: asked.append(amp) or real(device, amp))
    evaluate = ["evaluate", "--checkpoint", str(trained / "best.pt"), "--features", str(tiny_cache), "--json"]
    runner = CliRunner()
    fp32 = runner.invoke(cli, evaluate)
    assert fp32.exit_code == 0, fp32.output
    assert asked and not any(asked)
    asked.clear()
    mixed = runner.invoke(cli, [*evaluate, "--amp"])
    assert mixed.exit_code == 0 and asked and all(asked)
    assert json.loads(mixed.output) == json.loads(fp32.output)  # autocast is a no-op on a CPU
    refused = runner.invoke(cli, ["evaluate", "--embeddings", str(tmp_path / "x.npz"), "--amp"])
    assert refused.exit_code == 2 and "--amp goes with --checkpoint" in refused.output
    asked.clear()
    trainer = build_trainer(_config(tiny_cache, tmp_path / "run", loss="sh", amp=True), **QUIET)
    trainer.validate()
    assert asked and not any(asked)  # metrics.jsonl agrees with `vse evaluate`
    assert json.loads((trained / "config.json").read_text())["deterministic"] is True


def test_full_fp32_turns_tf32_off_on_a_gpu_and_back():
    switches = runtime.FP32_SWITCHES
    before = [s.fp32_precision for s in switches]
    with runtime.full_fp32(torch.device("cuda", 0)):
        assert [s.fp32_precision for s in switches] == ["ieee"] * len(switches)
    assert [s.fp32_precision for s in switches] == before
    with runtime.full_fp32(torch.device("cpu")):
        assert [s.fp32_precision for s in switches] == before


@CUDA
def test_a_checkpoint_embeds_the_same_on_cpu_and_gpu(trained, tiny_cache):
    from pipeline.evaluation.evaluate import embed_checkpoint

    cpu = embed_checkpoint(trained / "best.pt", tiny_cache, "test", torch.device("cpu"))
    gpu = embed_checkpoint(trained / "best.pt", tiny_cache, "test", runtime.resolve_device("cuda"))
    np.testing.assert_allclose(gpu.images, cpu.images, rtol=0, atol=1e-5)
    np.testing.assert_allclose(gpu.captions, cpu.captions, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- 9 host syncs


class HostReads:
    """Counts, during a block, what would make the host wait for a GPU when called by the
    project's code on a device tensor: reading values (item, tolist, bool(), float(), int(),
    numpy), copying to the host (cpu), and boolean-mask indexing (a nonzero under the hood).
    ``keep``: tensors that live on the host by design (the caption lengths) — their cpu() is free.
    Reads inside torch itself (Adam's and the GRU's host-side counters) are not the project's
    and stay on the host on a GPU as well, so only calls made from pipeline/ are counted."""

    METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__getitem__")

    def __init__(self, monkeypatch, keep=()):
        self.calls, self.keep = [], keep
        for name in self.METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))

    def _wrap(self, name, method):
        counter = self

        def wrapper(tensor, *args, **kwargs):
            frame = sys._getframe(1)
            caller = Path(frame.f_code.co_filename)
            if ROOT / "pipeline" in caller.parents and counter._syncs(name, tensor, args):
                counter.calls.append(f"{name} in {caller.name}:{frame.f_lineno} ({frame.f_code.co_name})")
            return method(tensor, *args, **kwargs)

        return wrapper

    def _syncs(self, name, tensor, args) -> bool:
        if name == "__getitem__":
            index = args[0] if args else None
            return isinstance(index, torch.Tensor) and index.dtype == torch.bool
        return not (name == "cpu" and any(tensor is kept for kept in self.keep))


LOSSES = [("sh", {}), ("mh", {}), ("mh", {"negative_set_size": 5}), ("order", {}), ("csn", {}), ("cmn", {}),
          ("mvn", {})]


@pytest.mark.parametrize("loss,options", LOSSES)
def test_one_host_sync_per_training_step(tiny_cache, tmp_path, monkeypatch, loss, options):
    # the CPU's reads: device cpu named, as on a GPU machine auto picks cuda (the next test)
    trainer = build_trainer(_config(tiny_cache, tmp_path / "run", loss=loss, loss_options=options,
                                    device="cpu"), **QUIET)
    pairs = trainer.epoch_batches(0)
    trainer.step(pairs[0])  # Adam's state exists from now on, as in every later step
    batch = pairs[1]
    with monkeypatch.context() as m:
        reads = HostReads(m, keep=[batch.captions[i] for i in batch.host_captions])
        trainer.step(batch)
    # the loss, read once; on a CPU also the clipping coefficient (free there: no device to
    # wait for; on a GPU clip_gradients reads nothing, see the next test)
    assert [call.split(":")[0] + call.split(" ")[-1] for call in reads.calls] == [
        "__bool__ in trainer.py(clip_gradients)", "item in trainer.py(_update)"]


def test_gradient_clipping_reads_nothing_back_from_a_device(monkeypatch):
    """On any device but the CPU (here "meta", which has no data to read) clip_gradients
    scales the gradients as clip_grad_norm_ does, without a host read."""
    from pipeline.training.trainer import clip_gradients

    parameters = [torch.nn.Parameter(torch.empty(4, 3, device="meta")) for _ in range(2)]
    for q in parameters:
        q.grad = torch.empty(4, 3, device="meta")
    with monkeypatch.context() as m:
        reads = HostReads(m)
        clip_gradients(parameters, 2.0)
    assert reads.calls == []


def test_caption_lengths_stay_on_the_host():
    tokens, lengths = torch.ones(2, 3, dtype=torch.int64), torch.tensor([3, 2])
    batch = Batch(torch.zeros(2, 4), (tokens, lengths), torch.tensor([0, 1]), torch.tensor([0, 5]),
                  GRUCaptions.host_inputs)
    moved = batch.to(torch.device("meta"))
    assert moved.captions[1] is lengths
    others = (moved.images, moved.captions[0], moved.image_ids, moved.caption_ids)
    assert {t.device.type for t in others} == {"meta"}
    vectors = Batch(torch.zeros(2, 4), (torch.zeros(2, 8),), torch.tensor([0, 1]), torch.tensor([0, 5]),
                    CachedCaptionVectors.host_inputs).to(torch.device("meta"))
    assert vectors.captions[0].device.type == "meta"


def test_packing_is_pack_padded_sequence_without_its_blocking_copy():
    from torch.nn.utils.rnn import pack_padded_sequence

    from pipeline.networks.layers import pack_by_length as _pack

    torch.manual_seed(0)
    padded, lengths = torch.randn(16, 9, 5), torch.randint(1, 10, (16,))
    expected = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
    got = _pack(padded, lengths)
    for field in ("data", "batch_sizes", "sorted_indices", "unsorted_indices"):
        assert torch.equal(getattr(got, field), getattr(expected, field)), field


def test_a_non_finite_loss_stops_before_any_checkpoint_holds_it(tiny_cache, tmp_path):
    trainer = build_trainer(_config(tiny_cache, tmp_path / "run", loss="sh", epochs=1, val_every=1),
                                  **QUIET)
    real, calls = trainer.loss, []

    class NanAtTheThirdStep(torch.nn.Module):  # a loss is a Module (its state is checkpointed)
        def forward(self, img, cap, **kwargs):
            calls.append(1)
            value = real(img, cap, **kwargs)
            return value * math.nan if len(calls) == 3 else value

    trainer.loss = NanAtTheThirdStep()
    with pytest.raises(VseError, match="loss became nan at epoch 1, iteration 3"):
        trainer.fit()
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["iteration"] == 2  # validated and saved after steps 1 and 2, never after 3
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["iteration"] for r in records] == [1, 2]


@CUDA
def test_one_host_sync_per_step_on_a_real_gpu(tiny_cache, tmp_path):
    trainer = build_trainer(_config(tiny_cache, tmp_path / "run", loss="mh", device="cuda"), **QUIET)
    pairs = trainer.epoch_batches(0)
    trainer.step(pairs[0].pin_memory())
    batch = pairs[1].pin_memory()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchronizing" in str(w.message)]
    # the loss read; GradScaler (fp16, compute capability < 8) reads its overflow flag too
    assert len(syncs) == 1 + trainer.scaler.is_enabled(), [str(w.message) for w in syncs]


# ---------------------------------------------------------------------------- kernels


def test_kernel_choices(monkeypatch):
    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    gpu = torch.device("cuda", 0)
    try:
        assert runtime.configure_kernels(torch.device("cpu"), deterministic=True) == ""
        assert not torch.are_deterministic_algorithms_enabled()  # CPU kernels are deterministic already
        assert runtime.configure_kernels(gpu, fixed_shapes=True) == "cudnn.benchmark" and cudnn.benchmark
        assert runtime.configure_kernels(gpu) == "" and not cudnn.benchmark  # cached: varying lengths
        chosen = runtime.configure_kernels(gpu, deterministic=True, fixed_shapes=True)
        assert chosen == "deterministic kernels"
        assert cudnn.deterministic and not cudnn.benchmark
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert runtime.os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        cudnn.benchmark, cudnn.deterministic = saved[:2]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])
