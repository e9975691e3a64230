"""Runs and studies as Slurm jobs, through submitit (``vse sweep --launcher slurm``, ``vse tune
--launcher slurm --workers N``): no scheduler of vse's own.

A sweep submits one job per run that is not done, each training its run exactly as a local sweep
does (``sweep.train_run``: the same options, the same run folder, the same done marker). The job
id is recorded in the run folder (``RUN/slurm-job.json``), so submitting again skips a run whose job
Slurm still holds (queued, running, requeued) as well as a finished run, and a run another process
is training (its ``.lock``); a run whose job ended before its last epoch (cancelled, failed, its
node lost) is submitted again and continues from its ``last.pt``. A preempted or timed-out job gets
SIGUSR2 from Slurm before it is stopped (submitit's ``--signal``); submitit then asks the job's
callable for its ``checkpoint()``, a DelayedSubmission of the same run, and requeues the job, which
resumes from its ``last.pt``. A tune's workers are ``vse tune`` itself, run in N jobs on one shared
study (an RDB server or a journal file: never the default SQLite file, which a shared filesystem's
locks do not protect).

The run folders and ``SWEEP/.slurm`` (submitit's pickles and each job's log) must be on the
filesystem the submitting machine and the nodes share, as Slurm clusters have.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path

LAUNCHERS = ("local", "slurm")
JOB_FILE = "slurm-job.json"      # in a run folder (a sweep's run) or a tune folder (its workers)
JOBS_FOLDER = ".slurm"           # under the sweep or tune folder: submitit's files, the jobs' logs
EXTRA = "pip install 'vse[cluster]'"
# squeue's states of a job Slurm still holds: it will run, runs, or is being requeued
ALIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                   "REQUEUE_FED", "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT", "STOPPED",
                   "RESV_DEL_HOLD", "PREEMPTED"})


@dataclass(frozen=True)
class SlurmOption:
    name: str
    type: type
    default: object
    help: str


# The per-job resources: `vse sweep/tune --NAME` or a sweep file's ``slurm:`` mapping (the command line wins)
SLURM_OPTIONS = (
    SlurmOption("partition", str, None, "Slurm partition of the jobs (default: the cluster's default)."),
    SlurmOption("time", int, 60, "Minutes a job may run; a job stopped at its limit is requeued and "
                "resumes from its last.pt."),
    SlurmOption("cpus", int, 1, "CPUs per job (the run's torch threads)."),
    SlurmOption("gpus", int, 0, "GPUs per job."),
    SlurmOption("mem", str, None, "Memory per job, e.g. 16G (default: the partition's)."),
)
SLURM_KEYS = tuple(option.name for option in SLURM_OPTIONS)


def slurm_settings(from_file: dict | None = None, given: dict | None = None, where=None) -> dict:
    """The jobs' resources: the defaults, then a sweep file's ``slurm:`` mapping, then the command
    line's (``given``: None for an option not given); VseError naming the file or option."""
    from_file = {} if from_file is None else from_file
    if not isinstance(from_file, dict):
        raise VseError(f"slurm: must be a mapping of {', '.join(SLURM_KEYS)}", where)
    unknown = sorted(set(from_file) - set(SLURM_KEYS))
    if unknown:
        raise VseError(f"unknown slurm: key(s) {', '.join(unknown)} (expected {', '.join(SLURM_KEYS)})",
                       where)
    settings = {}
    for option in SLURM_OPTIONS:
        value = (given or {}).get(option.name)
        source = f"--{option.name}"
        if value is None:
            value, source = from_file.get(option.name, option.default), f"slurm: {option.name}"
        if value is not None and (not isinstance(value, option.type) or isinstance(value, bool)):
            raise VseError(f"{source} must be {'an integer' if option.type is int else 'a string'}, got "
                           f"{value!r}", where if source.startswith("slurm") else None)
        if option.type is int and value is not None and value < (1 if option.name != "gpus" else 0):
            raise VseError(f"{source} must be at least {1 if option.name != 'gpus' else 0}, got {value}",
                           where if source.startswith("slurm") else None)
        settings[option.name] = value
    return settings


# ---------------------------------------------------------------------------- Slurm, asked
def _submitit():
    try:
        import submitit
    except ImportError:
        raise VseError(f"--launcher slurm needs submitit, which is not installed: {EXTRA}") from None
    return submitit


def _slurm(*args: str) -> str:
    """A Slurm client's output; VseError when it is missing or cannot reach the controller."""
    try:
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise VseError(f"--launcher slurm: {args[0]} is not installed here (submit from a machine of the "
                       "Slurm cluster)") from None
    except subprocess.TimeoutExpired:
        raise VseError(f"--launcher slurm: {args[0]} did not answer within 60 s") from None
    if result.returncode:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise VseError(f"--launcher slurm: {' '.join(args[:2])} failed: "
                       f"{said[-1] if said else result.returncode}")
    return result.stdout


def partitions() -> tuple[list[str], str | None]:
    """(the cluster's partitions, its default partition or None)."""
    names, default = [], None
    for line in _slurm("sinfo", "--noheader", "--format=%P").split():
        name = line.rstrip("*")
        if name not in names:
            names.append(name)
        if line.endswith("*"):
            default = name
    return names, default


def check_partition(settings: dict) -> None:
    names, default = partitions()
    wanted = settings["partition"]
    if wanted is None:
        if default is None:
            raise VseError("--partition: the cluster has no default partition; name one of "
                           + ", ".join(names))
    elif wanted not in names:
        raise VseError(f"--partition {wanted!r}: no such Slurm partition (the cluster has: "
                       f"{', '.join(names) or 'none'})")


def job_states() -> dict[str, str]:
    """job id → squeue's state, for every job the controller still lists."""
    out = _slurm("squeue", "--noheader", "--states=all", "--format=%i %T")
    return dict(line.split(None, 1) for line in out.splitlines() if line.strip())


def executor(folder: Path, settings: dict, name: str):
    """submitit's SlurmExecutor of these resources; jobs get SIGUSR2 `signal_delay_s` before their time
    limit, to requeue themselves (at most a minute, or a quarter of a short limit)."""
    submitit = _submitit()
    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=3)
    params = {"job_name": name, "time": settings["time"], "cpus_per_task": settings["cpus"],
              "signal_delay_s": min(60, settings["time"] * 15), "ntasks_per_node": 1, "nodes": 1}
    if settings["partition"]:
        params["partition"] = settings["partition"]
    if settings["gpus"]:
        params["gpus_per_node"] = settings["gpus"]
    if settings["mem"]:
        params["mem"] = settings["mem"]
    ex.update_parameters(**params)
    return ex


def _submit(ex, function):
    """The job of ``function``; VseError with sbatch's own line when Slurm refuses it."""
    try:
        return ex.submit(function)
    except Exception as exc:  # submitit raises sbatch's failure as a plain or a CalledProcessError
        said = [line for line in str(getattr(exc, "output", b"") or exc).splitlines() if line.strip()]
        raise VseError(f"--launcher slurm: sbatch refused the job: {said[-1] if said else exc}") from None


def probe_writable(folder: Path) -> None:
    """The folder (made if need be) takes a file: the jobs write their runs and logs there."""
    probe = folder / f".probe-{socket.gethostname()}-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise VseError(f"the runs folder is not writable ({exc.strerror}): the jobs write their runs there, "
                       "on a filesystem the nodes share", folder) from None


@contextlib.contextmanager
def _submitting(root: Path):
    """ROOT/.submit.lock, held (waiting) while one process submits: two submits of one sweep at the
    same moment never both submit a run."""
    fd = os.open(root / ".submit.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_job(folder) -> dict | None:
    try:
        return json.loads((Path(folder) / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_job(folder: Path, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / JOB_FILE) as tmp:
        Path(tmp).write_text(json.dumps(record, indent=2), encoding="utf-8")


# ---------------------------------------------------------------------------- what a job runs
class RunJob:
    """One sweep run, as a job: ``sweep.train_run`` of its config, continuing its last.pt when there is
    one (a requeued or resubmitted job). ``checkpoint()``: the same run again (submitit requeues it)."""

    def __init__(self, config: dict, threads: int, overwrite: bool = False):
        self.config, self.threads, self.overwrite = config, threads, overwrite

    def __call__(self) -> dict:
        from pipeline.training.sweep import train_run

        run_dir = Path(self.config["run_dir"])
        if not run_dir.parent.is_dir():
            raise VseError(f"not visible from node {socket.gethostname()}: the runs folder must be on a "
                           "filesystem the submitting machine and the nodes share", run_dir.parent)
        resume = (run_dir / "last.pt").is_file() and not self.overwrite
        print(f"{'resuming' if resume else 'training'} {run_dir} on {socket.gethostname()}", flush=True)
        return train_run(self.config, resume, self.threads, overwrite=self.overwrite)

    def checkpoint(self):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(RunJob(self.config, self.threads))


class CommandJob:
    """A vse command run in a job, in-process (``vse tune ...`` for a tune worker): the command a local
    shell runs. ``command``: the click group of `vse`, handed by the caller (this layer does not import
    the command line); ``checkpoint()``: the same command again, which goes on with the study."""

    def __init__(self, command, args: list[str], cwd: str):
        self.command, self.args, self.cwd = command, list(args), cwd

    def __call__(self) -> None:
        os.chdir(self.cwd)
        print("vse " + " ".join(self.args), flush=True)
        try:
            self.command.main(args=self.args, prog_name="vse", standalone_mode=False)
        except VseError:
            raise
        except Exception as exc:  # click's own refusals (a usage error) read as they do in a shell
            if hasattr(exc, "format_message"):
                raise VseError(exc.format_message()) from None
            raise

    def checkpoint(self):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(CommandJob(self.command, self.args, self.cwd))


# ---------------------------------------------------------------------------- a sweep
def submit_sweep(sweep, settings: dict, *, resume: bool = False, overwrite: bool = False, echo=print):
    """Submit a job for each run of ``sweep`` that is neither done nor held (by its job or by a process
    training it); returns the runs submitted. Nothing is written before the partition, the folder and
    the sweep's runs have been checked."""
    from pipeline.training.sweep import check_plan, plan

    _submitit()
    check_partition(settings)
    plan(sweep)
    check_plan(sweep, overwrite)
    probe_writable(sweep.root)
    submitted = []
    with _submitting(sweep.root):
        states = job_states()
        ex = None
        for run in sweep.runs:
            held = _held_by(run.run_dir, states)
            if run.status == "done":
                echo(f"done already: {run.name} ({run.detail})")
            elif held:
                echo(f"held: {run.name} ({held}); not submitted again")
            elif run.status == "unfinished" and not resume and read_job(run.run_dir) is None:
                echo(f"unfinished: {run.name} ({run.detail}); pass --resume to continue it")
            else:
                if ex is None:
                    ex = executor(sweep.root / JOBS_FOLDER, settings, f"vse-{sweep.name}")
                job = _submit(ex, RunJob(run.config, settings["cpus"], overwrite=run.status == "other-code"))
                _write_job(run.run_dir, {"job_id": str(job.job_id), "submitted": time.time(),
                                         "host": socket.gethostname(), "sweep": sweep.name, "run": run.name,
                                         "logs": str(sweep.root / JOBS_FOLDER), "resources": settings})
                echo(f"submitted: {run.name} (job {job.job_id}"
                     + (f", continuing {run.detail}" if run.status == "unfinished" else "") + ")")
                submitted.append(run)
    echo(f"sweep {sweep.name}: {len(submitted)} of {len(sweep.runs)} runs submitted; `vse sweep ... "
         "--status` shows them")
    return submitted


def _held_by(run_dir: Path, states: dict[str, str]) -> str:
    """What holds a run: its recorded job while Slurm still holds it, or a process training it; ""."""
    record = read_job(run_dir)
    if record is not None:
        state = states.get(str(record.get("job_id")))
        if state in ALIVE:
            return f"job {record['job_id']} {state}"
    lock = run_dir / ".lock"
    if lock.is_file():
        from pipeline.core.runlock import RunLock

        try:
            with RunLock(run_dir):
                pass
        except VseError as exc:  # "...: the run folder is in use by pid N on host H since T: wait ..."
            said = str(exc)
            start, end = said.find("in use by "), said.find(": wait for it")
            return said[start:end] if 0 <= start < end else said
    return ""


def status_lines(sweep) -> list[str]:
    """One line per run: its state from its folder (done, unfinished at epoch e/E, new) and its job's
    (id and squeue's state, or ended; where a job ended short of the run, its log's last line)."""
    from pipeline.training.sweep import plan

    plan(sweep)
    try:
        states = job_states()
    except VseError as exc:
        states, note = {}, f" (squeue: {exc})"
    else:
        note = ""
    lines = []
    for run in sweep.runs:
        record = read_job(run.run_dir)
        if record is None:
            job = "no job"
        else:
            job_id = str(record.get("job_id"))
            state = states.get(job_id, "ended")
            job = f"job {job_id} {state}"
            if run.status != "done" and state not in ALIVE:
                said = _log_tail(Path(record.get("logs", sweep.root / JOBS_FOLDER)), job_id)
                job += f": {said}" if said else ""
        detail = f" ({run.detail})" if run.detail else ""
        lines.append(f"{run.status:10s} {job:24s} {run.name}{detail}")
    return lines + ([f"note{note}"] if note else [])


def _log_tail(folder: Path, job_id: str) -> str:
    """The last error line of a job's log (submitit's JOBID_0_log.err)."""
    path = folder / f"{job_id}_0_log.err"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and ("Error" in line or "error" in line or "CANCELLED" in line)]
    return lines[-1][:200] if lines else ""


# ---------------------------------------------------------------------------- a tune's workers
def require_shared_storage(storage: str | None) -> None:
    if storage is None:
        raise VseError("--launcher slurm needs --storage: a PostgreSQL or MySQL URL, or a journal file on "
                       "the shared filesystem (the default SQLite study.db is not safe across machines)")


def submit_tune_workers(tune, command, args: list[str], workers: int, settings: dict,
                        echo=print) -> list[str]:
    """``workers`` jobs, each running ``vse tune ARGS`` (``command``: the click group of `vse`; the command
    a shell runs, with --storage) on the tune's shared study; returns their job ids, also recorded in
    TUNE/slurm-job.json."""
    _submitit()
    check_partition(settings)
    probe_writable(tune.root)
    ex = executor(tune.root / JOBS_FOLDER, settings, f"vse-tune-{tune.name}")
    cwd = os.getcwd()
    ids = [str(_submit(ex, CommandJob(command, args, cwd)).job_id) for _ in range(workers)]
    from pipeline.training.tune_storage import storage_label

    shown = [storage_label(arg) if i and args[i - 1] == "--storage" else arg for i, arg in enumerate(args)]
    earlier = (read_job(tune.root) or {}).get("job_ids", [])
    _write_job(tune.root, {"job_ids": [*earlier, *ids], "submitted": time.time(), "command": ["vse", *shown],
                           "logs": str(tune.root / JOBS_FOLDER), "resources": settings})
    echo(f"tune {tune.name}: {workers} worker job(s) submitted ({', '.join(ids)}); each runs vse "
         + " ".join(shown))
    return ids
