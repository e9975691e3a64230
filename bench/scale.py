"""Scale simulation: synthetic feature caches of 10k, 100k and 600k images, written, read,
trained on and evaluated, each measurement in its own child process (peak RSS per phase).

Caches: random float32 features (``--dim``, default 2048 when the disk has room for the
largest cache twice over: 600k × 2048 × 4 B = 4.9 GB; else 1024) written with
``pipeline.data.cache.write_cache`` (default shard size). Captions are the bundled demo's real
captions, recycled: one per image (so 600k captions ≈ COCO's 616k), except the last 5,000
images (the ``test`` split) have 5 each, for an end-to-end 5k × 25k evaluation; the rest is
``train``.

Per size:
- write: rows/s and MB/s of write_cache (features generated shard by shard, never whole);
- read: opening the cache, random batches of 128 rows (as training reads), a sequential
  scan (MB/s). The file was just written, so reads mostly hit the page cache;
- train: Trainer set-up (open, vocabulary, tokenising), iterations/s over ``--iterations``
  steps (VSE++ mh loss, batch 128, small ``--embed-dim`` 256: the head's cost does not
  depend on the cache size; median step time, robust to the other jobs' bursts), then
  ``validate()`` on the test split = encode 5k images and 25k captions + the 5k × 25k
  metrics; peak RSS of the process. HDF5 keeps every shard a read has touched open
  (~0.56 MB each), so the training RSS grows with the number of shards, not of rows;
- at the middle size also with ``--preload`` (the whole feature array in RAM), to show
  what loading the cache would cost.

Then, for the time ratios between sizes, one process holds a trainer of every size and
times them side by side, round after round (training steps, random batch reads, the
5k × 25k evaluation), so that the load of the other jobs on this shared machine falls on
all sizes alike; the per-size runs give the memory figures.

Prints one JSON object and writes it to ``--out`` (bench/results/scale.json). The CPU is
shared with other jobs (see ``machine.loadavg``): compare ratios within one run, not
absolute times across runs.

    python bench/scale.py [--sizes 10000,100000,600000] [--dim 2048] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO_TOKENS = ROOT / "data" / "Flickr8k.token.txt"
TEST_IMAGES, TEST_CAPTIONS_PER_IMAGE = 5000, 5
BATCH_ROWS = 128
# One torch thread per child: on this shared 2-core machine two OpenMP threads made a
# GRU step ~10× slower than one (their barriers wait for a core another job holds).
THREADS = 1
TRAINING_RSS = "peak_rss_after_training_mb"  # before validate() allocates its 5k × 25k scores


# ---------------------------------------------------------------------------- synthetic data


class RandomRows:
    """An (n, dim) float32 array that exists only as the rows sliced from it (seeded per row
    block, so the same rows always get the same values)."""

    block = 1000

    def __init__(self, n: int, dim: int, seed: int = 0):
        self.shape, self.seed = (n, dim), seed
        self.seconds = 0.0  # spent generating, to be told apart from writing

    def __getitem__(self, rows: slice) -> np.ndarray:
        started = time.perf_counter()
        start, stop, _ = rows.indices(self.shape[0])
        if start % self.block:
            raise ValueError("RandomRows is sliced at multiples of its block")
        parts = [np.random.default_rng([self.seed, a]).random(
            (min(a + self.block, stop) - a, self.shape[1]), dtype=np.float32) - 0.5
            for a in range(start, stop, self.block)]
        self.seconds += time.perf_counter() - started
        return np.concatenate(parts) if parts else np.zeros((0, self.shape[1]), np.float32)


def synthetic_index(n: int):
    """image ids, captions, caption → image, splits (see the module docstring)."""
    demo = [line.split("\t", 1)[1] for line in DEMO_TOKENS.read_text(encoding="utf-8").splitlines()]
    test = min(TEST_IMAGES, n // 2)
    per_image = np.ones(n, dtype=np.int64)
    per_image[n - test:] = TEST_CAPTIONS_PER_IMAGE
    caption_image = np.repeat(np.arange(n), per_image)
    captions = [demo[j % len(demo)] for j in range(len(caption_image))]
    ids = [f"synthetic/{i:07d}.jpg" for i in range(n)]
    return ids, captions, caption_image, {"train": np.arange(n - test), "test": np.arange(n - test, n)}


# ---------------------------------------------------------------------------- child phases


def _open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def phase_write(path: Path, n: int, dim: int) -> dict:
    from pipeline.data.cache import DEFAULT_SHARD_SIZE, write_cache

    t0 = time.perf_counter()
    ids, captions, caption_image, splits = synthetic_index(n)
    index_s = time.perf_counter() - t0
    features = RandomRows(n, dim)
    t0 = time.perf_counter()
    write_cache(path, features, ids, captions, caption_image, splits, attrs={"backbone": "synthetic"})
    seconds = time.perf_counter() - t0 - features.seconds  # writing only
    shards = path.with_name(path.name + ".shards")
    size = path.stat().st_size + sum(p.stat().st_size for p in shards.iterdir())
    return {"captions": len(captions), "shards": len(list(shards.iterdir())),
            "shard_size": DEFAULT_SHARD_SIZE, "index_build_s": round(index_s, 2),
            "generate_s": round(features.seconds, 2), "write_s": round(seconds, 2),
            "rows_per_s": round(n / seconds), "mb_per_s": round(n * dim * 4 / 2**20 / seconds, 1),
            "disk_mb": round(size / 2**20, 1), "peak_rss_mb": peak_rss_mb()}


def phase_read(path: Path, n: int, dim: int) -> dict:
    from pipeline.data.cache import FeatureCache

    t0 = time.perf_counter()
    cache = FeatureCache(path)
    open_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    batches = [np.sort(rng.choice(n, BATCH_ROWS, replace=False)) for _ in range(100)]
    t0 = time.perf_counter()
    for rows in batches:
        cache.read(rows)
    random_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    block = 8192
    for start in range(0, n, block):
        np.asarray(cache.features[start:start + block])
    scan_s = time.perf_counter() - t0
    open_files = _open_files()  # HDF5 keeps each shard it has read from open
    cache.close()
    return {"open_files_after_reads": open_files, "open_s": round(open_s, 2),
            "random_batch_ms": round(random_s / len(batches) * 1e3, 2),
            "random_rows_per_s": round(len(batches) * BATCH_ROWS / random_s),
            "scan_s": round(scan_s, 2), "scan_mb_per_s": round(n * dim * 4 / 2**20 / scan_s, 1),
            "peak_rss_mb": peak_rss_mb()}


def phase_train(path: Path, run_dir: Path, iterations: int, embed_dim: int, preload: bool) -> dict:
    import torch

    baseline = peak_rss_mb()  # python + torch + pipeline imported
    t0 = time.perf_counter()
    trainer = make_trainer(path, run_dir, embed_dim, preload)
    setup_s = time.perf_counter() - t0
    after_setup = peak_rss_mb()
    batches = _endless_batches(trainer)
    for _ in range(3):  # warm-up
        trainer.step(next(batches))
    step_s = timed_steps(trainer, batches, iterations)
    train_s = sum(step_s)
    after_train = peak_rss_mb()
    t0 = time.perf_counter()
    metrics = trainer.validate()
    eval_s = time.perf_counter() - t0
    return {"captions": len(trainer.index.captions), "train_captions": len(trainer.train_captions),
            "vocab": len(trainer.vocab), "setup_s": round(setup_s, 2),
            "iterations": iterations, "iterations_per_s": round(iterations / train_s, 2),
            "ms_per_iteration": round(train_s / iterations * 1e3, 1),
            "median_ms_per_iteration": round(float(np.median(step_s)) * 1e3, 1),
            "open_files": _open_files(),
            "eval_5k_x_25k_s": round(eval_s, 2), "eval_rsum": round(metrics["rsum"], 2),
            "rss_after_imports_mb": baseline, "peak_rss_after_setup_mb": after_setup,
            "peak_rss_after_training_mb": after_train, "peak_rss_mb": peak_rss_mb(),
            "torch_threads": torch.get_num_threads()}


def make_trainer(path: Path, run_dir: Path, embed_dim: int, preload: bool = False):
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    cfg = TrainConfig(features=str(path), run_dir=str(run_dir), loss="mh", batch_size=BATCH_ROWS,
                      embed_dim=embed_dim, val_every=0, val_split="test", val_images=TEST_IMAGES,
                      workers=0, preload=preload, device="cpu", log_every=10**9)
    return build_trainer(cfg, echo=lambda *a, **k: None)


def timed_steps(trainer, batches, count: int) -> list[float]:
    """Seconds of each of ``count`` training steps (HDF5 read + forward + backward + update)."""
    seconds = []
    for _ in range(count):
        t0 = time.perf_counter()
        trainer.step(next(batches))
        seconds.append(time.perf_counter() - t0)
    return seconds


def phase_interleaved(paths: dict, run_dir: Path, embed_dim: int, rounds: int, steps: int) -> dict:
    """Time every size side by side in one process, round after round, so that the other
    jobs' load falls on all sizes alike: training steps, random batch reads, evaluation."""
    from pipeline.data.cache import FeatureCache

    trainers = {n: make_trainer(Path(p), run_dir / n, embed_dim) for n, p in paths.items()}
    batches = {n: _endless_batches(t) for n, t in trainers.items()}
    caches = {n: FeatureCache(p) for n, p in paths.items()}
    rng = np.random.default_rng(1)
    step_s = {n: [] for n in paths}
    read_s = {n: [] for n in paths}
    eval_s = {n: [] for n in paths}
    for n in paths:
        timed_steps(trainers[n], batches[n], 3)  # warm-up
    for _ in range(rounds):
        for n, trainer in trainers.items():
            step_s[n] += timed_steps(trainer, batches[n], steps)
            for _ in range(steps * 4):
                rows = np.sort(rng.choice(int(n), BATCH_ROWS, replace=False))
                t0 = time.perf_counter()
                caches[n].read(rows)
                read_s[n].append(time.perf_counter() - t0)
    for _ in range(2):
        for n, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer.validate()
            eval_s[n].append(time.perf_counter() - t0)
    return {"rounds": rounds, "steps_per_round": steps,
            "median_ms_per_iteration": {n: round(float(np.median(v)) * 1e3, 1) for n, v in step_s.items()},
            "median_random_batch_ms": {n: round(float(np.median(v)) * 1e3, 2) for n, v in read_s.items()},
            "eval_5k_x_25k_s": {n: round(min(v), 2) for n, v in eval_s.items()}}


def _endless_batches(trainer):
    """The trainer's batches, epoch after epoch, read through its own DataLoader."""
    epoch = 0
    while True:
        yield from trainer.loader(trainer.epoch_batches(epoch), 0)
        epoch += 1


# ---------------------------------------------------------------------------- parent


def run_child(phase: str, **kwargs) -> dict:
    command = [sys.executable, __file__, "--child", json.dumps({"phase": phase, **kwargs})]
    threads = str(THREADS)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": threads,
                               "MKL_NUM_THREADS": threads})
    if done.returncode != 0:
        return {"failed": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(spec: dict) -> dict:
    if spec["phase"] == "interleaved":
        return phase_interleaved(spec["paths"], Path(spec["run_dir"]), spec["embed_dim"],
                                 spec["rounds"], spec["steps"])
    path = Path(spec["path"])
    if spec["phase"] == "write":
        return phase_write(path, spec["n"], spec["dim"])
    if spec["phase"] == "read":
        return phase_read(path, spec["n"], spec["dim"])
    return phase_train(path, Path(spec["run_dir"]), spec["iterations"], spec["embed_dim"],
                       spec["phase"] == "train-preload")


def pick_dim(requested: int | None, largest: int, folder: Path) -> tuple[int, str]:
    free = shutil.disk_usage(folder).free
    if requested:
        return requested, f"given (disk free {free / 2**30:.0f} GiB)"
    for dim in (2048, 1024, 512):
        if largest * dim * 4 * 2 < free:  # room for the cache twice over: other jobs share the disk
            return dim, (f"largest cache {largest * dim * 4 / 2**30:.1f} GiB, disk free "
                         f"{free / 2**30:.0f} GiB (needs 2× the cache)")
    raise SystemExit(f"not enough disk space in {folder} for {largest} rows")


def ratio(a, b):
    return round(b / a, 2) if a and b else None


def difference(a, b):
    return round(b - a, 1) if a is not None and b is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,600000")
    parser.add_argument("--dim", type=int, default=None, help="feature dimension (default: by free disk)")
    parser.add_argument("--iterations", type=int, default=40, help="timed steps of each size's own run")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the side-by-side timing")
    parser.add_argument("--steps", type=int, default=10, help="steps per size and round")
    parser.add_argument("--embed-dim", type=int, default=256)
    parser.add_argument("--workdir", default=None, help="where the caches go (default: a temp folder)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale.json"))
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    started, load_start = time.perf_counter(), os.getloadavg()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    workdir = Path(tempfile.mkdtemp(prefix="vse-scale-", dir=args.workdir))
    dim, dim_reason = pick_dim(args.dim, sizes[-1], workdir)
    middle = sizes[len(sizes) // 2]
    results, paths = {}, {str(n): str(workdir / f"scale-{n}.h5") for n in sizes}
    try:
        for n in sizes:
            common = {"path": paths[str(n)], "n": n, "dim": dim}
            train = {"path": paths[str(n)], "run_dir": str(workdir / f"run-{n}"),
                     "iterations": args.iterations, "embed_dim": args.embed_dim}
            results[str(n)] = {"write": run_child("write", **common), "read": run_child("read", **common),
                               "train": run_child("train", **train)}
            if n == middle:
                results[str(n)]["train_preload"] = run_child("train-preload", **train)
            print(json.dumps({n: results[str(n)]}), file=sys.stderr, flush=True)
        interleaved = run_child("interleaved", paths=paths, run_dir=str(workdir / "interleaved"),
                                embed_dim=args.embed_dim, rounds=args.rounds, steps=args.steps)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    first, last = str(sizes[0]), str(sizes[-1])
    small, large = results[first], results[last]

    def get(result, *keys):
        for key in keys:
            result = result.get(key, {}) if isinstance(result, dict) else {}
        return result if result != {} else None

    feature_mb = {str(n): round(n * dim * 4 / 2**20, 1) for n in sizes}
    report = {
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "note": "2-core machine shared with other jobs (training runs, other benches): "
                            "absolute times are pessimistic; compare ratios"},
        "settings": {"sizes": sizes, "dim": dim, "dim_reason": dim_reason,
                     "captions": f"1 per image, {TEST_CAPTIONS_PER_IMAGE} for the last {TEST_IMAGES} "
                                 "(test split); recycled real demo captions",
                     "batch_size": BATCH_ROWS, "embed_dim": args.embed_dim,
                     "iterations": args.iterations, "loss": "mh", "device": "cpu", "workers": 0,
                     "torch_threads": THREADS},
        "feature_array_mb": feature_mb,
        "results": results,
        "interleaved": interleaved,
        "scaling": {
            "rows_ratio": ratio(sizes[0], sizes[-1]),
            "write_time_ratio": ratio(get(small, "write", "write_s"), get(large, "write", "write_s")),
            "scan_time_ratio": ratio(get(small, "read", "scan_s"), get(large, "read", "scan_s")),
            "train_setup_time_ratio": ratio(get(small, "train", "setup_s"), get(large, "train", "setup_s")),
            "captions_ratio": ratio(get(small, "train", "captions"), get(large, "train", "captions")),
            # side by side (interleaved), so the machine's load does not bias the ratios:
            "iteration_time_ratio": ratio(get(interleaved, "median_ms_per_iteration", first),
                                          get(interleaved, "median_ms_per_iteration", last)),
            "random_batch_time_ratio": ratio(get(interleaved, "median_random_batch_ms", first),
                                             get(interleaved, "median_random_batch_ms", last)),
            "eval_time_ratio": ratio(get(interleaved, "eval_5k_x_25k_s", first),
                                     get(interleaved, "eval_5k_x_25k_s", last)),
            "training_peak_rss_mb": {str(n): get(results[str(n)], "train", TRAINING_RSS) for n in sizes},
            "training_rss_growth_mb": difference(get(small, "train", TRAINING_RSS),
                                                 get(large, "train", TRAINING_RSS)),
            "feature_array_growth_mb": round(feature_mb[str(sizes[-1])] - feature_mb[str(sizes[0])], 1),
            "with_eval_peak_rss_mb": {str(n): get(results[str(n)], "train", "peak_rss_mb") for n in sizes},
            f"preload_rss_extra_mb_at_{middle}": difference(
                get(results[str(middle)], "train", TRAINING_RSS),
                get(results[str(middle)], "train_preload", TRAINING_RSS)),
        },
        "total_s": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(report, indent=1)
    from pipeline.core.fsutil import write_atomic

    write_atomic(args.out, text.encode() + b"\n")
    print(text)


if __name__ == "__main__":
    main()
