"""The precision ablation (issue 53): why bf16 autocast keeps MH alive on SAF/SGR, one part at a time.

Each arm trains a pairwise network (``vse train``'s own build and loop, ``training.build``) with one
part's precision changed, and logs per step where the loss sits against its collapse value, how many
hardest negatives tie, and the gradient norm before clipping:

    fp32                 everything fp32 (control)
    bf16                 everything under CPU bf16 autocast, as ``--cpu-amp`` (control)
    fp32-scores-bf16     fp32 network; only the (B, B) score matrix rounded to bf16 before the loss
    bf16-scores-fp32     bf16 network; its last layer (Linear + sigmoid: the scores) in fp32, so the
                         loss and its hardest-negative choice see fp32 scores
    fp32-scores-noise    fp32 network; the scores perturbed by uniform noise of bf16's half-ulp at
                         their value, unrounded (does any perturbation do it, or only ties?)
    fp32-gemm-tf32       fp32, the inputs of every matrix product (forward and backward) rounded to
                         10 mantissa bits: what a GPU user gets with TF32
    fp32-gemm-bf16       the same at bf16's 7 bits: the products alone in bf16
    bf16-max1            bf16 autocast, MH's hardest negative taken as the authors' code does
                         (``max(1)[0]``: one index gets the gradient) instead of ``amax``, which
                         splits it evenly among tied maxima
    fp32-scores-bf16-max1  fp32-scores-bf16 with the authors' max

    PYTHONPATH=. python experiments/precision_arms.py --arm fp32 --seed 0 \
        --out bench/results/precision_saf_cpu --config experiments/precision_saf.yaml

Writes ``OUT/runs/ARM-sSEED.json`` (the run's options, its validation, the per-step series) and
prints its summary line; ``experiments/precision_table.py`` makes the table. The run folder goes under
``--runs-dir`` (ignored by git).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from pipeline.core.config import TrainConfig
from pipeline.training import trainer as trainer_module
from pipeline.training.build import build_trainer


@dataclass(frozen=True)
class Arm:
    cpu_amp: bool = False
    scores: str | None = None     # "round" (to bf16) or "noise" (bf16's half-ulp, unrounded)
    head_fp32: bool = False       # the scoring layer in fp32 under autocast
    gemm: str | None = None       # "tf32" or "bf16": round the inputs of every matrix product
    single_max: bool = False      # MH's hardest negative by max(dim) (one index), the authors' form


ARMS = {
    "fp32": Arm(),
    "bf16": Arm(cpu_amp=True),
    "fp32-scores-bf16": Arm(scores="round"),
    "bf16-scores-fp32": Arm(cpu_amp=True, head_fp32=True),
    "fp32-scores-noise": Arm(scores="noise"),
    "fp32-gemm-tf32": Arm(gemm="tf32"),
    "fp32-gemm-bf16": Arm(gemm="bf16"),
    "bf16-max1": Arm(cpu_amp=True, single_max=True),
    "fp32-scores-bf16-max1": Arm(scores="round", single_max=True),
}


# ---------------------------------------------------------------------------- rounding
def round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 ``x`` rounded to nearest (ties to even) with ``bits`` explicit mantissa bits."""
    drop = 23 - bits
    raw = x.contiguous().view(torch.int32)
    lsb = (raw >> drop) & 1
    raw = (raw + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    return raw.view(torch.float32).view_as(x)


def bf16_half_ulp(x: torch.Tensor) -> torch.Tensor:
    """Half of bf16's spacing at ``x``: the largest rounding error bf16 makes there."""
    _, exponent = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), exponent - 9)


class RoundedProducts:
    """Every matrix product's float32 factors rounded (``round_mantissa``), forward and backward;
    the accumulation stays fp32, as TF32 tensor cores do. A context that gives aten's CPU ``mm``,
    ``bmm``, ``addmm`` and ``baddbmm`` a kernel rounding the factors, then calling the op's ``out``
    overload (a dispatch mode over every op cost 17 s a step); ``calls`` counts the products seen."""

    OPS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}

    def __init__(self, bits: int):
        self.bits, self.calls, self.library, self.active = bits, 0, None, 0

    def _kernel(self, name: str, factors: tuple[int, int]):
        out_overload = getattr(torch.ops.aten, name).out

        def kernel(*args, **kwargs):
            if self.active:
                self.calls += 1
                args = tuple(round_mantissa(a, self.bits) if i in factors and a.dtype == torch.float32 else a
                             for i, a in enumerate(args))
            a, b = args[factors[0]], args[factors[1]]
            shape = (*a.shape[:-1], b.shape[-1])
            return out_overload(*args, **kwargs, out=a.new_empty(shape))
        return kernel

    def install(self) -> RoundedProducts:
        """The kernels, for the process's life (they round only inside ``with``)."""
        if self.library is None:
            self.library = torch.library.Library("aten", "IMPL")
            for name, factors in self.OPS.items():
                self.library.impl(name, self._kernel(name, factors), "CPU")
        return self

    def __enter__(self):
        self.install().active += 1
        return self

    def __exit__(self, *exc):
        self.active -= 1

    def close(self) -> None:
        """aten's own kernels again."""
        if self.library is not None:
            self.library._destroy()
            self.library = None


# ---------------------------------------------------------------------------- diagnostics
class StepLog:
    """Per step: the loss, its gap to the collapse value, hardest-negative ties, the gradient norm."""

    def __init__(self, collapse: float | None):
        self.collapse = collapse
        self.rows: list[dict] = []
        self.pending: dict = {}

    def scores(self, loss_module, scores: torch.Tensor, image_ids, value: torch.Tensor) -> None:
        s = scores.detach().float()
        _, negatives = loss_module.pair_masks(len(s), image_ids, s.device)
        margin = float(getattr(loss_module, "margin", 0.0) or 0.0)
        pos = s.diagonal()
        ties, active = [], []
        for cost in ((margin + s - pos[:, None]).clamp(min=0), (margin + s - pos[None, :]).clamp(min=0).T):
            cost = cost.masked_fill(~negatives, -1.0)
            top = cost.amax(dim=1, keepdim=True)
            live = top.squeeze(1) > 0
            ties.append(((cost == top) & negatives).sum(dim=1)[live].float())
            active.append(live.float())
        tied = torch.cat(ties)
        self.pending = {
            "loss": float(value.detach()), "score_std": float(s.std()), "score_mean": float(s.mean()),
            "distinct_scores": int(torch.unique(s).numel()),
            "active_queries": float(torch.cat(active).mean()),
            "tied_queries": float((tied > 1).float().mean()) if len(tied) else 0.0,
            "ties_per_query": float(tied.mean()) if len(tied) else 0.0,
        }
        if self.collapse:
            self.pending["collapse_gap"] = float(value) - self.collapse

    def grad_norm(self, norm: float) -> None:
        self.pending["grad_norm"] = norm

    def end_step(self) -> None:
        if self.pending:
            self.rows.append(self.pending)
        self.pending = {}


class StepsDone(Exception):
    """The run's ``--steps`` are done: it is validated there."""


def install(trainer, arm: Arm, log: StepLog, seed: int, steps: int | None) -> RoundedProducts | None:
    """The arm's changes on a built trainer (by instance attributes: the library is not edited);
    ``steps``: stop the epoch after this many steps."""
    loss, model = trainer.loss, trainer.model
    noise_rng = torch.Generator().manual_seed(10_000 + seed)
    plain_scored = loss.scored

    def scored(scores, image_ids=None, relevance=None, **extra):
        if arm.scores == "round":
            scores = scores.to(torch.bfloat16).to(scores.dtype)
        elif arm.scores == "noise":
            u = torch.rand(scores.shape, generator=noise_rng, dtype=scores.dtype) * 2 - 1
            scores = scores + (u * bf16_half_ulp(scores.detach())).to(scores.device)
        value = plain_scored(scores, image_ids=image_ids, relevance=relevance, **extra)
        log.scores(loss, scores, image_ids, value)
        return value

    loss.scored = scored
    if arm.single_max:
        def reduce(to_captions, to_images):
            if loss.warming_up():
                return to_captions.sum() + to_images.sum()
            return to_captions.max(dim=1).values.sum() + to_images.max(dim=0).values.sum()
        loss.reduce = reduce
    if arm.head_fp32:
        head = model.sim_eval_w

        def head_forward(x):
            with torch.autocast(device_type=x.device.type, enabled=False):
                return F.linear(x.float(), head.weight.float(), head.bias.float())
        head.forward = head_forward
    plain_clip = trainer_module.clip_gradients

    def clip(parameters, max_norm):
        grads = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
        log.grad_norm(float(torch.stack(grads).norm()) if grads else 0.0)
        return plain_clip(parameters, max_norm)

    trainer_module.clip_gradients = clip
    mode = RoundedProducts({"tf32": 10, "bf16": 7}[arm.gemm]) if arm.gemm else None
    plain_step = trainer.step

    def step(batch):
        if steps is not None and len(log.rows) >= steps:
            raise StepsDone
        try:
            if mode is None:
                return plain_step(batch)
            with mode:
                return plain_step(batch)
        finally:
            log.end_step()

    trainer.step = step
    return mode


def run(arm_name: str, seed: int, config_path: Path, out: Path, runs_dir: Path, overrides: dict,
        steps: int | None = None) -> dict:
    arm = ARMS[arm_name]
    base = yaml.safe_load(config_path.read_text())["base"]
    options = {**base, **overrides, "seed": seed, "cpu_amp": arm.cpu_amp,
               "run_dir": str(runs_dir / f"{arm_name}-s{seed}")}
    config = TrainConfig.from_dict(options)
    trainer = build_trainer(config, overwrite=True, echo=lambda *a, **k: None)
    collapse = trainer.loss.collapse_value(trainer.loop.batch_size)
    log = StepLog(collapse)
    mode = install(trainer, arm, log, seed, steps)
    started = time.perf_counter()
    try:
        summary = trainer.fit()
        records = (Path(options["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        validations = [r for r in map(json.loads, records) if "rsum" in r]
    except StepsDone:  # validated here as the trainer would at an epoch's end
        trainer.model.eval()
        summary = {"iterations": len(log.rows)}
        validations = [{"iteration": len(log.rows), **trainer.validate()}]
    seconds = time.perf_counter() - started
    if mode is not None:
        mode.close()
    rows = log.rows
    near = [abs(r["collapse_gap"]) <= 0.01 * collapse for r in rows] if collapse else []
    result = {
        "arm": arm_name, "seed": seed, "steps_trained": len(rows),
        "options": {k: v for k, v in options.items() if k != "run_dir"},
        "arm_parts": arm.__dict__, "seconds": round(seconds, 1), "summary": summary,
        "validation": validations, "collapse_value": collapse,
        "steps_at_collapse": round(sum(near) / len(near), 4) if near else None,
        "product_calls": mode.calls if mode else None,
        "steps": {key: [r.get(key) for r in rows] for key in (rows[0] if rows else {})},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{arm_name}-s{seed}.json").write_text(json.dumps(result, indent=None) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", required=True, choices=sorted(ARMS))
    parser.add_argument("--seed", type=int, nargs="+", default=[0])
    parser.add_argument("--config", type=Path, default=Path("experiments/precision_saf.yaml"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/precision_saf_cpu/runs"))
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/precision"))
    parser.add_argument("--steps", type=int, default=None, help="stop after N steps (validated there)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=YAML",
                        help="override an option of the config's base")
    args = parser.parse_args()
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    for seed in args.seed:
        result = run(args.arm, seed, args.config, args.out, args.runs_dir, overrides, args.steps)
        steps = result["steps"]
        last = result["validation"][-1] if result["validation"] else {}
        rsum = last.get("rsum", math.nan)
        tied = steps.get("tied_queries") or [0]
        print(f"{args.arm} seed {seed}: dev rsum {rsum:.1f}, at collapse {result['steps_at_collapse']}, "
              f"tied queries {sum(tied) / len(tied):.3f}, {result['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
