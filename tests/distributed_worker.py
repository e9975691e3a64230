"""What tests/test_distributed.py runs under torchrun (not a test module itself):

    python -m torch.distributed.run --standalone --nproc-per-node N tests/distributed_worker.py SPEC.json OUT

SPEC: {"steps": {name: TrainConfig dict}, "fits": {name: TrainConfig dict},
       "resume": {"config": {...}, "kill_after": k}, "cli": [[arguments of `vse`], ...]}.
- steps: one training step on the first global batch of epoch 1; every rank saves the loss,
  the gradients and the weights after the step to OUT/steps-rank<r>.pt.
- fits: a whole run each, in OUT/<name>.
- resume: an uninterrupted run (OUT/full) and one killed after k steps on every rank and
  resumed from its last.pt (OUT/cut); the ranks write nothing themselves.
- cli: `vse` command lines, one after another, as `torchrun -m cli.main ...` runs each (in this
  launch because importing every command module costs seconds per process); after the fits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from pipeline.core import distributed as dist
from pipeline.core.config import TrainConfig
from pipeline.training.build import build_trainer
from pipeline.training.trainer import Trainer


def one_step(config: dict) -> dict:
    trainer = build_trainer(TrainConfig(**config), echo=lambda *a: None)
    # a method's pass over every training pair (decl, ncr): the ranks share it, all get the whole
    statistics = torch.from_numpy(trainer.sample_statistics()) if trainer.loss_traits.sample_pass else None
    # a pairwise network's validation: the ranks share the score blocks, each gets the whole matrix
    scores = None
    if trainer.pairwise:
        from pipeline.evaluation.inference import score_split

        split = score_split(trainer.model, trainer.index, trainer.captions, "dev", trainer.device,
                            image_block=3, caption_block=16)
        scores = torch.from_numpy(split.captions.T.copy())
    loss = trainer.step(trainer.epoch_batches(0)[0])
    named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    named += [(f"loss.{n}", p) for n, p in trainer.loss.named_parameters() if p.requires_grad]
    return {"loss": loss, "grads": {n: p.grad.detach().clone() for n, p in named},
            "weights": {n: p.detach().clone() for n, p in named}, "statistics": statistics,
            "scores": scores}


def killed_run(config: dict, kill_after: int) -> None:
    original, calls = Trainer.step, {"n": 0}

    def step(self, batch):
        if calls["n"] == kill_after:
            raise KeyboardInterrupt  # as if every process died here
        calls["n"] += 1
        return original(self, batch)

    Trainer.step = step
    try:
        build_trainer(TrainConfig(**config), echo=lambda *a: None).fit()
    except KeyboardInterrupt:
        pass
    finally:
        Trainer.step = original


def main(spec_path: str, out: str) -> None:
    spec, out = json.loads(Path(spec_path).read_text()), Path(out)
    results = {name: one_step(config) for name, config in spec.get("steps", {}).items()}
    torch.save(results, out / f"steps-rank{dist.rank()}.pt")
    for name, config in spec.get("fits", {}).items():  # whole runs: validation under torchrun
        build_trainer(TrainConfig(**{**config, "run_dir": str(out / name)}), echo=lambda *a: None).fit()
    if "resume" in spec:
        config = spec["resume"]["config"]
        build_trainer(TrainConfig(**{**config, "run_dir": str(out / "full")}),
                            echo=lambda *a: None).fit()
        cut = {**config, "run_dir": str(out / "cut")}
        killed_run(cut, spec["resume"]["kill_after"])
        build_trainer(TrainConfig(**cut), resume=True, echo=lambda *a: None).fit()
    if "cli" in spec:
        from cli.main import cli

        for args in spec["cli"]:
            cli.main(args=args, prog_name="vse", standalone_mode=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
