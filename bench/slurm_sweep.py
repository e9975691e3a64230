"""A 12-run fast-loop sweep on a local Slurm (``vse sweep --launcher slurm``) against the same sweep
trained here two at a time (``vse sweep --jobs 2``), on the tiny data of the tests (40 images,
cached image and caption features: the fast loop): the wall-clock ratio, and the overhead a run
pays for being a job (its submission, and its job's start and end around the same training).

- submission: wall time of the submitting `vse sweep --launcher slurm` (one sbatch per run),
  and per run;
- slurm wall: from the submit's start until every run is done (the one-node Slurm of
  tests/cluster_services.py, a job per CPU: two at a time on 2 cores, as --jobs 2);
- local wall: `vse sweep --jobs 2` of the same file in another runs folder;
- per-run overhead: (slurm wall - local wall) / runs × jobs at a time: what each run costs more as
  a job (a Python start with vse's imports per job, srun, the scheduler's cycle) on this scale,
  where a run trains in seconds; on runs of minutes or hours it is the same few seconds.

Usage: python bench/slurm_sweep.py [--out bench/results/slurm_sweep.json] (needs slurm-wlm and munge,
which `make install` installs; starts and stops its own Slurm in a temp folder).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))
from benchkit import write_report  # noqa: E402

RUNS, JOBS, EPOCHS = 12, 2, 5


def tiny_data(folder: Path) -> tuple[Path, Path]:
    """The tests' tiny cache (conftest.tiny_cache) and its cbow caption vectors."""
    from conftest import demo_captions, learnable_features, write_feature_cache

    from pipeline.data.caption_features import encode_text

    n = 40
    ids, captions = demo_captions(n)
    caption_image = np.repeat(np.arange(n), 5)
    feats = learnable_features(captions, caption_image, n)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    cache = write_feature_cache(folder / "tiny.h5", feats, captions, caption_image, splits, image_ids=ids)
    text = folder / "cbow_text.h5"
    encode_text(cache, "cbow", text, device="cpu")
    return cache, text


def sweep_file(folder: Path, cache: Path, text: Path) -> Path:
    path = folder / "fast12.yaml"
    path.write_text(yaml.safe_dump({
        "name": "fast12",
        "base": {"features": str(cache), "text_features": str(text), "epochs": EPOCHS, "embed_dim": 16,
                 "batch_size": 16, "lr": 5e-3, "workers": 0, "log_every": 1, "val_every": 0, "device": "cpu"},
        "grid": {"loss": ["mh", "sh", "infonce"], "seed": [0, 1, 2, 3]},
        "slurm": {"time": 10, "cpus": 1}}))
    return path


def vse(*args, env=None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], cwd=ROOT, check=True, env=env,
                   capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "slurm_sweep.json")
    args = parser.parse_args()
    from cluster_services import start_slurm

    from pipeline.training.launchers import JOB_FILE
    from pipeline.training.run_folder import DONE_MARKER

    work = Path(tempfile.mkdtemp(prefix="slurm_sweep_"))
    cache, text = tiny_data(work)
    config = sweep_file(work, cache, text)
    slurm = start_slurm(work / "slurm")
    env = {**os.environ, **slurm.env, "OMP_NUM_THREADS": "1"}
    try:
        local_s = vse("sweep", config, "--jobs", JOBS, "--runs-dir", work / "local", env=env)
        start = time.perf_counter()
        submit_s = vse("sweep", config, "--launcher", "slurm", "--runs-dir", work / "slurm_runs", env=env)
        runs = sorted((work / "slurm_runs" / "fast12").glob(f"*/{JOB_FILE}"))
        assert len(runs) == RUNS, runs
        while not all((r.parent / DONE_MARKER).is_file() for r in runs):
            time.sleep(0.2)
            if time.perf_counter() - start > 1800:
                raise SystemExit("the Slurm sweep did not finish within 30 minutes")
        slurm_s = time.perf_counter() - start
    finally:
        slurm.stop()
    load = os.getloadavg()
    write_report({
        "bench": "slurm_sweep", "runs": RUNS, "epochs": EPOCHS, "data": "tests' tiny cache (40 images), cbow "
        "caption vectors (--text-features: the fast loop)", "local_jobs": JOBS,
        "slurm": "one node of tests/cluster_services.py (CPUs = cores, a job per CPU), submitit "
                 + __import__("submitit").__version__,
        "local_wall_s": round(local_s, 2), "slurm_wall_s": round(slurm_s, 2),
        "wall_ratio_slurm_over_local": round(slurm_s / local_s, 2),
        "submission_s": round(submit_s, 2), "submission_per_run_s": round(submit_s / RUNS, 3),
        "overhead_per_run_s": round((slurm_s - local_s) / RUNS * JOBS, 2),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1_5_15": [round(x, 2) for x in load]},
    }, args.out)


if __name__ == "__main__":
    main()
