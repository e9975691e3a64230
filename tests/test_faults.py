"""Fault injection: `vse extract`, `vse train` and `vse relevance` killed with SIGKILL at
chosen points, disk full and unwritable output folders.

How a process is killed at a precise point (test machinery only, no user-visible option):
this file, run as a script with ``--fork-server``, imports the CLI once and then serves
requests from the test: for each it forks a child that arms one *hook* — a monkeypatch of a
library function that calls ``os.kill(os.getpid(), SIGKILL)`` when the chosen point is
reached — and runs the real `vse` command line. The server reports the child's exit status
(-9 when the hook fired). Forking from a process that imported torch but never ran an
operation keeps each run to a fraction of a second instead of a fresh interpreter's ~5 s,
and every run (killed, resumed and uninterrupted) gets the same environment (one thread),
so features can be compared byte for byte. Hooks (see ``_arm``):

    dataset:NAME:N        h5py has just created dataset NAME for the N-th time in this
                          process (an HDF5 file is half built)
    shard-written:I       ShardedWriter.write_shard(I) has returned (between two shards)
    partial:NAME:N        the N-th durable write of file NAME has only its first half in
                          the temporary file when the process dies
    step:N                the trainer is about to run iteration N + 1

and three that make a write fail instead of killing:

    enospc:NAME           fsync of NAME's temporary file fails with ENOSPC (disk full)
    eacces:NAME           renaming NAME's temporary file into place fails with EACCES
    fsize:BYTES           a real limit: RLIMIT_FSIZE (ulimit -f) of BYTES, so the kernel
                          fails any write past it with EFBIG, whichever library writes
    nofile:SOFT:HARD      a real limit on open files (ulimit -n)
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow  # processes, real images or servers: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
KILLED = -signal.SIGKILL
PRELOAD = ("pipeline.data.extract", "pipeline.training.trainer", "pipeline.evaluation.evaluate",
           "pipeline.relevance.stage",
           "sklearn.decomposition", "sklearn.feature_extraction.text", "nltk.stem", "joblib")


# ---------------------------------------------------------------------------- fork server


def _is_temporary_of(path, name: str) -> bool:
    """Whether ``path`` is atomic_path's temporary file for a file called ``name``."""
    return re.fullmatch(rf"\.{re.escape(name)}\.\d+\.tmp", Path(path).name) is not None


def _arm(hook: str) -> None:
    """Install the SIGKILL hook ``hook`` (grammar in the module docstring) in this process."""
    kind, *args = hook.split(":")

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if kind == "none":
        return
    if kind == "dataset":
        name, nth = args[0], int(args[1])
        create_dataset, seen = h5py.Group.create_dataset, []

        def create_then_die(self, ds_name, *a, **k):
            created = create_dataset(self, ds_name, *a, **k)
            if ds_name == name:
                seen.append(ds_name)
                if len(seen) == nth:
                    die()
            return created

        h5py.Group.create_dataset = create_then_die
    elif kind == "shard-written":
        from pipeline.data.cache import ShardedWriter

        write_shard = ShardedWriter.write_shard

        def write_then_die(self, index, *a, **k):
            write_shard(self, index, *a, **k)
            if index == int(args[0]):
                die()

        ShardedWriter.write_shard = write_then_die
    elif kind == "partial":
        from pipeline.core import fsutil

        name, nth = args[0], int(args[1])
        fsync_file, seen = fsutil._fsync_file, []

        def half_written_then_die(path):
            if _is_temporary_of(path, name):
                seen.append(path)
                if len(seen) == nth:
                    os.truncate(path, os.path.getsize(path) // 2)
                    die()
            fsync_file(path)

        fsutil._fsync_file = half_written_then_die
    elif kind == "enospc":
        from pipeline.core import fsutil

        fsync_file = fsutil._fsync_file

        def fsync_on_a_full_disk(path):
            if _is_temporary_of(path, args[0]):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            fsync_file(path)

        fsutil._fsync_file = fsync_on_a_full_disk
    elif kind == "eacces":
        replace = os.replace

        def replace_in_a_read_only_folder(source, target):
            if Path(target).name == args[0]:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            replace(source, target)

        os.replace = replace_in_a_read_only_folder  # this process is thrown away after the run
    elif kind == "fsize":
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write, do not kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(args[0]), resource.RLIM_INFINITY))
    elif kind == "nofile":
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (int(args[0]), int(args[1])))
    elif kind == "step":
        from pipeline.training.trainer import Trainer

        step = Trainer.step

        def die_before_step(self, batch):
            if self.progress.iteration == int(args[0]):
                die()
            return step(self, batch)

        Trainer.step = die_before_step
    else:
        raise ValueError(f"unknown hook {hook!r}")


def _serve() -> None:
    """The fork server: one JSON request per stdin line, one exit status per stdout line."""
    import importlib

    from cli.main import cli

    for module in PRELOAD:  # what the commands import lazily; importing runs no torch op
        importlib.import_module(module)

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(cli, request)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    os._exit(0)  # skip tearing down torch & co. (seconds)


def _run_child(cli, request) -> None:
    code = 70
    try:
        for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
            target = os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
        _arm(request["hook"])
        cli.main(request["args"], prog_name="vse")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def vse(tmp_path_factory):
    """``vse(args, hook="none") -> Run``: the real CLI in a forked child process."""
    logs = tmp_path_factory.mktemp("logs")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, __file__, "--fork-server"], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    count = [0]

    def run(args, hook="none") -> Run:
        count[0] += 1
        out, err = logs / f"{count[0]}.out", logs / f"{count[0]}.err"
        request = {"args": [str(a) for a in args], "hook": hook, "stdout": str(out), "stderr": str(err)}
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        reply = server.stdout.readline()
        assert reply, "the fork server died"
        return Run(int(reply), out.read_text(), err.read_text())

    yield run
    server.stdin.close()
    server.wait(timeout=60)


def _one_error_line(run: Run, path, problem: str) -> None:
    assert run.code == 1, (run.code, run.stderr)
    assert run.stderr.splitlines() == [run.stderr.strip()], run.stderr  # one line, no traceback
    assert run.stderr.startswith(f"error: {path}: ") and problem in run.stderr, run.stderr


# ---------------------------------------------------------------------------- vse extract


@pytest.fixture(scope="module")
def twelve_images(tmp_path_factory):
    from test_bad_inputs import flickr8k_layout

    return flickr8k_layout(tmp_path_factory.mktemp("f8k"), 12)


def _extract_args(root, out):
    # 12 images in 4 shards of 3, each in 2 batches (2 + 1)
    return ["extract", "--dataset", "flickr8k", "--root", root, "--backbone", "tiny", "--out", out,
            "--shard-size", 3, "--batch-size", 2, "--workers", 0, "--device", "cpu", "--quiet"]


def _features(path) -> bytes:
    from pipeline.data.cache import FeatureCache

    with FeatureCache(path) as cache:
        return cache.features[...].tobytes()


def _shard_files(out) -> list[str]:
    return sorted(p.name for p in Path(f"{out}.shards").iterdir())


def _complete(shard: Path) -> bool:
    with h5py.File(shard, "r") as f:
        return bool(f.attrs.get("complete"))


@pytest.fixture(scope="module")
def reference_features(vse, twelve_images, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "f8k.h5"
    run = vse(_extract_args(twelve_images, out))
    assert run.code == 0, run.stderr
    return _features(out)


@pytest.mark.parametrize("hook,complete_shards,recomputed", [
    ("dataset:bad_rows:2", 1, 3),          # while shard 1 is built
    ("partial:shard-00001.h5:1", 1, 3),    # while shard 1 is written
    ("shard-written:1", 2, 2),             # between shards 1 and 2
    ("dataset:bad_images:1", 4, 0),        # while the combined file is built
    ("partial:f8k.h5:1", 4, 0),            # while the combined file is written
])
def test_killed_extract_reruns_to_the_uninterrupted_bytes(vse, twelve_images, reference_features,
                                                          tmp_path, hook, complete_shards, recomputed):
    out = tmp_path / "f8k.h5"
    killed = vse(_extract_args(twelve_images, out), hook=hook)
    assert killed.code == KILLED, killed.stderr
    # nothing under a final name is partial: no combined file, only complete shards
    assert not out.exists()
    finals = [f"shard-{i:05d}.h5" for i in range(complete_shards)]
    assert [n for n in _shard_files(out) if not n.startswith(".")] == finals
    assert all(_complete(Path(f"{out}.shards") / n) for n in finals)
    info = vse(["info", out])
    _one_error_line(info, out, "feature cache not found")

    rerun = vse(_extract_args(twelve_images, out))
    assert rerun.code == 0, rerun.stderr
    assert f"(4 shards, {recomputed} computed here" in rerun.stdout
    assert _features(out) == reference_features
    assert _shard_files(out) == [f"shard-{i:05d}.h5" for i in range(4)]  # temp files removed
    assert vse(["info", out]).code == 0


def test_two_kills_in_a_row_still_end_with_the_same_bytes(vse, twelve_images, reference_features, tmp_path):
    out = tmp_path / "f8k.h5"
    assert vse(_extract_args(twelve_images, out), hook="shard-written:0").code == KILLED
    assert vse(_extract_args(twelve_images, out), hook="partial:shard-00002.h5:1").code == KILLED
    assert _shard_files(out)[-1] == "shard-00001.h5"
    rerun = vse(_extract_args(twelve_images, out))
    assert rerun.code == 0 and "(4 shards, 2 computed here" in rerun.stdout
    assert _features(out) == reference_features


# ---------------------------------------------------------------------------- vse train


def _train_args(cache, run_dir):
    # 120 training captions / 16 = 8 iterations per epoch; last.pt at iterations
    # 3, 6, 8 (epoch end), 9, 12, 15, 16, 18, 21, 24
    return ["train", "--features", cache, "--run-dir", run_dir, "--loss", "sh", "--epochs", 3,
            "--lr-decay-epoch", 2, "--val-every", 3, "--embed-dim", 16, "--word-dim", 8,
            "--batch-size", 16, "--lr", 0.005, "--min-word-count", 1, "--workers", 0,
            "--device", "cpu"]


def _checkpoint(path):
    from pipeline.core.checkpoint import load_checkpoint

    return load_checkpoint(path)


@pytest.fixture(scope="module")
def reference_run(vse, tiny_cache, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train") / "full"
    run = vse(_train_args(tiny_cache, run_dir))
    assert run.code == 0, run.stderr
    return run_dir


@pytest.mark.parametrize("hook,resumes_at", [
    ("step:13", 12),          # mid-epoch 2, one step after the checkpoint at iteration 12
    ("partial:last.pt:5", 9),  # while last.pt of iteration 12 is written: iteration 9's stays
])
def test_killed_training_resumes_to_the_uninterrupted_weights(vse, tiny_cache, reference_run, tmp_path,
                                                              hook, resumes_at):
    run_dir = tmp_path / "cut"
    killed = vse(_train_args(tiny_cache, run_dir), hook=hook)
    assert killed.code == KILLED, killed.stderr
    assert _checkpoint(run_dir / "last.pt")["iteration"] == resumes_at
    assert (run_dir / ".lock").exists()  # the killed trainer's lock file: stale, taken over
    resumed = vse([*_train_args(tiny_cache, run_dir), "--resume"])
    assert resumed.code == 0, resumed.stderr
    assert not (run_dir / ".lock").exists()
    assert f"resumed at epoch 2, batch {resumes_at - 8}, iteration {resumes_at}" in resumed.stdout

    full, cut = _checkpoint(reference_run / "last.pt"), _checkpoint(run_dir / "last.pt")
    assert cut["iteration"] == full["iteration"] == 24
    assert full["model"].keys() == cut["model"].keys()
    for key, value in full["model"].items():
        assert torch.equal(value, cut["model"][key]), key
    for a, b in zip(full["optimizer"]["state"].values(), cut["optimizer"]["state"].values()):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert cut["progress"] == full["progress"]
    best_full, best_cut = _checkpoint(reference_run / "best.pt"), _checkpoint(run_dir / "best.pt")
    assert best_cut["iteration"] == best_full["iteration"]
    assert all(torch.equal(v, best_cut["model"][k]) for k, v in best_full["model"].items())


def test_metrics_log_after_a_kill_and_resume_equals_the_uninterrupted_one(vse, tiny_cache, reference_run,
                                                                          tmp_path):
    run_dir = tmp_path / "cut"
    assert vse(_train_args(tiny_cache, run_dir), hook="partial:last.pt:5").code == KILLED
    assert vse([*_train_args(tiny_cache, run_dir), "--resume"]).code == 0

    def iterations(run):
        return [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert iterations(run_dir) == iterations(reference_run)  # today: iteration 12 is logged twice


# ---------------------------------------------------------------------------- vse relevance


def _relevance_args(cache, out):
    return ["relevance", "--features", cache, "--method", "svd", "--k", 16, "--out", out]


@pytest.fixture(scope="module")
def reference_relevance(vse, tiny_cache, tmp_path_factory):
    from pipeline.relevance import read_relevance

    out = tmp_path_factory.mktemp("relevance") / "rel.h5"
    run = vse(_relevance_args(tiny_cache, out))
    assert run.code == 0, run.stderr
    return read_relevance(out).vectors


@pytest.mark.parametrize("hook", ["dataset:vectors:1", "partial:rel.h5:1"])
def test_killed_relevance_leaves_no_valid_looking_file(vse, tiny_cache, reference_relevance, tmp_path, hook):
    from pipeline.core.errors import VseError
    from pipeline.relevance import read_relevance

    out = tmp_path / "rel.h5"
    killed = vse(_relevance_args(tiny_cache, out), hook=hook)
    assert killed.code == KILLED, killed.stderr
    assert not out.exists()
    assert all(p.name.startswith(".rel.h5.") and p.name.endswith(".tmp")
               for p in tmp_path.iterdir() if p.name.startswith(".")), list(tmp_path.iterdir())
    with pytest.raises(VseError, match="relevance file not found"):
        read_relevance(out)
    train = vse(["train", "--features", tiny_cache, "--run-dir", tmp_path / "run", "--loss", "lseh",
                 "--relevance", out, "--epochs", 1, "--device", "cpu"])
    _one_error_line(train, out, "relevance file not found")

    rerun = vse(_relevance_args(tiny_cache, out))
    assert rerun.code == 0, rerun.stderr
    assert np.array_equal(read_relevance(out).vectors, reference_relevance)


# ---------------------------------------------------------------------------- disk full, no permission
# Every failed write must leave what was there before (or nothing) under the final names, no
# temporary files, and one error line naming the file; the same command then completes.


def _no_temporary_files(folder: Path) -> None:
    leftovers = [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


@pytest.mark.parametrize("hook,victim,problem", [
    ("enospc:shard-00002.h5", "f8k.h5.shards/shard-00002.h5", "no space left on device while writing"),
    ("enospc:f8k.h5", "f8k.h5", "no space left on device while writing"),
    ("eacces:shard-00000.h5", "f8k.h5.shards/shard-00000.h5", "cannot write (Permission denied)"),
    ("fsize:4096", "f8k.h5.shards/shard-00000.h5", "cannot write (File too large)"),  # shards: 6.6 kB
    ("fsize:10000", "f8k.h5", "cannot write (File too large)"),                       # combined: 16 kB
])
def test_extract_on_a_full_or_unwritable_disk(vse, twelve_images, reference_features, tmp_path,
                                              hook, victim, problem):
    out = tmp_path / "f8k.h5"
    failed = vse(_extract_args(twelve_images, out), hook=hook)
    _one_error_line(failed, tmp_path / victim, problem)
    assert not out.exists()
    shards = Path(f"{out}.shards")
    assert all(_complete(p) for p in shards.iterdir()) and not (shards / Path(victim).name).exists()
    _no_temporary_files(tmp_path)
    rerun = vse(_extract_args(twelve_images, out))
    assert rerun.code == 0, rerun.stderr
    assert _features(out) == reference_features


@pytest.mark.parametrize("hook,victim,problem", [
    ("enospc:last.pt", "last.pt", "no space left on device while writing"),
    ("enospc:metrics.jsonl", "metrics.jsonl", "no space left on device while writing"),
    ("eacces:best.pt", "best.pt", "cannot write (Permission denied)"),
    ("fsize:40000", "best.pt", "cannot write (File too large)"),  # checkpoints: 82 kB
])
def test_train_on_a_full_or_unwritable_disk(vse, tiny_cache, reference_run, tmp_path, hook, victim, problem):
    run_dir = tmp_path / "run"
    failed = vse(_train_args(tiny_cache, run_dir), hook=hook)
    _one_error_line(failed, run_dir / victim, problem)
    assert not (run_dir / victim).exists()  # the first checkpoint failed: nothing half written
    _no_temporary_files(run_dir)
    rerun = vse(_train_args(tiny_cache, run_dir))
    assert rerun.code == 0, rerun.stderr
    full, again = _checkpoint(reference_run / "last.pt"), _checkpoint(run_dir / "last.pt")
    assert all(torch.equal(v, again["model"][k]) for k, v in full["model"].items())


RELEVANCE_ON_A_FULL_DISK = [
    ("enospc:rel.h5", "rel.h5", "no space left on device while writing"),
    ("enospc:rel.h5.svd.joblib", "rel.h5.svd.joblib", "no space left on device while writing"),
    ("fsize:10000", "rel.h5.svd.joblib", "cannot write (File too large)"),  # SVD model: 21 kB
    ("fsize:27000", "rel.h5", "cannot write (File too large)"),             # file: 34 kB
    ("eacces:rel.h5.svd.joblib", "rel.h5.svd.joblib", "cannot write (Permission denied)"),  # renamed last
]


@pytest.mark.parametrize("hook,victim,problem", RELEVANCE_ON_A_FULL_DISK)
def test_relevance_on_a_full_disk(vse, tiny_cache, tmp_path, hook, victim, problem):
    out = tmp_path / "rel.h5"
    args = [*_relevance_args(tiny_cache, out), "--neighbours", 5]
    failed = vse(args, hook=hook)
    _one_error_line(failed, tmp_path / victim, problem)
    assert not out.exists()
    assert not Path(f"{out}.svd.joblib").exists()  # no orphan model of a relevance file never written
    _no_temporary_files(tmp_path)
    assert vse(args).code == 0


@pytest.mark.parametrize("hook,victim,problem", RELEVANCE_ON_A_FULL_DISK)
def test_relevance_on_a_full_disk_keeps_the_previous_pair(vse, tiny_cache, tmp_path, hook, victim, problem):
    """Rebuilding over an earlier relevance file: a failed write leaves the earlier file and
    its SVD model as they were (never a new model next to the old vectors)."""
    out, model = tmp_path / "rel.h5", tmp_path / "rel.h5.svd.joblib"
    earlier = vse([*_relevance_args(tiny_cache, out), "--seed", 1])
    assert earlier.code == 0, earlier.stderr
    before = out.read_bytes(), model.read_bytes()
    failed = vse([*_relevance_args(tiny_cache, out), "--neighbours", 5], hook=hook)
    _one_error_line(failed, tmp_path / victim, problem)
    if hook.startswith("eacces"):  # the model's rename failed after the file's: neither is left
        assert not out.exists() and not model.exists()
    else:
        assert (out.read_bytes(), model.read_bytes()) == before
    _no_temporary_files(tmp_path)


@pytest.mark.parametrize("soft,hard", [(64, 64), (64, 4096)])
def test_a_cache_of_more_shards_than_open_files(vse, tmp_path, soft, hard):
    """HDF5 keeps every shard it reads open and reads one it cannot open as NaN, silently."""
    from pipeline.data.cache import write_cache

    rows = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    cache = write_cache(tmp_path / "c.h5", rows, [f"i{i}" for i in range(300)], [], [],
                        {"train": np.arange(300)}, shard_size=1)
    info = vse(["info", cache], hook=f"nofile:{soft}:{hard}")
    if hard < 300:
        _one_error_line(info, cache, f"the cache has 300 shards but this process may open only {hard} "
                                     "files (ulimit -n)")
    else:  # the soft limit is raised as far as needed
        assert info.code == 0 and "check: ok: 300 rows" in info.stdout, info.stdout + info.stderr


def _chmod_stops_writes(folder: Path) -> bool:
    """False for root (CAP_DAC_OVERRIDE writes into a chmod 0o500 folder anyway)."""
    folder.mkdir()
    folder.chmod(0o500)
    try:
        (folder / "probe").touch()
    except PermissionError:
        return True
    finally:
        folder.chmod(0o700)
    (folder / "probe").unlink()
    return False


def test_read_only_output_folders(vse, twelve_images, tiny_cache, tmp_path):
    folder = tmp_path / "read-only"
    if not _chmod_stops_writes(folder):
        pytest.skip("running as root: chmod 0o500 does not stop writes (EACCES is simulated above)")
    run_dir = folder / "run"
    run_dir.mkdir()
    folder.chmod(0o500)
    run_dir.chmod(0o500)
    try:
        out = folder / "f8k.h5"
        extract = vse(_extract_args(twelve_images, out))
        _one_error_line(extract, f"{out}.shards", "cannot create output folder (Permission denied)")
        relevance = vse(_relevance_args(tiny_cache, folder / "rel.h5"))
        _one_error_line(relevance, folder / "rel.h5.svd.joblib", "cannot write (Permission denied)")
        train = vse(_train_args(tiny_cache, run_dir))
        _one_error_line(train, run_dir, "cannot create the lock file .lock (Permission denied)")
        assert sorted(p.name for p in folder.iterdir()) == ["run"] and not any(run_dir.iterdir())
    finally:
        folder.chmod(0o700)
        run_dir.chmod(0o700)




if __name__ == "__main__" and sys.argv[1:] == ["--fork-server"]:
    _serve()
