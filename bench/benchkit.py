"""What several benches measure the same way: the trainer against a bare loop of its own steps,
and writing a report.  Imported by bench/*.py (which put the repository root on sys.path)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def trainer_vs_bare(trainer, pairs, bare_batches, n_pairs: int, rounds: int, target: float) -> dict:
    """pairs/s of ``trainer.train_epoch()`` over the batch list ``pairs`` against a bare loop of
    forward, loss, backward, clipping and step of the same model over ``bare_batches()`` (an
    iterable of (images, caption inputs tuple, image ids), the same ``n_pairs`` pairs without the
    trainer's reading, progress and bookkeeping).  Both are warmed up once (allocator, kernels)
    and run interleaved ``rounds`` times, so they share any drift in machine load; the best
    round of each counts."""
    model, loss_fn, opt = trainer.model, trainer.loss, trainer.optimizer
    clip = trainer.cfg.grad_clip
    for b in range(min(2, len(pairs))):
        trainer.step(pairs[b])

    def bare_loop() -> float:
        start = time.perf_counter()
        for images, captions, image_ids in bare_batches():
            img, cap = model(images, *captions)
            loss = loss_fn(img, cap, image_ids=image_ids)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainer.trainable, clip)
            opt.step()
        return time.perf_counter() - start

    def trainer_loop() -> float:
        trainer.progress.batch = 0
        trainer.epoch_batches = lambda epoch: pairs
        start = time.perf_counter()
        trainer.train_epoch()
        return time.perf_counter() - start

    times = {"bare": [], "trainer": []}
    for _ in range(rounds):
        times["bare"].append(bare_loop())
        times["trainer"].append(trainer_loop())
    bare, full = min(times["bare"]), min(times["trainer"])
    return {"batches": len(pairs.slices), "pairs": n_pairs, "trainer_pairs_per_s": round(n_pairs / full, 1),
            "bare_loop_pairs_per_s": round(n_pairs / bare, 1), "ratio": round(bare / full, 3),
            "target_ratio": target, "times_s": times}


def write_report(report: dict, out: Path | None = None, indent: int = 2) -> None:
    """Stamp ``report`` with its time, print it as JSON, and write it to ``out`` if given."""
    report["created"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    text = json.dumps(report, indent=indent, default=str)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def timed_command(command: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of ``command`` run in a child process of its own."""
    import subprocess
    import sys

    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n")
    out = subprocess.run([sys.executable, "-c", code, *command], check=True, cwd=cwd, capture_output=True,
                         text=True).stdout.split()
    return float(out[0]), float(out[1])


def one_step_checkpoint(root: Path, config: dict) -> Path:
    """A run of ``config`` (TrainConfig values) stopped after its first optimiser step, validated
    on 2 images and saved there: a checkpoint to time an evaluation with, in seconds rather than
    an epoch. Returns its best.pt."""
    import subprocess
    import sys

    code = f"""
import json, sys
sys.path.insert(0, {str(root)!r})
from pipeline.core.config import TrainConfig
from pipeline.training.build import build_trainer
from pipeline.training.trainer import Trainer

step, calls = Trainer.step, []
def one_step(self, batch):
    if calls:
        raise KeyboardInterrupt  # after the first step's validation and checkpoint
    calls.append(1)
    return step(self, batch)
Trainer.step = one_step
try:
    build_trainer(TrainConfig(**json.loads(sys.argv[1])), echo=lambda *a, **k: None, overwrite=True).fit()
except KeyboardInterrupt:
    pass
"""
    config = {**config, "val_every": 1, "val_images": 2}
    subprocess.run([sys.executable, "-c", code, json.dumps(config)], check=True, cwd=root,
                   capture_output=True)
    return Path(config["run_dir"]) / "best.pt"


def trainer_steps(root: Path, config: dict, steps: int) -> dict:
    """``steps`` optimiser steps of the Trainer of ``config`` (TrainConfig values) after one warm-up
    step, in a child process (its own peak RSS): the median step and the epoch at that pace."""
    import subprocess
    import sys

    code = f"""
import json, resource, sys, time
sys.path.insert(0, {str(root)!r})
from pipeline.core.config import TrainConfig
from pipeline.training.build import build_trainer
trainer = build_trainer(TrainConfig(**json.loads(sys.argv[1])), echo=lambda *a, **k: None, overwrite=True)
pairs = trainer.epoch_batches(0)
trainer.step(pairs[0])  # warm-up
times = []
for b in range(1, 1 + {steps}):
    t = time.perf_counter(); trainer.step(pairs[b]); times.append(time.perf_counter() - t)
print(json.dumps({{"steps_per_epoch": len(pairs), "step_s": times,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
    result = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps(config)], check=True, cwd=root,
                                       capture_output=True, text=True).stdout.splitlines()[-1])
    step = sorted(result["step_s"])[len(result["step_s"]) // 2]
    return {"batch_size": config.get("batch_size", 128), "steps_measured": len(result["step_s"]),
            "median_step_s": round(step, 3), "step_s": [round(t, 3) for t in result["step_s"]],
            "steps_per_epoch": result["steps_per_epoch"],
            "epoch_s_at_this_pace": round(step * result["steps_per_epoch"]),
            "peak_rss_mb": round(result["peak_rss_mb"])}


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    import platform

    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
