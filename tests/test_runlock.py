"""One training process per run folder (pipeline.core.runlock): a second `vse train` on a run
folder in use stops with one line naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from pipeline.core.errors import VseError
from pipeline.core.runlock import LOCK_NAME, RunLock
from pipeline.training.run_folder import find_runs

pytestmark = pytest.mark.slow  # processes, real images or servers: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys; from pipeline.core.runlock import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); sys.stdin.read()")


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process that holds ``run_dir``'s lock until its stdin closes or it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline() == "held\n"
    return proc


def _train(tiny_cache, run_dir, *extra):
    args = ["train", "--features", tiny_cache, "--run-dir", run_dir, "--loss", "sh", "--epochs", 1,
            "--embed-dim", 16, "--word-dim", 8, "--batch-size", 16, "--min-word-count", 1,
            "--val-every", 0, "--workers", 0, "--device", "cpu", *extra]
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_a_second_training_on_a_run_folder_in_use_stops_naming_the_holder(tiny_cache, tmp_path):
    run = tmp_path / "run"
    assert _train(tiny_cache, run).exit_code == 0
    assert not (run / LOCK_NAME).exists()  # a finished run leaves no lock file
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    holder = _holder(run)
    try:
        for extra in ((), ("--resume", "--epochs", 2)):
            result = _train(tiny_cache, run, *extra)
            assert result.exit_code == 1, result.output
            line = result.output.strip()
            assert line.splitlines() == [line]
            assert line.startswith(f"error: {run}: the run folder is in use by pid {holder.pid} "
                                   f"on host {socket.gethostname()} since ")
            assert "UTC" in line and "another --run-dir" in line
        info = json.loads((run / LOCK_NAME).read_text())
        assert info["pid"] == holder.pid
        # nothing of the run was touched by the refused processes
        assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*")
                if p.is_file() and p.name != LOCK_NAME} == before
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert not (run / LOCK_NAME).exists()  # released: the holder removed it at exit


def test_a_lock_left_by_a_killed_process_is_taken_over(tiny_cache, tmp_path):
    run = tmp_path / "run"
    holder = _holder(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    stale = json.loads((run / LOCK_NAME).read_text())
    assert stale["pid"] == holder.pid  # the file stays, but the kernel dropped the lock
    assert find_runs([str(tmp_path / "*")]) == []  # a lock file alone makes no run
    result = _train(tiny_cache, run)
    assert result.exit_code == 0, result.output
    assert not (run / LOCK_NAME).exists()
    assert find_runs([str(tmp_path / "*")]) == [run]


def test_the_lock_is_reentrant_in_a_process_and_only_rank_0_takes_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    with RunLock(run), RunLock(run):  # the sweep holds it around the trainer, which takes it too
        assert (run / LOCK_NAME).exists()
    assert not (run / LOCK_NAME).exists()
    holder = _holder(run)
    try:
        with pytest.raises(VseError, match=f"in use by pid {holder.pid}"):
            RunLock(run).acquire()
        monkeypatch.setenv("RANK", "1")  # torchrun's other ranks leave the lock to rank 0
        with RunLock(run):
            pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_a_sweep_run_is_not_started_twice_and_a_stale_lock_does_not_block_it(tiny_cache, tmp_path):
    from pipeline.training.sweep import load_sweep, run_sweep

    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: s\nruns_dir: {tmp_path / 'runs'}\n"
                    f"base: {{features: {tiny_cache}, loss: sh, epochs: 1, embed_dim: 16, word_dim: 8, "
                    "batch_size: 16, min_word_count: 1, val_every: 0, workers: 0, device: cpu}\n"
                    "grid: {seed: [0, 1]}\n")
    sweep = load_sweep(spec)
    busy, stale = sweep.runs[0].run_dir, sweep.runs[1].run_dir
    (busy / "metrics.jsonl").parent.mkdir(parents=True)
    (busy / "metrics.jsonl").write_text('{"iteration": 3}\n')
    holder = _holder(busy)
    dead = _holder(stale)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    try:
        done = run_sweep(sweep, echo=lambda *a: None, quiet_runs=True)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    status = {run.name: (run.status, run.detail) for run in done.runs}
    assert status["seed=0"][0] == "failed" and f"in use by pid {holder.pid}" in status["seed=0"][1]
    assert (busy / "metrics.jsonl").read_text() == '{"iteration": 3}\n'  # the holder's log is kept
    assert status["seed=1"][0] == "trained"
    assert (stale / "best.pt").exists() and not (stale / LOCK_NAME).exists()
