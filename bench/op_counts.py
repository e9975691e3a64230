"""Operators dispatched per training step (issue 50): the aten ops of one step of SGR, SAF, VSRN and
the cached dual trainer, counted by torch.profiler on the CPU, in fp32 and under bf16 autocast. On
a GPU each dispatch is a kernel launch (or a few), so this is the measure of a host-bound step that
any machine can take.

    python bench/op_counts.py --as before      # writes bench/results/op_counts.json["before"]
    python bench/op_counts.py --as after       # ... ["after"]; the other key is kept

The step is `vse train`'s (Trainer.step): forward (under autocast for bf16), the loss (max of
hinges, margin 0.2), backward, ``clip_gradients`` at 2, the trainer's Adam (``create_optimizer``:
fused, one op), ``loss.item()``. It is counted **as the code runs on a GPU** (``as_on_a_gpu``:
``sgraf_ops.accelerator_paths``, the GPU's training chunks and similarity blocks of SGR and SAF
and SAF's running statistics at once, where the CPU takes cache-sized blocks, a loop of hundreds
of small ops that never runs on a GPU; torch's foreach kernels where CUDA takes them, gradient
clipping). ``cpu_path`` counts the same step as it runs on this CPU, for reference. ``before``
was counted at 8132baa (the code as issue 50's work began), whose GPU path was sgraf_ops in one
block a chunk and the CPU's chunks and running-statistics loop.

Sizes: small widths (embed 32, sim_dim 16, 8 members, 32-d features) at the authors' batch (128)
and caption lengths (bench/train_pairwise.py's ``batch``), with the chunk and block budgets scaled
by the same factor as a chunk's per-word size, so the captions fall into the same chunks and
blocks as at the authors' sizes (checked: ``chunks`` and ``chunks_at_authors_sizes``): the ops
per step depend on the chunks and the lengths, not on the widths. VSRN: the same batch and
lengths, its GCN folded as at the authors' sizes (``vsrn.folds``). The dual trainer: the real
Trainer over cached image vectors and caption vectors (``--text-features``: linear heads, MH), one
batch of 128.

Counts: ``dispatched`` (the goal's measure): the aten ops called from Python or from autograd's
engine (no aten op above them), each a trip through the dispatcher and, unless a view, a kernel
launch on a GPU; ``kernel_ops``: those less views and metadata ops (``VIEWS``); ``aten_ops``:
every aten op the profiler saw, nested ones included (how the issue's profile counted:
``aten::linear`` and the ``aten::addmm`` it calls are two); ``by_name``: per op, nested included,
the ops named in the issue first. On the GPU path an RNN module's call counts one op forward and
one backward (cuDNN's), not the CPU's loop over time steps (``RNN_RANGE``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

NAMED = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mul", "aten::mul_", "aten::sum",
         "aten::add", "aten::add_", "aten::div", "aten::copy_", "aten::_to_copy", "aten::masked_fill",
         "aten::softmax", "aten::cat", "aten::index_select")
COUNT_SIZE = dict(batch=128, members=8, feature_dim=32, embed=32, sim_dim=16, word_dim=16, vocab=1000)
VSRN_COUNT_SIZE = dict(batch=128, members=8, feature_dim=32, embed=32, word_dim=16, vocab=1000,
                       caption_hidden=16, caption_word_dim=16, max_len=60)


VIEWS = {"aten::" + n for n in (
    "view", "_unsafe_view", "reshape", "t", "transpose", "slice", "select", "unsqueeze", "squeeze", "expand",
    "expand_as", "as_strided", "narrow", "split", "split_with_sizes", "chunk", "unsafe_chunk", "unsafe_split",
    "unbind", "permute", "alias", "detach", "detach_", "resolve_conj", "resolve_neg", "empty", "empty_like",
    "empty_strided", "unflatten", "flatten", "diagonal", "contiguous", "lift_fresh", "numpy_T", "view_as",
    "_reshape_alias", "split_with_sizes_copy", "is_nonzero", "result_type", "cudnn_is_acceptable")}
RNN_RANGE = "gpu_path::rnn"  # as_on_a_gpu: an RNN module's call, one cuDNN op forward and one backward


def count_ops(step, warmup: int = 1) -> dict:
    """The aten ops of one call of ``step`` (after ``warmup`` calls): see the module text. Within an
    ``RNN_RANGE`` (``as_on_a_gpu``), the RNN's ops and the backward nodes they made count as one
    op forward and one backward: a GPU runs the RNN as cuDNN's ``_cudnn_rnn`` and its backward, the
    CPU as a per-step loop of small ops."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.events()

    def ancestors(event):
        parent = event.cpu_parent
        while parent is not None:
            yield parent
            parent = parent.cpu_parent
    rnn_ranges = [e for e in events if e.name == RNN_RANGE]
    in_rnn = {id(e) for e in events if any(a.name == RNN_RANGE for a in ancestors(e))}
    rnn_sequence = {e.sequence_nr for e in events if id(e) in in_rnn and e.sequence_nr >= 0}
    rnn_backward = {id(e) for e in events if e.name.startswith("autograd::engine::evaluate_function")
                    and e.sequence_nr in rnn_sequence}
    kept = [e for e in events if e.name.startswith("aten::") and id(e) not in in_rnn
            and not any(id(a) in rnn_backward for a in ancestors(e))]
    top = [e for e in kept if not any(a.name.startswith("aten::") for a in ancestors(e))]
    stand_ins = 2 * len(rnn_ranges)  # each RNN: one op forward, one backward
    names = Counter(e.name for e in kept)
    named = {n: names.get(n, 0) for n in NAMED}
    rest = {n: c for n, c in names.most_common() if n not in named}
    return {"dispatched": len(top) + stand_ins,
            "kernel_ops": sum(e.name not in VIEWS for e in top) + stand_ins,
            "aten_ops": len(kept) + stand_ins, "rnn_calls": len(rnn_ranges),
            "top_dispatched": dict(Counter(e.name for e in top).most_common(25)),
            "by_name": {**named, **rest}}


@contextlib.contextmanager
def as_on_a_gpu(scale: float = 1.0):
    """The CPU takes the paths a GPU takes (see the module text; sgraf_ops.accelerator_paths), its
    block budget scaled by ``scale`` (the count sizes' per-word size ÷ the authors', so the blocks
    fall as at the authors' sizes); undone on exit."""
    import torch.utils._foreach_utils as foreach_utils
    from torch.profiler import record_function

    from pipeline.networks import sgraf_ops

    kept = (foreach_utils._get_foreach_kernels_supported_devices, torch.nn.GRU.forward,
            sgraf_ops.ACCELERATOR_BLOCK_FLOATS)
    rnn_forward = kept[1]

    def rnn(self, *args, **kwargs):
        with record_function(RNN_RANGE):
            return rnn_forward(self, *args, **kwargs)
    foreach_utils._get_foreach_kernels_supported_devices = lambda: [*kept[0](), "cpu"]
    torch.nn.GRU.forward = rnn
    sgraf_ops.ACCELERATOR_BLOCK_FLOATS = max(1, int(kept[2] * scale))
    try:
        with sgraf_ops.accelerator_paths():
            yield
    finally:
        (foreach_utils._get_foreach_kernels_supported_devices, torch.nn.GRU.forward,
         sgraf_ops.ACCELERATOR_BLOCK_FLOATS) = kept


def _cast(dtype):
    return (lambda: torch.autocast("cpu", dtype=dtype)) if dtype is not None else contextlib.nullcontext


def _trainer_parts(model, network: str):
    from pipeline.core.config import TrainConfig
    from pipeline.losses.hinge import MaxHingeLoss
    from pipeline.training.factories import create_optimizer, trainable_parameters

    loss_fn = MaxHingeLoss(margin=0.2)
    trainable, _ = trainable_parameters(model, loss_fn)
    settings = TrainConfig(features="x.h5", run_dir="r", network=network, lr=2e-4, grad_clip=2.0)
    return loss_fn, trainable, create_optimizer(settings, model, trainable)


def pairwise_step(network: str, size: dict, dtype=None, budget_scale: float = 1.0,
                  launch_bound_budget: int = 0):
    """Trainer.step of SGR or SAF on one batch of ``size`` (train_pairwise.batch's lengths);
    ``launch_bound_budget``: SGRAF's ``launch_bound_train_pair_budget`` at the authors' sizes
    instead of its own (scaled the same)."""
    from train_pairwise import batch

    from pipeline.networks.network import NetworkConfig, build_network
    from pipeline.training.trainer import clip_gradients

    torch.manual_seed(0)
    config = NetworkConfig(network, feature_dim=size["feature_dim"], set_size=size["members"],
                           embed_dim=size["embed"], vocab_size=size["vocab"], word_dim=size["word_dim"],
                           options={"sim_dim": size["sim_dim"]})
    model = build_network(config).train()
    for budget in ("train_pair_budget", "launch_bound_train_pair_budget"):  # the authors' chunks
        setattr(model, budget, max(1, int(getattr(type(model), budget) * budget_scale)))
    if launch_bound_budget:
        model.launch_bound_train_pair_budget = max(1, int(launch_bound_budget * budget_scale))
    loss_fn, trainable, optimizer = _trainer_parts(model, network)
    images, captions, lengths = batch(size)
    ids, cast = torch.arange(len(images)), _cast(dtype)

    def step():
        with cast():
            scores = model(images, captions, lengths)
        loss = loss_fn.scored(scores.float(), image_ids=ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(trainable, 2.0)
        optimizer.step()
        return loss.item()
    return step


def vsrn_step(size: dict, dtype=None):
    """Trainer.step of VSRN (bench/train_pairwise.vsrn_ours_step, the trainer's loss.item() added)."""
    from train_pairwise import vsrn_ours_step

    step = vsrn_ours_step(size, dtype)
    return step


def chunk_sizes(size: dict, launch_bound: bool = True) -> list[int]:
    """The caption chunks of SGRAF.score in training for ``size``, off the CPU (``launch_bound``) or
    on it, the budget scaled as ``pairwise_step`` scales it (1 at the authors' sizes)."""
    from train_pairwise import batch

    from pipeline.networks.sgraf import SGRAF

    _, _, lengths = batch(size)
    per_word = size["batch"] * max(size["members"], size["embed"])
    budget = SGRAF.launch_bound_train_pair_budget if launch_bound else SGRAF.train_pair_budget
    return _chunks(lengths.sort(descending=True).values.tolist(), per_word,
                   int(budget * per_word / _authors_per_word()))


def _authors_per_word() -> int:
    from train_pairwise import SIZES

    a = SIZES["authors"]
    return a["batch"] * max(a["members"], a["embed"])


def _chunks(lengths: list[int], per_word: int, budget: int) -> list[int]:
    sizes, start = [], 0
    while start < len(lengths):
        sizes.append(min(max(1, budget // (per_word * lengths[start])), len(lengths) - start))
        start += sizes[-1]
    return sizes


def dual_trainer(folder: Path, batch_size: int = 128, dtype=None):
    """The real Trainer of the fast loop (cached image vectors and caption vectors, linear heads,
    MH) over a small synthetic cache, and one batch of it."""
    from dual_step import small_pair

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    features, text = small_pair(folder)
    cfg = TrainConfig(features=str(features), text_features=str(text), run_dir=str(folder / "run"), loss="mh",
                      batch_size=batch_size, embed_dim=64, workers=0, val_every=0, log_every=10 ** 6,
                      cpu_amp=dtype is not None, amp=False)
    trainer = build_trainer(cfg, echo=lambda *a, **k: None)
    return trainer, trainer.epoch_batches(0)


def count_all(modes=("gpu_path", "cpu_path")) -> dict:
    from train_pairwise import SIZES

    from pipeline.core.runtime import EMULATED_BF16_ENV
    from pipeline.networks.vsrn import folds

    os.environ.setdefault(EMULATED_BF16_ENV, "1")  # counting only: bf16 emulated where not native
    scale = COUNT_SIZE["batch"] * max(COUNT_SIZE["members"], COUNT_SIZE["embed"]) / _authors_per_word()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainer, pairs = dual_trainer(Path(tmp) / "fp32")
        trainer_bf16, pairs_bf16 = dual_trainer(Path(tmp) / "bf16", dtype=torch.bfloat16)
        makers = {}
        for precision, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            for network in ("sgr", "saf"):
                makers[f"{network}/{precision}"] = (lambda n=network, d=dtype:
                                                    pairwise_step(n, COUNT_SIZE, d, scale))
            makers[f"vsrn/{precision}"] = lambda d=dtype: vsrn_step(VSRN_COUNT_SIZE, d)
        makers["dual_cached/fp32"] = lambda: (lambda: trainer.step(pairs[0]))
        makers["dual_cached/bf16"] = lambda: (lambda: trainer_bf16.step(pairs_bf16[0]))
        for mode in modes:
            counts = out[mode] = {}
            for name, make in makers.items():
                with as_on_a_gpu(scale) if mode == "gpu_path" else contextlib.nullcontext():
                    counts[name] = count_ops(make())
                print(mode, name, counts[name]["aten_ops"], counts[name]["dispatched"], file=sys.stderr,
                      flush=True)
    if "gpu_path" in modes:  # what the next levers would give (train_pairwise.py --pair-budget on a GPU)
        from pipeline.networks import sgraf_ops

        alternatives = {"one chunk (launch_bound_train_pair_budget 2^30)": (1 << 30, None),
                        "sgraf_ops blocks of 2^27": (0, 1 << 27), "sgraf_ops blocks of 2^28": (0, 1 << 28),
                        "one chunk, blocks of 2^28 (gpu_benches.sh: pairwise_one_chunk)": (1 << 30, 1 << 28)}
        out["gpu_path_alternatives"] = {}
        kept = sgraf_ops.ACCELERATOR_BLOCK_FLOATS
        for name, (budget, block) in alternatives.items():
            sgraf_ops.ACCELERATOR_BLOCK_FLOATS = block or kept
            with as_on_a_gpu(scale):
                out["gpu_path_alternatives"][name] = {
                    f"{network}/fp32": count_ops(pairwise_step(network, COUNT_SIZE, None, scale, budget))
                    ["dispatched"] for network in ("sgr", "saf")}
            sgraf_ops.ACCELERATOR_BLOCK_FLOATS = kept
    authors = SIZES["authors"]
    out["sizes"] = {"pairwise": COUNT_SIZE, "vsrn": VSRN_COUNT_SIZE, "dual_cached": "batch 128, embed 64",
                    "chunks": chunk_sizes(COUNT_SIZE), "chunks_at_authors_sizes": chunk_sizes(authors),
                    "chunks_on_the_cpu_path": chunk_sizes(COUNT_SIZE, False),
                    "vsrn_folds": folds(VSRN_COUNT_SIZE["embed"], 128 * VSRN_COUNT_SIZE["members"]),
                    "vsrn_folds_at_authors_sizes": folds(SIZES["vsrn_authors"]["embed"],
                                                         128 * SIZES["vsrn_authors"]["members"])}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--as", dest="key", default="after", help="the JSON key to write: before or after")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "op_counts.json"))
    parser.add_argument("--commit", default="", help="the commit the counted code is at (recorded)")
    args = parser.parse_args(argv)
    from benchkit import write_report

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    report.pop("created", None)
    report[args.key] = {"torch": torch.__version__, "commit": args.commit, **count_all()}
    before, after = report.get("before"), report.get("after")
    if before and after:
        report["ratio_before_over_after"] = {
            mode: {name: {k: round(before[mode][name][k] / after[mode][name][k], 2)
                          for k in ("dispatched", "kernel_ops", "aten_ops")}
                   for name in after[mode] if name in before.get(mode, {})}
            for mode in ("gpu_path", "cpu_path") if mode in after}
    report["goal"] = ("gpu_path dispatched at least 4x fewer than before for sgr, saf and vsrn, in fp32 and "
                      "bf16 (issue 50)")
    write_report(report, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
