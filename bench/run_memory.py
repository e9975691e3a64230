"""Memory across the runs of one process (issue 49): the RSS of a sweep and of a tune study, run by run.

- sweep: experiments/f8k_sgraf_bf16.yaml on SGR, the sweep whose RSS reached 11.9 GB by its fifth
  run: the full Flickr8k 7x7 grid cache, preloaded with the MiniLM token vectors (--text-features
  keeps both sides in memory), embed 256, sim_dim 64, batch 128, CPU bf16; its 6 runs (mh and
  lseh-svd x seeds 0-2) in one process, as `vse sweep` trains them (``run_sweep``);
- tune: a study of --trials trials on the fast loop (the full Flickr8k 1C cache and MiniLM caption
  vectors, vse++), lr and margin searched, budget TRIALSx1, as `vse tune` runs it (``run_tune``).

The data and model sizes are the real ones; only each run's length is cut: the first --steps
batches of its epoch (``Trainer.epoch_batches`` is shortened here, in this process only), then the
run's own validation and checkpoints. Memory, not time, is the measure.

Per run: ``peak_mb``, the process's peak RSS while it ran (VmHWM, reset through
/proc/self/clear_refs as the run is built), and ``held_after_mb``, the RSS once it is over (read as
the next run is built, so after what the command frees between runs; the last run's after the
command returns). Goal: the last run's peak <= 1.15x the second's (the first pays the imports).

    python bench/run_memory.py sweep --out bench/results/run_memory_sweep.json
    python bench/run_memory.py tune --trials 20 --out bench/results/run_memory_tune.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchkit import write_report  # noqa: E402

GOAL = 1.15


def status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


class RunMeter:
    """Hooks ``build_run`` (each run of a sweep or a trial is built once): at each build the last
    run is over; its peak and what is still held are recorded, and the peak is reset."""

    def __init__(self, max_rss_gb: float):
        self.runs: list[dict] = []
        self.started = None
        self.max_rss_mb = max_rss_gb * 1024

    def install(self, steps: int) -> None:
        import pipeline.training.build as build
        from pipeline.training.trainer import Trainer

        original_build, original_batches = build.build_run, Trainer.epoch_batches

        def metered_build(*args, **kwargs):
            self.close_run()
            if self.runs and self.runs[-1]["held_after_mb"] > self.max_rss_mb:  # spare the machine
                raise SystemExit(f"stopped: {self.runs[-1]['held_after_mb']:.0f} MB held after run "
                                 f"{len(self.runs)}, over --max-rss-gb")
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self.started = time.perf_counter()
            return original_build(*args, **kwargs)

        def short_epoch(trainer, epoch):
            pairs = original_batches(trainer, epoch)
            pairs.slices = pairs.slices[:steps]
            return pairs

        build.build_run = metered_build
        Trainer.epoch_batches = short_epoch

    def close_run(self) -> None:
        if self.started is not None:
            self.runs.append({"run": len(self.runs) + 1, "peak_mb": round(status_mb("VmHWM"), 1),
                              "held_after_mb": round(status_mb("VmRSS"), 1),
                              "seconds": round(time.perf_counter() - self.started, 1)})
            self.started = None

    def summary(self) -> dict:
        peaks = [r["peak_mb"] for r in self.runs]
        ratio = round(peaks[-1] / peaks[1], 3) if len(peaks) > 1 else None
        return {"runs": self.runs, "peak_last_over_second": ratio, "goal": f"<= {GOAL}",
                "met": ratio is not None and ratio <= GOAL}


def sweep_bench(args, meter: RunMeter, folder: Path) -> dict:
    from pipeline.training.sweep import load_sweep, run_sweep

    sweep = load_sweep(ROOT / "experiments" / "f8k_sgraf_bf16.yaml", runs_dir=folder,
                       overrides={"network": "sgr", "features": args.grid, "text_features": args.tokens,
                                  "epochs": 1},
                       name="memory_sgr")
    sweep.runs = sweep.runs[:args.runs]
    for run in sweep.runs:  # the relevance file of the lseh runs, where this checkout keeps it
        if run.config.get("relevance"):
            run.config["relevance"] = args.relevance
    run_sweep(sweep, echo=lambda *a, **k: None, quiet_runs=True)
    return {"sweep": "experiments/f8k_sgraf_bf16.yaml --network sgr --epochs 1",
            "runs_named": [run.name for run in sweep.runs], "statuses": [run.status for run in sweep.runs],
            "features": args.grid, "text_features": args.tokens}


def tune_bench(args, meter: RunMeter, folder: Path) -> dict:
    import yaml

    from pipeline.training.tune import Budget, load_tune, open_study, run_tune

    path = folder / "memory_tune.yaml"
    path.write_text(yaml.safe_dump({
        "name": "memory_tune", "runs_dir": str(folder),
        "base": {"features": args.features, "text_features": args.text, "val_every": 0, "cpu_amp": False},
        "search": {"lr": {"log_uniform": [1e-4, 1e-3]}, "margin": {"uniform": [0.05, 0.4]}}}))
    tune = load_tune(path)
    study, settings = open_study(tune, None, Budget(args.trials, 1), None, None, "none", None)
    counted = run_tune(tune, study, settings, echo=lambda *a, **k: None)
    return {"study": "fast loop: vse++ over cached image and caption vectors, lr and margin searched",
            "budget": str(settings.budget), "pruner": "none", "counted": counted,
            "features": args.features, "text_features": args.text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("sweep", "tune"))
    parser.add_argument("--steps", type=int, default=3, help="batches of each run's epoch")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--grid", default=str(ROOT / "cache" / "f8k_effnet_grid7.h5"))
    parser.add_argument("--tokens", default=str(ROOT / "cache" / "f8k_minilm_tokens.h5"))
    parser.add_argument("--relevance", default=str(ROOT / "cache" / "f8k_svd.h5"))
    parser.add_argument("--features", default=str(ROOT / "cache" / "f8k_effnet_1c.h5"))
    parser.add_argument("--text", default=str(ROOT / "cache" / "f8k_minilm_text.h5"))
    parser.add_argument("--runs", type=int, default=None, help="only the sweep's first N runs")
    parser.add_argument("--max-rss-gb", type=float, default=14.0, help="stop when a run leaves more held")
    parser.add_argument("--label", default="", help="what this measures, e.g. the commit")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--append", action="store_true",
                        help="add to OUT's measurements (replacing one of the same label)")
    args = parser.parse_args()

    import torch

    meter = RunMeter(args.max_rss_gb)
    meter.install(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        what = (sweep_bench if args.what == "sweep" else tune_bench)(args, meter, Path(tmp))
        meter.close_run()
    report = {"bench": f"run_memory {args.what}", "label": args.label, "steps_per_run": args.steps,
              "threads": torch.get_num_threads(), "seconds": round(time.perf_counter() - started, 1),
              **what, **meter.summary()}
    if args.append and args.out is not None and args.out.is_file():
        earlier = json.loads(args.out.read_text())
        kept = [m for m in earlier.get("measurements", [earlier]) if m.get("label") != args.label]
        report = {"measurements": [*kept, report]}
    elif args.append:
        report = {"measurements": [report]}
    write_report(report, args.out)


if __name__ == "__main__":
    main()
