"""The set-pool contract (``vse check-pool``): what every pool, built-in or a user's own, must
satisfy for a set head (``heads.SetImageHead``, the caption encoders) to use it.

A pool is built as ``Class(dim=E, **options)`` and called as ``pool(x (B, K, E), lengths
(B,))`` → (B, E); positions >= length are padding.  The checks run it in eval mode and float64
(``.double()``), its parameters drawn with the given seed:

- output (B, E) and finite for several K × E, lengths from 1 to K in one batch;
- padding ignored: padding of zeros or of large random values gives the same output;
- a set alone = in the batch: each set pooled on its own, cut to its length, gives its row;
- invariant to permuting the members of a set (image pools; for a token sequence, ``sequence``,
  the difference is reported, not required);
- gradient reaches every member and no padding: every member is the largest of the set in a
  dimension of its own, so a max pool passes too;
- lengths 1 and K: a batch of sets of one member, and a batch without padding;
- finite for large inputs (members ~ 1e4);
- ms per call at B = 128, K = 36, E = 1024, float32 (forward + backward), a measurement.
"""

from __future__ import annotations

import time

import torch

from pipeline.core.checks import CheckResult, guarded
from pipeline.networks.heads import build_pool

BATCH = 4
SHAPES = ((1, 3), (5, 8), (36, 16))   # (K, E)
GRAD_SHAPE = (5, 8)                    # E >= K: member k is the largest in dimension k
LARGE = 1e4
TOLERANCE = 1e-9                       # relative, float64
TIMING = (128, 36, 1024)               # B, K, E


def run_pool_contract(spec: str, options: dict | None = None, *, sequence: bool = False,
                      timing: bool = True, seed: int = 0) -> list[CheckResult]:
    """Every check of the contract on the pool ``spec`` (a built-in name or an import path).
    A pool that cannot be built raises VseError (one line) before any check."""
    pools = {dim: _build(spec, options, dim, seed) for dim in {e for _, e in SHAPES} | {GRAD_SHAPE[1]}}
    size, dim = SHAPES[1]
    permutation = "invariant to permuting the members" + (" (a sequence: reported)" if sequence else "")
    results = [
        guarded("output (B, E), finite, K × E = " + ", ".join(f"{k}×{e}" for k, e in SHAPES),
                 lambda: _shapes(pools, seed)),
        guarded("padding ignored", lambda: _padding(pools[dim], size, dim, seed)),
        guarded("a set alone = in the batch", lambda: _alone(pools[dim], size, dim, seed)),
        guarded(permutation, lambda: _permutation(pools[dim], size, dim, seed, sequence)),
        guarded("gradient reaches every member, no padding", lambda: _gradient(pools[GRAD_SHAPE[1]], seed)),
        guarded("lengths 1 and K", lambda: _extreme_lengths(pools[dim], size, dim, seed)),
        guarded(f"finite for large inputs (~{LARGE:g})", lambda: _large(pools[dim], size, dim, seed)),
    ]
    if timing:
        batch, size, dim = TIMING
        results.append(guarded(f"ms per call (B={batch}, K={size}, E={dim}, fwd+bwd)",
                                lambda: _timing(spec, options, seed)))
    return results


def _build(spec, options, dim, seed, double=True):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pool = build_pool(spec, dim, options)
    return (pool.double() if double else pool).eval()


def contract_inputs(size: int, dim: int, seed: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 x (batch, size, dim) with random padding; lengths K, K//2, 1, K-1, ... (≥ 1)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, size, dim, generator=gen, dtype=torch.float64)
    cycle = [size, max(1, size // 2), 1, max(1, size - 1)]
    lengths = torch.tensor([cycle[i % len(cycle)] for i in range(batch)], dtype=torch.int64)
    return x, lengths


def padding_of(lengths: torch.Tensor, size: int) -> torch.Tensor:
    return torch.arange(size) >= lengths[:, None]


# ---------------------------------------------------------------------------- the checks


@torch.no_grad()
def _shapes(pools, seed) -> CheckResult:
    for size, dim in SHAPES:
        x, lengths = contract_inputs(size, dim, seed)
        out = pools[dim](x, lengths)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (BATCH, dim):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return CheckResult("", False, f"K×E {size}×{dim}: returned {shape}, not {(BATCH, dim)}")
        if not torch.isfinite(out).all():
            return CheckResult("", False, f"K×E {size}×{dim}: not finite")
    return CheckResult("", True, f"B = {BATCH}")


@torch.no_grad()
def _padding(pool, size, dim, seed) -> CheckResult:
    x, lengths = contract_inputs(size, dim, seed)
    pad = padding_of(lengths, size)[..., None]
    gen = torch.Generator().manual_seed(seed + 1)
    noise = LARGE * torch.randn(x.shape, generator=gen, dtype=x.dtype)
    zero = pool(x.masked_fill(pad, 0), lengths)
    loud = pool(torch.where(pad, noise, x), lengths)
    return _compare(zero, loud, "padding of zeros and of ~1e4 differ by")


@torch.no_grad()
def _alone(pool, size, dim, seed) -> CheckResult:
    x, lengths = contract_inputs(size, dim, seed)
    together = pool(x, lengths)
    alone = torch.cat([pool(x[b:b + 1, :int(n)], lengths[b:b + 1]) for b, n in enumerate(lengths)])
    return _compare(together, alone, "largest difference")


@torch.no_grad()
def _permutation(pool, size, dim, seed, sequence) -> CheckResult:
    x, lengths = contract_inputs(size, dim, seed)
    gen = torch.Generator().manual_seed(seed + 2)
    keys = torch.rand(x.shape[:2], generator=gen).masked_fill(padding_of(lengths, size), 2.0)
    order = keys.argsort(dim=1)  # a random order of each set's members, padding last
    permuted = x.gather(1, order[..., None].expand_as(x))
    result = _compare(pool(x, lengths), pool(permuted, lengths), "difference")
    if sequence:
        result.ok = None
    return result


def _gradient(pool, seed) -> CheckResult:
    size, dim = GRAD_SHAPE
    x, lengths = contract_inputs(size, dim, seed)
    x = (0.1 * x + 3 * torch.eye(size, dim, dtype=x.dtype)).requires_grad_(True)
    gen = torch.Generator().manual_seed(seed + 3)
    out = pool(x, lengths)
    (out * torch.randn(out.shape, generator=gen, dtype=out.dtype)).sum().backward()
    if x.grad is None:
        return CheckResult("", False, "no gradient reaches the members")
    reach = x.grad.abs().sum(-1)
    pad = padding_of(lengths, size)
    weakest = float(reach[~pad].min())
    leaked = float(reach[pad].max()) if pad.any() else 0.0
    if weakest == 0:
        b, k = [int(i) for i in ((reach == 0) & ~pad).nonzero()[0]]
        return CheckResult("", False, f"member {k} of set {b} (length {int(lengths[b])}) gets no gradient")
    if leaked != 0:
        return CheckResult("", False, f"padding gets a gradient ({leaked:.3g})")
    return CheckResult("", True, f"smallest member gradient {weakest:.3g}")


@torch.no_grad()
def _extreme_lengths(pool, size, dim, seed) -> CheckResult:
    x, _ = contract_inputs(size, dim, seed)
    for n in (1, size):
        out = pool(x, torch.full((BATCH,), n, dtype=torch.int64))
        if tuple(out.shape) != (BATCH, dim) or not torch.isfinite(out).all():
            return CheckResult("", False, f"length {n}: shape {tuple(out.shape)}, finite "
                                          f"{bool(torch.isfinite(out).all())}")
    return CheckResult("", True, f"1 and {size}")


@torch.no_grad()
def _large(pool, size, dim, seed) -> CheckResult:
    x, lengths = contract_inputs(size, dim, seed)
    out = pool(LARGE * x, lengths)
    ok = bool(torch.isfinite(out).all())
    return CheckResult("", ok, f"largest |output| {float(out.abs().max()):.3g}" if ok else "not finite")


def _timing(spec, options, seed, repeats: int = 10) -> CheckResult:
    batch, size, dim = TIMING
    pool = _build(spec, options, dim, seed, double=False).train()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, size, dim, generator=gen).requires_grad_(True)
    lengths = torch.randint(size // 2, size + 1, (batch,), generator=gen)
    times = []
    for step in range(repeats + 2):  # two warm-up calls
        started = time.perf_counter()
        pool(x, lengths).sum().backward()
        if step >= 2:
            times.append(time.perf_counter() - started)
        x.grad = None
    times.sort()
    return CheckResult("", None, f"{1000 * times[len(times) // 2]:.2f} ms (median of {repeats})")


def _compare(a: torch.Tensor, b: torch.Tensor, what: str) -> CheckResult:
    diff = float((a - b).abs().max() / (1 + b.abs().max()))
    return CheckResult("", diff <= TOLERANCE, f"{what} {diff:.3g}")
