"""Training steps of SGR and SAF (pipeline.models.sgraf) against the arithmetic they do and
against the authors' code, side by side in one process, plus the peak memory of each.

    python bench/train_pairwise.py                 # the authors' sizes (minutes on 2 cores)
    python bench/train_pairwise.py --small         # a quick run
    python bench/train_pairwise.py --bf16          # adds our step under bf16 autocast

Sizes (``--small`` shrinks them): a batch of 128 images of 36 regions × 2048 and 128 captions of
word ids (vocabulary 8,000, word_dim 300, lengths drawn once around Flickr30K's mean of 12 words
plus ``<start>``/``<end>``), embed 1024, sim_dim 256, 3 SGR steps: the authors' opts.py.

Timed per network, interleaved over ``--steps`` rounds (they share any drift in machine load),
medians reported with max/min:

- ``ours``: the network's train-mode forward (B × B scores), the hinge loss (margin 0.2, hardest
  negatives), backward, gradient clipping at 2 and an Adam step;
- ``authors``: their ``SGRAF.train_emb`` on the same batch and weights of the same sizes (their
  model.py imported at run time from ``--authors`` (default: $VSE_SGRAF_CHECKOUT), with
  ``torch.cuda.is_available`` False; skipped when absent);
- ``gemm``: the matrix products alone of the same step (image fc, the BiGRU, VisualSA/TextSA's
  linears, word × region attention, the attended context, the local similarity's linear, SGR's
  graph or SAF's attention linear, forward and backward) over the captions grouped by length, so
  nothing is padded: what the arithmetic costs on this CPU. ``ours`` ÷ ``gemm`` steps/s is the
  fraction of the arithmetic's limit that the step reaches (target ≥ 0.8).

Also the multiply-add count of a forward pass, and the fp32 matmul rate of this CPU (a 2048³
product), so ``flop / rate`` is a second, cruder limit. Peak memory: each step kind run once in a
child process of its own, its ``ru_maxrss``. ``--vsrn`` adds VSRN's step
(pipeline.models.vsrn, read only). Writes bench/results/train_pairwise.json (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # golden_common: the authors' CUDA calls as identity

import torch  # noqa: E402
from golden_common import cuda_as_identity  # noqa: E402
from torch import nn  # noqa: E402

AUTHORS = os.environ.get("VSE_SGRAF_CHECKOUT", "")  # a Paranioar/SGRAF checkout (python3.6), if any
SIZES = {"authors": dict(batch=128, members=36, feature_dim=2048, embed=1024, sim_dim=256, word_dim=300,
                         vocab=8000),
         "small": dict(batch=32, members=36, feature_dim=256, embed=256, sim_dim=64, word_dim=64, vocab=1000)}


# ------------------------------------------------------------------------------------------ inputs
def batch(size: dict, seed: int = 0):
    """Images (B, K, D), word ids (B, T) padded with 0, lengths (B,) sorted longest first."""
    g = torch.Generator().manual_seed(seed)
    b = size["batch"]
    lengths = (torch.randn(b, generator=g) * 3.5 + 12.3).round().clamp(5, 30).long() + 2
    lengths = lengths.sort(descending=True).values
    images = torch.randn(b, size["members"], size["feature_dim"], generator=g).relu_()
    captions = torch.randint(1, size["vocab"], (b, int(lengths[0])), generator=g)
    captions[torch.arange(captions.shape[1])[None] >= lengths[:, None]] = 0
    return images, captions, lengths


def forward_madds(size: dict, lengths, network: str, sgr_steps: int = 3) -> float:
    """Multiply-adds of one forward pass of the B × B pairs (the products; elementwise work aside)."""
    b, k, e, s = size["batch"], size["members"], size["embed"], size["sim_dim"]
    enc = b * k * size["feature_dim"] * e + 2 * b * k * e * e               # fc, VisualSA's two
    words = int(sum(lengths))
    enc += words * 2 * 3 * (size["word_dim"] + e) * e + 2 * words * e * e  # BiGRU, TextSA's two
    total = 0.0
    for n in lengths.tolist():
        pair = 2 * n * k * e + n * e * s + e * s                           # attention, context, sims
        if network == "sgr":
            pair += sgr_steps * (3 * (n + 1) * s * s + 2 * (n + 1) ** 2 * s)
        else:
            pair += (n + 1) * s + (n + 1) * s
        total += b * (pair + s)
    return enc + total


# ------------------------------------------------------------------------------------------ steps
def ours_step(network: str, size: dict, dtype=None):
    from pipeline.models.losses import build_loss
    from pipeline.models.network import NetworkConfig, build_network

    torch.manual_seed(0)
    config = NetworkConfig(network, feature_dim=size["feature_dim"], set_size=size["members"],
                           embed_dim=size["embed"], vocab_size=size["vocab"], word_dim=size["word_dim"],
                           options={"sim_dim": size["sim_dim"]})
    model = build_network(config).train()
    loss_fn = build_loss("mh", margin=0.2, mask_same_image=False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    images, captions, lengths = batch(size)
    ids = torch.arange(len(images))
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype else contextlib.nullcontext

    def step():
        with cast():
            scores = model(images, captions, lengths)
        loss = loss_fn.scored(scores.float(), image_ids=ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
    return step


def authors_step(network: str, size: dict, checkout: Path):
    spec = importlib.util.spec_from_file_location("sgraf_authors_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    opt = SimpleNamespace(grad_clip=2.0, no_imgnorm=False, num_layers=1, bi_gru=True, no_txtnorm=False,
                          module_name=network.upper(), sgr_step=3, margin=0.2, max_violation=True,
                          learning_rate=2e-4, img_dim=size["feature_dim"], embed_size=size["embed"],
                          word_dim=size["word_dim"], vocab_size=size["vocab"], sim_dim=size["sim_dim"])
    torch.manual_seed(0)
    with cuda_as_identity():
        sgraf = module.SGRAF(opt)
    if size["members"] != 36:
        sgraf.sim_enc.v_global_w = module.VisualSA(size["embed"], 0.4, size["members"])
    sgraf.logger = SimpleNamespace(update=lambda *a, **k: None)
    criterion = sgraf.criterion

    def loss(scores):  # their diagonal mask exists only under torch.cuda.is_available()
        with cuda_as_identity(True):
            return criterion(scores)
    sgraf.criterion = loss
    sgraf.train_start()
    images, captions, lengths = batch(size)
    lengths = lengths.tolist()

    def step():
        with cuda_as_identity():
            sgraf.train_emb(images, captions, lengths)
    return step


def gemm_step(network: str, size: dict):
    """The products of one training step and their gradients, nothing else (see the module text)."""
    torch.manual_seed(0)
    e, s = size["embed"], size["sim_dim"]
    images, captions, lengths = batch(size)
    p = lambda *shape: nn.Parameter(torch.randn(*shape) / shape[0] ** 0.5)  # noqa: E731
    w = dict(fc=p(size["feature_dim"], e), va=p(e, e), vg=p(e, e), ta=p(e, e), tg=p(e, e), loc=p(e, s),
             glo=p(e, s), ev=p(s, 1), q=[p(s, s) for _ in range(3)], k=[p(s, s) for _ in range(3)],
             g=[p(s, s) for _ in range(3)], att=p(s, 1))
    embed = nn.Embedding(size["vocab"], size["word_dim"])
    rnn = nn.GRU(size["word_dim"], e, batch_first=True, bidirectional=True)
    params = [v for x in w.values() for v in (x if isinstance(x, list) else [x])]
    params += list(embed.parameters()) + list(rnn.parameters())
    groups = [(int(n), (lengths == n).nonzero().squeeze(1)) for n in lengths.unique()]

    def step():
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        v = images @ w["fc"]
        v_glo = (v @ w["va"] * (v.mean(1) @ w["vg"])[:, None]).sum(1)
        out, _ = rnn(pack_padded_sequence(embed(captions), lengths, batch_first=True))
        words = pad_packed_sequence(out, batch_first=True)[0][..., :e]
        t_glo = (words @ w["ta"] * (words.mean(1) @ w["tg"])[:, None]).sum(1)
        total = 0
        for n, rows in groups:
            c = words[rows, :n]
            attn = torch.einsum("ike,cle->iclk", v, c)
            ctx = torch.einsum("iclk,ike->icle", attn, v)
            loc = ctx @ w["loc"]
            glo = (v_glo[:, None] - t_glo[rows][None]) @ w["glo"]
            nodes = torch.cat([glo[:, :, None], loc], 2)
            if network == "sgr":
                for i in range(3):
                    edges = (nodes @ w["q"][i]) @ (nodes @ w["k"][i]).transpose(-1, -2)
                    nodes = (edges @ nodes) @ w["g"][i]
                vec = nodes[:, :, 0]
            else:
                vec = ((nodes @ w["att"]).transpose(-1, -2) @ nodes).squeeze(-2)
            total = total + (vec @ w["ev"]).sum()
        for x in params:
            x.grad = None
        total.backward()
    return step


def vsrn_step(size: dict):
    """VSRN's training step (pipeline.models.vsrn) at the batch's sizes, when it builds."""
    from pipeline.models.network import NetworkConfig, build_network

    torch.manual_seed(0)
    config = NetworkConfig("vsrn", feature_dim=size["feature_dim"], set_size=size["members"],
                           embed_dim=size["embed"], vocab_size=size["vocab"], word_dim=size["word_dim"])
    model = build_network(config).train()
    images, captions, lengths = batch(size)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)

    def step():
        out = model(images, captions, lengths)
        loss = sum(v.float().sum() for v in (out if isinstance(out, tuple) else (out,)))
        for term in model.auxiliary_losses().values():
            loss = loss + term
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def matmul_gflops(n: int = 2048, rounds: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(rounds))
    return 2 * n ** 3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make(kind: str, network: str, size: dict, args):
    if kind == "ours":
        return ours_step(network, size)
    if kind == "ours_bf16":
        return ours_step(network, size, torch.bfloat16)
    if kind == "authors":
        return authors_step(network, size, Path(args.authors))
    if kind == "gemm":
        return gemm_step(network, size)
    if kind == "vsrn":
        return vsrn_step(size)
    raise ValueError(kind)


# ------------------------------------------------------------------------------------------ runs
def peak_memory(kind: str, network: str, args) -> float | None:
    """Peak RSS (MB) of a child process that builds ``kind`` and runs one step of it."""
    command = [sys.executable, __file__, "--child", f"{kind}:{network}", "--authors", args.authors]
    if args.small:
        command.append("--small")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return round(float(done.stdout.split()[-1]), 1)


def child(spec: str, args) -> None:
    import resource

    kind, network = spec.split(":")
    make(kind, network, SIZES["small" if args.small else "authors"], args)()  # one step: its peak
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addmv_", "aten::addbmm")
GRU_OPS = ("aten::gru", "aten::_thnn_fused_gru_cell", "aten::gru_cell")


def profile(network: str, size: dict, rows: int = 25) -> dict:
    """One of our steps under torch.profiler (after a warm-up): self CPU time by kind of op
    (products, the rest), the largest ops by input shape, and the memory the ops allocated."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    step = ours_step(network, size)
    step()
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)
    return {"self_cpu_s": round(total / 1e6, 3), "matmul_share": round(matmul / total, 3),
            "top_ops": [{"op": e.key, "self_cpu_s": round(e.self_cpu_time_total / 1e6, 3), "calls": e.count,
                         "share": round(e.self_cpu_time_total / total, 4)}
                        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]],
            "top_ops_by_shape": [{"op": e.key, "shapes": str(e.input_shapes)[:120], "calls": e.count,
                                  "self_cpu_s": round(e.self_cpu_time_total / 1e6, 3)}
                                 for e in by_shape[:rows]],
            "allocated_gb_by_op": {e.key: round(e.self_cpu_memory_usage / 2**30, 3) for e in
                                   sorted(events, key=lambda e: -e.self_cpu_memory_usage)[:10]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="small sizes: a quick run")
    parser.add_argument("--networks", default="sgr,saf")
    parser.add_argument("--steps", type=int, default=5, help="interleaved timed rounds (after one warm-up)")
    parser.add_argument("--authors", default=AUTHORS,
                        help="a Paranioar/SGRAF checkout (python3.6; default: $VSE_SGRAF_CHECKOUT); "
                        "without one the authors' step is left out")
    parser.add_argument("--bf16", action="store_true", help="also our step under bf16 autocast")
    parser.add_argument("--vsrn", action="store_true", help="also VSRN's step")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile one of our steps per network instead "
                        "(bench/results/train_pairwise_profile.json)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "train_pairwise.json"))
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    from benchkit import cpu_name, write_report

    if args.profile:
        size = SIZES["small" if args.small else "authors"]
        report = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "load_before": os.getloadavg(),
                  "sizes": size, "networks": {n: profile(n, size) for n in args.networks.split(",")},
                  "load_after": os.getloadavg()}
        out = args.out if args.out != parser.get_default("out") else str(ROOT / "bench" / "results"
                                                                          / "train_pairwise_profile.json")
        write_report(report, Path(out))
        return 0
    size = SIZES["small" if args.small else "authors"]
    has_authors = (Path(args.authors) / "model.py").exists()
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "sizes": size, "load_before": os.getloadavg(),
              "matmul_fp32_gflops": round(matmul_gflops(), 1), "networks": {}}
    _, _, lengths = batch(size)
    report["caption_lengths_mean"] = round(float(lengths.float().mean()), 2)
    for network in args.networks.split(","):
        kinds = ["ours", "gemm"] + (["authors"] if has_authors else []) + (["ours_bf16"] if args.bf16 else [])
        steps = {kind: make(kind, network, size, args) for kind in kinds}
        for step in steps.values():
            step()  # warm-up
        times = {kind: [] for kind in kinds}
        for _ in range(args.steps):
            for kind, step in steps.items():
                times[kind].append(_timed(step))
        del steps
        madds = forward_madds(size, lengths, network)
        median = {k: statistics.median(v) for k, v in times.items()}
        entry = report["networks"][network] = {
            "forward_gflop": round(2 * madds / 1e9, 1), "step_gflop_fwd_bwd": round(6 * madds / 1e9, 1),
            "mflop_per_pair_forward": round(2 * madds / size["batch"] ** 2 / 1e6, 2),
            "median_step_s": {k: round(v, 3) for k, v in median.items()},
            "steps_per_s": {k: round(1 / v, 4) for k, v in median.items()},
            "max_over_min": {k: round(max(v) / min(v), 3) for k, v in times.items()},
            "step_s": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "ours_fraction_of_gemm_limit": round(median["gemm"] / median["ours"], 3),
            "ours_fraction_of_matmul_rate": round(6 * madds / median["ours"] / 1e9
                                                  / report["matmul_fp32_gflops"], 3),
            "target_fraction": 0.8,
        }
        if has_authors:
            entry["speedup_ours_over_authors"] = round(median["authors"] / median["ours"], 3)
        if args.bf16:
            entry["speedup_ours_bf16_over_authors"] = (round(median["authors"] / median["ours_bf16"], 3)
                                                       if has_authors else None)
            entry["speedup_bf16_over_fp32"] = round(median["ours"] / median["ours_bf16"], 3)
        if not args.no_memory:
            entry["peak_rss_mb"] = {kind: peak_memory(kind, network, args) for kind in kinds}
        print(network, json.dumps(entry), file=sys.stderr, flush=True)
    if args.vsrn:
        try:
            step = vsrn_step(size)
            step()
            times = [_timed(step) for _ in range(args.steps)]
            report["vsrn"] = {"median_step_s": round(statistics.median(times), 3),
                              "step_s": [round(t, 3) for t in times]}
        except Exception as error:  # VSRN is being rewritten elsewhere: report, do not fail
            report["vsrn"] = {"error": f"{type(error).__name__}: {error}"}
    report["load_after"] = os.getloadavg()
    write_report(report, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
