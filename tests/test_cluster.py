"""Beyond one machine (issue 62), against the real parts, which the tests start themselves
(tests/cluster_services.py): a sweep on a one-node Slurm through submitit (a job preempted and
requeued, resuming from its last.pt; a job cancelled and taken up by the next submit; a second
submit submits nothing), a study shared by two workers through PostgreSQL (one SIGKILLed in a
trial), Optuna's heartbeat failing a trial whose worker is gone, training and evaluation across two
torchrun "nodes" on this machine, and the one-line refusals of each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cluster_services
import pytest
import torch
import yaml
from conftest import vse

from pipeline.core.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow  # processes and servers: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
slurm = cluster_services.slurm          # the session's services (fixtures), started once
postgres = cluster_services.postgres
TINY = dict(embed_dim=16, word_dim=8, lr=5e-3, min_word_count=1, workers=0, log_every=1, val_every=0,
            device="cpu")
# float32 runs of the same steps in another process (and thread count): equal to float32 rounding
WEIGHT_ATOL = 1e-5
WAIT_S = 150


def wait_for(check, what: str, timeout: float = WAIT_S, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def assert_same_weights(a: Path, b: Path) -> None:
    got, expected = load_checkpoint(a), load_checkpoint(b)
    assert got["iteration"] == expected["iteration"], (a, b)
    assert set(got["model"]) == set(expected["model"])
    for key, value in expected["model"].items():
        torch.testing.assert_close(got["model"][key], value, rtol=0, atol=WEIGHT_ATOL, msg=f"{a}: {key}")


def refused(result, *words) -> str:
    """A one-line refusal, exit 1, naming ``words``."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result.output
    assert len([line for line in lines if line.startswith("error")]) == 1, result.output
    for word in words:
        assert word in lines[-1], lines[-1]
    return lines[-1]


# ---------------------------------------------------------------------------- a sweep on Slurm
EPOCHS = 30
# a cancelled job's process trains on for a few seconds (SIGTERM, which submitit lets pass, then
# SIGKILL after KillWait): the run to cancel is long enough to be unfinished when it stops. On idle
# cores a tiny epoch takes well under 0.1 s: 100 epochs once ended inside those seconds (the run was
# done, not cancelled), so it trains 1,000
CANCELLED_EPOCHS = 1000
# the run to preempt is signalled once its first epoch is written; its jobs start apart (one sbatch
# after the other, and CI's cores are busy), so the two runs are waited for one at a time, and the
# preempted one is long enough to be mid-run well after its signal is sent
PREEMPTED_EPOCHS = 200
RUNS = {"sh-0": {"loss": "sh", "seed": 0, "epochs": PREEMPTED_EPOCHS},
        "sh-1": {"loss": "sh", "seed": 1, "epochs": CANCELLED_EPOCHS},
        "mh-0": {"loss": "mh", "seed": 0}, "mh-1": {"loss": "mh", "seed": 1}}


def sweep_file(folder: Path, cache: Path, runs: Path, epochs: int = EPOCHS, file: str = "grid.yaml",
               **slurm_keys) -> Path:
    path = folder / file
    path.write_text(yaml.safe_dump({
        "name": "grid", "runs_dir": str(runs),
        "base": {"features": str(cache), "epochs": epochs, "batch_size": 16, **TINY},
        "grid": {"run": [{"name": name, **options} for name, options in RUNS.items()]},
        "slurm": {"time": 10, **slurm_keys}}))
    return path


def job_of(run: Path) -> str:
    return json.loads((run / "slurm-job.json").read_text())["job_id"]


def last_epoch(run: Path) -> int:
    try:
        return int(load_checkpoint(run / "last.pt")["epoch"])
    except Exception:  # noqa: BLE001 - not written yet, or being replaced
        return 0


def state_of(slurm, job: str) -> str:
    out = slurm.run("squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T", check=False)
    return out.stdout.strip()


def test_a_sweep_on_slurm_survives_preemption_and_cancellation_and_equals_local_runs(slurm, tiny_cache,
                                                                                      tmp_path):
    from pipeline.training.sweep import load_sweep, train_run

    runs = tmp_path / "runs"
    config = sweep_file(tmp_path, tiny_cache, runs)
    first = vse("sweep", config, "--launcher", "slurm")
    assert first.exit_code == 0, first.output
    assert first.output.count("submitted: ") == 4, first.output
    folders = {name: runs / "grid" / f"run={name}" for name in RUNS}
    jobs = {name: job_of(folder) for name, folder in folders.items()}
    assert len(set(jobs.values())) == 4

    again = vse("sweep", config, "--launcher", "slurm")  # every run held by its queued or running job
    assert again.exit_code == 0, again.output
    assert "0 of 4 runs submitted" in again.output and again.output.count("held: ") == 4, again.output
    assert {name: job_of(folder) for name, folder in folders.items()} == jobs

    # preempted: Slurm's signal before a time limit or a preemption (SIGUSR2); submitit checkpoints
    # (RunJob.checkpoint) and requeues the job, which continues the run from its last.pt. cancelled: the
    # job ends with the run unfinished; the next submit takes it up from its last.pt. Both mid-run.
    preempted, cancelled = "sh-0", "sh-1"
    signalled_at = wait_for(lambda: last_epoch(folders[preempted]), "the first epoch of the run to preempt",
                            every=0.1)
    assert signalled_at < PREEMPTED_EPOCHS // 2, signalled_at  # still mid-run when the signal comes
    slurm.run("scancel", "--signal=USR2", jobs[preempted])
    wait_for(lambda: last_epoch(folders[cancelled]), "the first epoch of the run to cancel", every=0.1)
    slurm.run("scancel", jobs[cancelled])
    wait_for(lambda: state_of(slurm, jobs[preempted]) == "PENDING", "the requeued job")
    interrupted_at = last_epoch(folders[preempted])
    assert signalled_at <= interrupted_at < PREEMPTED_EPOCHS, (signalled_at, interrupted_at)
    # Slurm holds a requeued job back for a while (its begin time); let it start now
    slurm.run("scontrol", "update", f"JobId={jobs[preempted]}", "StartTime=now")
    wait_for(lambda: state_of(slurm, jobs[cancelled]) in ("CANCELLED", ""), "the cancelled job's end")
    status = vse("sweep", config, "--status")
    assert status.exit_code == 0, status.output
    line = next(line for line in status.output.splitlines() if line.endswith(")") and cancelled in line)
    assert line.startswith("unfinished") and f"job {jobs[cancelled]} CANCELLED" in line, status.output
    third = vse("sweep", config, "--launcher", "slurm")
    assert third.exit_code == 0, third.output
    assert third.output.count("submitted: ") == 1, third.output
    assert f"submitted: run={cancelled} " in third.output, third.output
    assert "continuing last.pt at epoch" in third.output
    assert job_of(folders[cancelled]) != jobs[cancelled]

    def all_done():
        result = vse("sweep", config, "--status")
        return result.output.count("done ") == 4 and result.output

    final = wait_for(all_done, "all 4 runs done", timeout=480)
    assert job_of(folders[preempted]) == jobs[preempted] and f"job {jobs[preempted]} " in final
    log = (runs / "grid" / ".slurm" / f"{jobs[preempted]}_0_log.out").read_text()
    assert f"training {folders[preempted]}" in log and f"resuming {folders[preempted]}" in log, log[-2000:]
    last = vse("sweep", config, "--launcher", "slurm")  # nothing left to submit
    assert last.exit_code == 0 and "0 of 4 runs submitted" in last.output, last.output
    assert last.output.count("done already: ") == 4

    # the same runs trained here, one process, from start to end
    local = load_sweep(config, runs_dir=tmp_path / "local")
    threads = torch.get_num_threads()
    try:
        for run in local.runs:
            train_run(run.config, resume=False, threads=1, echo=lambda *a, **k: None)
    finally:
        torch.set_num_threads(threads)
    for run in local.runs:
        assert_same_weights(runs / "grid" / run.name / "last.pt", run.run_dir / "last.pt")
        assert_same_weights(runs / "grid" / run.name / "best.pt", run.run_dir / "best.pt")


def test_slurm_refusals_are_one_line_and_claim_no_run_folder(slurm, tiny_cache, tmp_path):
    runs = tmp_path / "runs"
    config = sweep_file(tmp_path, tiny_cache, runs, epochs=1)
    before = set(slurm.jobs())
    line = refused(vse("sweep", config, "--launcher", "slurm", "--partition", "gpu-a100"), "'gpu-a100'",
                   "no such Slurm partition", cluster_services.PARTITION)
    assert "Traceback" not in line
    assert not (runs / "grid").exists()
    bad = sweep_file(tmp_path, tiny_cache, runs, epochs=1, file="bad.yaml", partition="nope")
    refused(vse("sweep", bad, "--launcher", "slurm"), "'nope'", "no such Slurm partition")
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a runs folder below a file: nobody can write there
    refused(vse("sweep", config, "--launcher", "slurm", "--runs-dir", blocked / "runs"),
            str(blocked / "runs"), "not writable", "the nodes share")
    typo = sweep_file(tmp_path, tiny_cache, runs, epochs=1, file="typo.yaml", cpu=2)
    refused(vse("sweep", typo, "--launcher", "slurm"), str(typo), "unknown slurm: key(s) cpu")
    assert not (runs / "grid").exists() and not list(tmp_path.glob("**/slurm-job.json"))
    assert set(slurm.jobs()) <= before  # no job submitted


def test_the_jobs_resources_come_from_the_defaults_the_file_and_the_command_line(tmp_path):
    from pipeline.core.errors import VseError
    from pipeline.training.launchers import SLURM_OPTIONS, slurm_settings

    defaults = {option.name: option.default for option in SLURM_OPTIONS}
    assert slurm_settings() == defaults == {"partition": None, "time": 60, "cpus": 1, "gpus": 0, "mem": None}
    merged = slurm_settings({"time": 30, "cpus": 4, "mem": "8G"},
                            {"cpus": 2, "partition": "gpu", "time": None})
    assert merged == {"partition": "gpu", "time": 30, "cpus": 2, "gpus": 0, "mem": "8G"}  # the line wins
    where = tmp_path / "grid.yaml"
    for given, said in [({"time": "1h"}, "slurm: time must be an integer"),
                        ({"cpus": 0}, "slurm: cpus must be at least 1"),
                        ({"gpus": True}, "slurm: gpus must be an integer"),
                        ([1], "slurm: must be a mapping")]:
        with pytest.raises(VseError, match=said) as caught:
            slurm_settings(given, where=where)
        assert str(caught.value).startswith(str(where))
    with pytest.raises(VseError, match="--gpus must be at least 0"):
        slurm_settings({}, {"gpus": -1})
    config = sweep_file(tmp_path, tmp_path / "none.h5", tmp_path / "runs", epochs=1)
    for args in (["--partition", "gpu"], ["--launcher", "slurm", "--jobs", "2"]):
        result = vse("sweep", config, *args)
        assert result.exit_code == 2 and "--launcher slurm" in result.output, result.output
    assert not (tmp_path / "runs").exists()


def test_a_run_is_held_by_its_job_while_slurm_holds_it_or_by_a_process_training_it(tmp_path):
    """What keeps a submit from submitting a run again (launchers._held_by): its recorded job in a state
    Slurm still holds it, or its folder's lock held by a live process; nothing else."""
    from pipeline.core.runlock import RunLock
    from pipeline.training.launchers import ALIVE, _held_by

    run = tmp_path / "run"
    assert _held_by(run, {}) == ""
    run.mkdir()
    (run / "slurm-job.json").write_text(json.dumps({"job_id": "17"}))
    for state in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED"):
        assert state in ALIVE and _held_by(run, {"17": state}) == f"job 17 {state}"
    for state in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
        assert state not in ALIVE and _held_by(run, {"17": state}) == ""
    assert _held_by(run, {"18": "RUNNING"}) == ""  # another job; a job Slurm forgot
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); from pipeline.core.runlock import RunLock; "
            "lock = RunLock(sys.argv[2]).acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(ROOT), str(run)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = _held_by(run, {})
        assert said.startswith(f"in use by pid {holder.pid} on host ") and " since " in said, said
    finally:
        holder.kill()
        holder.wait()
    assert _held_by(run, {}) == ""  # a dead holder's lock holds nothing
    with RunLock(run):  # this process's own lock is re-entrant: not another process's
        assert _held_by(run, {}) == ""


# ---------------------------------------------------------------------------- a study through PostgreSQL
def tune_file(folder: Path, cache: Path) -> Path:
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": "shared", "runs_dir": str(folder / "runs"),
        "base": {"features": str(cache), "loss": "mh", "batch_size": 16,
                 **{k: v for k, v in TINY.items() if k != "lr"}},
        "search": {"lr": {"log_uniform": [1e-4, 1e-2]}, "margin": {"uniform": [0.05, 0.5]}}}))
    return path


def worker(config: Path, url: str, budget: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "cli.main", "tune", str(config), "--budget", budget,
                             "--storage", url, "--no-plots"], cwd=ROOT, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


def test_a_study_shared_by_two_workers_through_postgresql_runs_no_trial_twice(postgres, tiny_cache, tmp_path):
    import optuna
    from optuna.trial import TrialState

    from pipeline.training.tune import sampler_for
    from pipeline.training.tune_storage import engine_url

    url = postgres.create_database("two_workers")
    config = tune_file(tmp_path, tiny_cache)
    budget, trials = "12x2", 12
    a = worker(config, url, budget, tmp_path / "a.log")
    b = worker(config, url, budget, tmp_path / "b.log")
    try:
        def a_in_a_trial():  # a trial folder whose lock worker a holds, and a first epoch done in it
            for lock in (tmp_path / "runs" / "shared").glob("trial_*/.lock"):
                try:
                    holder = json.loads(lock.read_text())["pid"]
                except (OSError, ValueError, KeyError):
                    continue
                if holder == a.pid and (lock.parent / "metrics.jsonl").is_file():
                    return lock.parent
            return None

        killed = wait_for(a_in_a_trial, "worker a inside a trial", every=0.1)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        assert b.wait(timeout=300) == 0, (tmp_path / "b.log").read_text()[-3000:]
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
                process.wait()
    study = optuna.load_study(study_name="shared", storage=engine_url(url))
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == trials, states
    assert states.count(TrialState.RUNNING) == 0 and states.count(TrialState.WAITING) == 0, states
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    killed_number = int(killed.name.split("_")[1])
    assert [t.number for t in failed] == [killed_number], states
    counted = [t for t in study.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # none twice: every counted trial has its own parameters, one folder, one run in it; the killed
    # trial's parameters ran once more (its retry, by worker b)
    params = [tuple(sorted(t.params.items())) for t in counted]
    assert len(set(params)) == trials
    retry = [t for t in counted if t.system_attrs.get("failed_trial") == killed_number]
    assert len(retry) == 1 and retry[0].params == failed[0].params
    for trial in counted:
        folder = tmp_path / "runs" / "shared" / f"trial_{trial.number:04d}"
        record = json.loads((folder / "tune.json").read_text())
        assert record["trial"] == trial.number and record["state"] == trial.state.name
        epochs = [json.loads(line)["epoch"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert epochs == sorted(set(epochs)), (trial.number, epochs)  # one run per folder, never appended
    assert "marked failed and queued again" in (tmp_path / "b.log").read_text()

    # against one worker with the same sampler seed: TPE's 10 random startup trials are drawn from
    # the trial's number (tune.sampler_for), so each startup trial has the parameters a one-worker
    # study gives the same number, but for the killed trial's retry (its number draws nothing: it
    # reruns the killed trial's); the trials after the startup follow TPE on whichever trials had
    # finished when they were asked, which two workers change
    one = optuna.create_study(direction="maximize")
    settings = type("S", (), {"sampler_seed": 0})()
    distributions = failed[0].distributions
    for _ in range(10):
        one.sampler = sampler_for(one, settings)
        one.tell(one.ask(distributions), 0.0)
    for trial in study.trials:
        if trial.number < 10 and "failed_trial" not in trial.system_attrs:
            assert trial.params == one.trials[trial.number].params, trial.number


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning",
                            "ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_whose_heartbeat_stopped_is_failed_and_queued_again(postgres):
    """Optuna's heartbeat on the PostgreSQL storage: a RUNNING trial whose worker stopped beating (a
    killed process on another machine) is failed by whichever worker looks next, and queued again
    once with its parameters (tune.queue_again, as RetryFailedTrialCallback(max_retry=1))."""
    import optuna
    from optuna.trial import TrialState

    from pipeline.training.tune import queue_again
    from pipeline.training.tune_storage import GRACE_BEATS, open_storage

    url = postgres.create_database("heartbeat")
    storage = open_storage(url, stale_trial=queue_again, heartbeat=1)
    study = optuna.create_study(study_name="beat", storage=storage)
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)})
    storage.record_heartbeat(trial._trial_id)  # its worker beat once, then was killed
    assert optuna.storages.fail_stale_trials(study) is None and study.trials[0].state == TrialState.RUNNING
    time.sleep(GRACE_BEATS * 1 + 1.5)
    optuna.storages.fail_stale_trials(study)
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL, TrialState.WAITING], states
    assert study.trials[1].params == study.trials[0].params
    assert study.trials[1].system_attrs["failed_trial"] == 0
    # its retry killed too: failed, and not queued a third time
    retry = study.ask()
    storage.record_heartbeat(retry._trial_id)
    time.sleep(GRACE_BEATS * 1 + 1.5)
    optuna.storages.fail_stale_trials(study)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]


def test_a_database_url_without_its_driver_is_one_line_naming_the_extra(tiny_cache, tmp_path, monkeypatch):
    config = tune_file(tmp_path, tiny_cache)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # the cluster extra not installed
    line = refused(vse("tune", config, "--budget", "2x1", "--storage", "postgresql://u:pw@127.0.0.1:1/db"),
                   "postgresql://u:***@127.0.0.1:1/db", "driver for postgresql:// is not installed",
                   "pip install 'vse[cluster]'")
    assert "pw" not in line
    refused(vse("tune", config, "--budget", "2x1", "--storage", "mysql://u@127.0.0.1:1/db"),
            "driver for mysql:// is not installed")
    assert not (tmp_path / "runs").exists()


def test_tune_workers_on_slurm_share_one_postgresql_study(slurm, postgres, tiny_cache, tmp_path):
    import optuna

    from pipeline.training.tune_storage import engine_url

    url = postgres.create_database("slurm_workers")
    config = tune_file(tmp_path, tiny_cache)
    refused(vse("tune", config, "--budget", "4x1", "--launcher", "slurm", "--workers", "2"), "--storage")
    assert not (tmp_path / "runs").exists()
    result = vse("tune", config, "--budget", "4x1", "--storage", url, "--launcher", "slurm", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "2 worker job(s) submitted" in result.output and "--storage postgresql://nobody@" in result.output
    ids = json.loads((tmp_path / "runs" / "shared" / "slurm-job.json").read_text())["job_ids"]
    wait_for(lambda: all(state_of(slurm, j) in ("COMPLETED", "") for j in ids), "the workers' end",
             timeout=240)
    study = optuna.load_study(study_name="shared", storage=engine_url(url))
    counted = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(counted) == 4 and len({t.number for t in counted}) == 4
    for job in ids:  # each worker ran the same command a shell runs, on the shared study
        log = (tmp_path / "runs" / "shared" / ".slurm" / f"{job}_0_log.out").read_text()
        assert f"vse tune {config} --runs-dir" in log and "Job completed successfully" in log, log[-2000:]


# ---------------------------------------------------------------------------- two torchrun nodes
def test_two_torchrun_nodes_train_and_evaluate_as_one_node(tiny_cache, tmp_path):
    """`vse train` then `vse evaluate` under two torchrun invocations (two "nodes", one process each,
    one c10d rendezvous on 127.0.0.1, gloo) equal one process with the same global batch: 2 × 4 pairs a
    step, 120 training captions (15 steps an epoch, none dropped), 2 epochs."""
    out = tmp_path / "two"
    out.mkdir()
    train = ["train", "--features", str(tiny_cache), "--loss", "mh", "--epochs", "2", "--embed-dim", "16",
             "--word-dim", "8", "--lr", "5e-3", "--min-word-count", "1", "--val-every", "0", "--workers", "0",
             "--device", "cpu", "--seed", "0"]
    evaluate = ["evaluate", "--checkpoint", str(out / "run" / "last.pt"), "--features", str(tiny_cache),
                "--split", "dev", "--json", "--device", "cpu"]
    spec = out / "spec.json"
    spec.write_text(json.dumps({"cli": [[*train, "--run-dir", str(out / "run"), "--batch-size", "4"],
                                        evaluate]}))
    port = cluster_services.free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                               f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", "tests/distributed_worker.py",
                               str(spec), str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (stdout, stderr) in zip(nodes, outputs):
        assert node.returncode == 0, f"{stdout[-2000:]}\n{stderr[-4000:]}"
    alone = vse(*train, "--run-dir", tmp_path / "one", "--batch-size", "8")
    assert alone.exit_code == 0, alone.output
    assert load_checkpoint(out / "run" / "last.pt")["world_size"] == 2
    assert_same_weights(out / "run" / "last.pt", tmp_path / "one" / "last.pt")
    assert load_checkpoint(out / "run" / "last.pt")["iteration"] == 30
    printed = [json.loads(line) for stdout, _ in outputs for line in stdout.splitlines()
               if line.startswith("{")]
    assert len(printed) == 1, [o[0][-1000:] for o in outputs]  # rank 0 reports, once
    expected = json.loads(vse(*evaluate[:2], tmp_path / "one" / "last.pt", *evaluate[3:]).stdout)
    for name in ("rsum", "i2t_r1", "t2i_r1", "i2t_meanr", "t2i_meanr"):
        assert printed[0][name] == pytest.approx(expected[name], abs=1e-6), name


def test_a_rendezvous_that_cannot_be_reached_fails_and_claims_no_run_folder(tiny_cache, tmp_path):
    """192.0.2.1 (TEST-NET-1, never routed): torchrun cannot reach the c10d store and exits 1 before vse
    starts, its last line naming the problem; no run folder is made."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "192.0.2.1:29400", "--rdzv-conf",
               "join_timeout=5,read_timeout=5", "-m", "cli.main", "train", "--features", str(tiny_cache),
               "--run-dir", str(tmp_path / "run")]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert "Rendezvous" in last and ("connection to the C10d store has failed" in last
                                     or "Timeout" in last), last
    assert not (tmp_path / "run").exists()
