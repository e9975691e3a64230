"""The loss contract (``vse check-loss``): what every loss, built-in or a user's own, must
satisfy for the trainer to use it.

- finite scalar: a 0-d finite tensor on a float32 batch;
- float64 gradcheck: analytic gradients match finite differences (on random inputs, where
  hinges and maxima are differentiable);
- same-image pairs never negatives: the value does not move when the score of a pair whose
  caption belongs to the query's image changes (and nothing else does);
- invariance to permuting the batch (pairs, ids and relevance permuted together);
- one 2 × (B/2)-process step under gloo (the trainer's gather with gradient) equals one
  B step: the value and the gradients of the embeddings and of the loss's parameters;
- ms per call at B = 128 (forward + backward), a measurement, no pass or fail.

A random loss (e.g. ``mh`` with ``negative_set_size``) gets the same seed before every call,
so its draws are the same where the batch is; permuting the batch changes them.
"""

from __future__ import annotations

import copy
import inspect
import math
import tempfile
import time
from pathlib import Path

import torch

from pipeline.core.checks import CheckResult, guarded
from pipeline.core.similarity import is_probabilistic
from pipeline.losses.plugins import loss_traits, make_loss

CONTRACT_BATCH = 8          # even: the distributed check splits it over 2 processes
CONTRACT_DIM = 6
GRADCHECK_BATCH = 6
IMAGE_IDS = (0, 0, 1, 2, 2, 3, 4, 5)  # pairs 0 and 1 (and 3 and 4) show the same image
TOLERANCE = 1e-9            # relative, float64
TIMING_BATCH = 128
TIMING_DIM = 1024
WORLD = 2


def run_contract(spec: str, options: dict | None = None, *, distributed: bool = True,
                 timing: bool = True, seed: int = 0) -> list[CheckResult]:
    """Every check of the contract on the loss ``spec`` (a built-in name or an import path)."""
    options = dict(options or {})
    loss = make_loss(spec, options)
    traits = loss_traits(loss, spec)
    inputs = contract_inputs(traits.similarity != "cosine", seed)
    double = copy.deepcopy(loss).double()
    results = [
        guarded("finite scalar", lambda: _finite_scalar(loss, inputs, seed)),
        guarded("float64 gradcheck", lambda: _gradcheck(double, inputs, seed)),
        guarded("same-image pairs never negatives",
                 lambda: _same_image_not_negative(double, traits.similarity != "cosine", seed,
                                                  is_probabilistic(traits.similarity)))
        if not _authors_count_same_image(loss) else
        CheckResult("same-image pairs never negatives", None,
                    "not applicable: this loss's authors count same-image pairs as negatives (only the "
                    "diagonal is masked) and so does its default; --loss-option mask_same_image=true "
                    "masks them"),
        guarded("invariant to permuting the batch", lambda: _permutation(double, inputs, seed)),
    ]
    if distributed and traits.networks > 1:
        results.append(CheckResult("gloo processes", None,
                                   f"not applicable: {traits.networks} co-trained networks train as one "
                                   "pairwise network, each rank's batch its own negatives"))
    elif distributed:
        half = CONTRACT_BATCH // WORLD
        results.append(guarded(f"{WORLD} × {half}-pair gloo processes = one {CONTRACT_BATCH} step",
                                lambda: _distributed(spec, options, double, inputs, seed)))
    if timing:
        results.append(guarded(f"ms per call (B={TIMING_BATCH}, D={TIMING_DIM}, fwd+bwd)",
                                lambda: _timing(loss, traits.similarity != "cosine", seed)))
    return results


def contract_inputs(order: bool, seed: int, size: int = CONTRACT_BATCH, dim: int = CONTRACT_DIM) -> dict:
    """A float64 batch: unit embeddings (non-negative for order losses), captions near their
    images, ``IMAGE_IDS``, a symmetric relevance in [0.4, 0.9] with 1 on the diagonal."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(size, dim, generator=gen, dtype=torch.float64), dim=1)
    noise = torch.randn(size, dim, generator=gen, dtype=torch.float64)
    cap = torch.nn.functional.normalize(img + 0.8 * noise, dim=1)
    if order:
        img, cap = img.abs(), cap.abs()
    relevance = torch.rand(size, size, generator=gen, dtype=torch.float64) * 0.5 + 0.4
    relevance = (relevance + relevance.T) / 2
    relevance.fill_diagonal_(1.0)
    return {"img": img, "cap": cap, "ids": torch.tensor(IMAGE_IDS[:size]), "relevance": relevance}


def call(loss, img, cap, ids, relevance, seed: int) -> torch.Tensor:
    """One call with the global RNG seeded (and restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        networks = getattr(loss, "networks", 1)
        if networks > 1:  # k networks co-trained (NCR): every copy scores the batch alike here
            scores = loss.score_matrix(img, cap)
            return loss.scored(scores.expand(networks, *scores.shape), image_ids=ids, relevance=relevance)
        return loss(img, cap, image_ids=ids, relevance=relevance)


# ---------------------------------------------------------------------------- the checks


def _finite_scalar(loss, inputs, seed) -> CheckResult:
    value = call(loss, inputs["img"].float(), inputs["cap"].float(), inputs["ids"],
                 inputs["relevance"].float(), seed)
    if not isinstance(value, torch.Tensor) or value.ndim != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        return CheckResult("", False, f"returned {shape}, not a 0-d tensor")
    if not torch.isfinite(value):
        return CheckResult("", False, f"value {value.item()}")
    return CheckResult("", True, f"value {value.item():.6g}")


def _gradcheck(loss, inputs, seed) -> CheckResult:
    size = GRADCHECK_BATCH
    img = inputs["img"][:size].clone().requires_grad_(True)
    cap = inputs["cap"][:size].clone().requires_grad_(True)
    ids, relevance = inputs["ids"][:size], inputs["relevance"][:size, :size]
    ok = torch.autograd.gradcheck(lambda a, b: call(loss, a, b, ids, relevance, seed), (img, cap),
                                  raise_exception=False)
    return CheckResult("", bool(ok), "" if ok else "analytic and numerical gradients differ")


def _authors_count_same_image(loss) -> bool:
    """The loss leaves same-image pairs among the negatives because its declared default does (the
    authors' code of rcl, decl and ncr masks only the diagonal); a loss told so by its user, against
    its default, is checked and fails."""
    if getattr(loss, "mask_same_image", True):
        return False
    default = inspect.signature(type(loss).__init__).parameters.get("mask_same_image")
    return default is not None and default.default is False


def _same_image_not_negative(loss, order: bool, seed, probabilistic: bool = False) -> CheckResult:
    """Two extra dimensions that only image 0 and caption 1 (same image) use: turning image
    0 there changes s(image 0, caption 1) and no other score, norm or item similarity. For
    probabilistic embeddings ``[mean, log-variance]`` the two dimensions end the mean half."""
    base = contract_inputs(order, seed)
    size = len(base["img"])
    angles = torch.linspace(0.0, math.pi / 2, 5, dtype=torch.float64)
    at = CONTRACT_DIM // 2 + 2 if probabilistic else CONTRACT_DIM + 2  # the extra two end here

    def widened(emb):
        zeros = torch.zeros(size, 2, dtype=torch.float64)
        return torch.cat([0.5 * emb[:, :at - 2], zeros, 0.5 * emb[:, at - 2:]], dim=1)

    def values(ids):
        out = []
        for angle in angles:
            img, cap = widened(base["img"]), widened(base["cap"])
            if probabilistic:  # [mean, 2 extra | log-variance, 2 of nearly no variance (a sample's
                certain = torch.full((size, 2), -60.0, dtype=torch.float64)  # noise stays out of them)]
                img, cap = torch.cat([img, certain], dim=1), torch.cat([cap, certain], dim=1)
            img[0, at - 2:at] = torch.stack([torch.cos(angle), torch.sin(angle)])
            cap[1, at - 2] = 1.0
            out.append(call(loss, img, cap, ids, base["relevance"], seed).item())
        return torch.tensor(out, dtype=torch.float64)

    masked = values(base["ids"])
    spread = float(masked.max() - masked.min())
    if spread > TOLERANCE * (1 + float(masked.abs().max())):
        return CheckResult("", False, f"the value moves by {spread:.3g} with the score of a same-image "
                                      f"pair (image_ids {list(IMAGE_IDS)})")
    unmasked = values(None)
    moved = float(unmasked.max() - unmasked.min())
    return CheckResult("", True, f"without image_ids it moves by {moved:.3g}")


def _permutation(loss, inputs, seed) -> CheckResult:
    gen = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(len(inputs["img"]), generator=gen)
    plain = call(loss, inputs["img"], inputs["cap"], inputs["ids"], inputs["relevance"], seed).item()
    permuted = call(loss, inputs["img"][perm], inputs["cap"][perm], inputs["ids"][perm],
                    inputs["relevance"][perm][:, perm], seed).item()
    diff = abs(plain - permuted)
    return CheckResult("", diff <= TOLERANCE * (1 + abs(plain)), f"difference {diff:.3g}")


def _distributed(spec, options, loss, inputs, seed) -> CheckResult:
    import torch.multiprocessing as mp

    img = inputs["img"].clone().requires_grad_(True)
    cap = inputs["cap"].clone().requires_grad_(True)
    loss.zero_grad(set_to_none=True)
    single = call(loss, img, cap, inputs["ids"], inputs["relevance"], seed)
    single.backward()
    params = [q for q in loss.parameters() if q.requires_grad]
    expected = {"value": single.item(), "img": img.grad, "cap": cap.grad,
                "params": [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        torch.save({"inputs": inputs, "state": loss.state_dict()}, folder / "inputs.pt")
        try:
            mp.spawn(_gloo_worker, args=(spec, options, str(folder), seed), nprocs=WORLD, join=True)
        except Exception as exc:  # a worker's traceback: its last line says what failed
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            return CheckResult("", False, f"a process failed: {lines[-1] if lines else exc}")
        ranks = [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    half = CONTRACT_BATCH // WORLD
    worst = 0.0
    scale = 1 + abs(expected["value"])
    for r, got in enumerate(ranks):
        rows = slice(r * half, (r + 1) * half)
        worst = max(worst, abs(got["value"] - expected["value"]) / scale,
                    _max_diff(got["img"], expected["img"][rows]),
                    _max_diff(got["cap"], expected["cap"][rows]),
                    *(_max_diff(a, b) for a, b in zip(got["params"], expected["params"])))
    return CheckResult("", worst <= TOLERANCE, f"largest difference {worst:.3g}")


def _gloo_worker(rank: int, spec, options, folder, seed) -> None:
    """One process of the distributed check: its half of the batch, the trainer's gather."""
    import torch.distributed as torch_dist

    from pipeline.core import distributed as dist

    torch.set_num_threads(1)
    folder = Path(folder)
    torch_dist.init_process_group("gloo", init_method=f"file://{folder / 'rendezvous'}", rank=rank,
                                  world_size=WORLD)
    try:
        saved = torch.load(folder / "inputs.pt", weights_only=True)
        inputs = saved["inputs"]
        loss = make_loss(spec, options).double()
        loss.load_state_dict(saved["state"])
        half = CONTRACT_BATCH // WORLD
        rows = slice(rank * half, (rank + 1) * half)
        img = inputs["img"][rows].clone().requires_grad_(True)
        cap = inputs["cap"][rows].clone().requires_grad_(True)
        ids = dist.gather_with_grad(inputs["ids"][rows])
        value = call(loss, dist.gather_with_grad(img), dist.gather_with_grad(cap), ids,
                     inputs["relevance"], seed)
        value.backward()
        params = [q for q in loss.parameters() if q.requires_grad]
        torch.save({"value": value.item(), "img": img.grad, "cap": cap.grad,
                    "params": [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]},
                   folder / f"rank{rank}.pt")
    finally:
        torch_dist.destroy_process_group()


def _timing(loss, order: bool, seed, repeats: int = 10) -> CheckResult:
    inputs = contract_inputs(order, seed, TIMING_BATCH, TIMING_DIM)
    img = inputs["img"].float().requires_grad_(True)
    cap = inputs["cap"].float().requires_grad_(True)
    ids = torch.arange(TIMING_BATCH) // 2  # pairs of captions of one image, as in training
    relevance = inputs["relevance"].float()
    times = []
    for step in range(repeats + 2):  # two warm-up calls
        started = time.perf_counter()
        call(loss, img, cap, ids, relevance, seed).backward()
        if step >= 2:
            times.append(time.perf_counter() - started)
        img.grad = cap.grad = None
    times.sort()
    return CheckResult("", None, f"{1000 * times[len(times) // 2]:.2f} ms (median of {repeats})")


# ---------------------------------------------------------------------------- helpers


def _max_diff(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    return float((a - b).abs().max() / (1 + b.abs().max())) if a.numel() else 0.0
