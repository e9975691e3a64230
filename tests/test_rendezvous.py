"""`vse torchrun` (pipeline/training/torchrun.py): torchrun's own agent running a vse command, and a
rendezvous that cannot be reached as one line naming the endpoint, exit 1, no run folder (issue 62).

Each case runs the real agent in its own process (`python -m cli.main torchrun …`), against a port
of this machine: one nobody listens on, one this node hosts and no second node joins, and a host
name that never resolves (.invalid, RFC 6761). The timeouts are short (--rdzv-conf) so a case takes
seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cluster_services
import pytest
from conftest import vse

from pipeline.core.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow  # processes: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3  # the rendezvous's read and join timeouts in these tests
TINY = ["--loss", "sh", "--embed-dim", "8", "--word-dim", "8", "--batch-size", "8", "--min-word-count", "1",
        "--val-every", "0", "--workers", "0", "--device", "cpu", "--seed", "0"]


def torchrun(*arguments, timeout: float = 300, threads: str | None = "1") -> subprocess.CompletedProcess:
    """`vse torchrun ARGUMENTS` in a process of its own, as a shell runs it (``threads``: its
    OMP_NUM_THREADS, None for none set)."""
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    if threads is None:
        del env["OMP_NUM_THREADS"]
    env.pop("TORCH_CPP_LOG_LEVEL", None)  # the agent's C++ log lines are hidden by vse, not by the test
    return subprocess.run([sys.executable, "-m", "cli.main", "torchrun", *map(str, arguments)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """Exit 1, nothing on stdout, and stderr exactly one line: the error."""
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    assert result.stdout.strip() == "", result.stdout[-2000:]
    return lines[0]


@pytest.mark.parametrize("case", ["closed port", "no second node", "no such host", "static, closed port"])
def test_a_rendezvous_that_cannot_be_reached_is_one_line_naming_it_and_claims_no_run_folder(
        case, tiny_cache, tmp_path):
    port = cluster_services.free_port()
    local, read = f"127.0.0.1:{port}", f"read_timeout={TIMEOUT_S}"
    c10d = ["--rdzv-backend", "c10d", "--rdzv-id", "f8k", "--rdzv-endpoint"]
    local_c10d = f"--rdzv-endpoint {local}: the c10d rendezvous 'f8k' "
    options, begins, problem, processes = {
        # a client of a port nobody listens on (is_host=false: otherwise a local address is hosted)
        "closed port": ([*c10d, local, "--rdzv-conf", f"is_host=false,{read}"], local_c10d,
                        "cannot be reached", 1),
        # this node hosts the store; --nnodes 2, and the second never comes. 2 processes, no
        # OMP_NUM_THREADS and a --node-rank: torchrun's notes on them, held and dropped
        "no second node": ([*c10d, local, "--rdzv-conf", f"join_timeout={TIMEOUT_S},{read}"], local_c10d,
                           f"not all of --nnodes 2 joined within the join timeout of {TIMEOUT_S} s", 2),
        "no such host": ([*c10d, "nohost.invalid:29400", "--rdzv-conf", read],
                         "--rdzv-endpoint nohost.invalid:29400: the c10d rendezvous 'f8k' ",
                         "cannot be reached", 1),
        # torchrun's static rendezvous (--master-addr, --master-port), a node that is not rank 0
        "static, closed port": (["--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-conf",
                                 f"timeout={TIMEOUT_S},{read}"],
                                f"--master-addr 127.0.0.1 --master-port {port}: the static rendezvous ",
                                f"while trying to connect to (127.0.0.1, {port})", 2),
    }[case]
    run = tmp_path / "run"
    result = torchrun("--nnodes", 2, "--nproc-per-node", processes, "--node-rank", processes - 1, *options,
                      "train", "--features", tiny_cache, "--run-dir", run, "--epochs", 1, *TINY,
                      threads=None if processes > 1 else "1")
    line = one_error_line(result)
    assert line.startswith(f"error: {begins}"), line
    assert problem in line, line
    assert not run.exists()  # no worker started: no run folder made, none claimed


def test_a_reachable_rendezvous_runs_the_vse_command_on_every_node(tiny_cache, tmp_path):
    """The same agent, reached: two `vse torchrun` invocations (two "nodes", one process each, the
    first to come hosting the c10d store on 127.0.0.1) train one run under DDP (the checkpoint says
    world size 2), rank 0 alone prints, the run is done, and torchrun's own notes are shown."""
    run, port = tmp_path / "run", cluster_services.free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "cli.main", "torchrun", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
               "train", "--features", str(tiny_cache), "--run-dir", str(run), "--epochs", "1", *TINY]
    nodes = [subprocess.Popen([*command[:4], "--node-rank", str(node), *command[4:]], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in range(2)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, stderr[-3000:]
    assert load_checkpoint(run / "last.pt")["world_size"] == 2
    assert (run / "best.pt").is_file()
    done = [line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("done: ")]
    assert len(done) == 1, outputs
    # torchrun's note on an option (held while the nodes met), shown once they had
    assert "node_rank is only used for static rdzv_backend" in outputs[1][1], outputs[1][1][-2000:]


def test_a_worker_that_refused_its_input_says_so_once(tmp_path):
    """A vse refusal inside the worker: its own line, exit 1, and nothing more from vse torchrun."""
    result = torchrun("--standalone", "--nproc-per-node", 1, "train", "--features", tmp_path / "none.h5",
                      "--run-dir", tmp_path / "run", *TINY)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "none.h5" in errors[0], result.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_a_worker_killed_by_a_signal_is_one_line_naming_its_rank():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from pipeline.training.torchrun import failed_workers_line

    failures = {1: ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file=""),
                0: ProcessFailure(local_rank=0, pid=4241, exitcode=1, error_file="")}
    line = failed_workers_line(ChildFailedError("cli.main", failures), "train")
    assert line == "vse train under torchrun: rank 1 (pid 4242) was killed by SIGKILL; 2 of the ranks failed"
    said_why = {0: ProcessFailure(local_rank=0, pid=4241, exitcode=1, error_file=""),  # vse's error line
                1: ProcessFailure(local_rank=1, pid=4242, exitcode=2, error_file="")}  # click's usage error
    assert failed_workers_line(ChildFailedError("cli.main", said_why), "train") is None


@pytest.mark.parametrize(("arguments", "words"), [
    (["--nnodes", "2", "frobnicate"], "'frobnicate' is not a vse command"),
    (["--nnodes", "2"], "no vse command given"),
    (["--nnodes", "2", "-m", "cli.main", "train"], "-m, --no-python and --run-path are not for"),
    (["--nnodes", "2", "torchrun", "train"], "'torchrun' is not a vse command"),
    (["--no-such-option", "1", "train"], "unrecognized arguments: --no-such-option"),
])
def test_what_is_not_torchrun_and_a_vse_command_is_one_line(arguments, words):
    result = vse("torchrun", *arguments)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: vse torchrun: "), result.output
    assert words in lines[0], lines[0]
