"""Real cluster services for tests/test_cluster.py, started by the tests themselves in temp folders
and torn down after the session: a one-node Slurm (Debian's slurm-wlm: munged with a key made here,
slurmctld, slurmd) and a throwaway PostgreSQL cluster (Debian's postgresql: initdb, pg_ctl).

A fixture skips its tests, with the reason, only when the package is not installed (``make install``
installs both with apt-get, as it does chromium); a service that is installed but does not start
fails the test with its log. Nothing here touches the machine's own /etc/slurm, /etc/munge or
PostgreSQL: every file (config, key, state, spool, logs, sockets, pid files) is in the temp folder,
the daemons listen on free ports of 127.0.0.1, and the clients find them through ``SLURM_CONF``.

Run as a script (``python tests/cluster_services.py slurm|postgres``) it starts one and waits, for
trying the commands of docs/cluster.md by hand.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PARTITION = "debug"
START_TIMEOUT_S = 60
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
PG_USER = "nobody"  # PostgreSQL refuses to run as root: its cluster belongs to this user


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _missing(binaries) -> list[str]:
    return [name for name in binaries if shutil.which(name) is None
            and not os.path.exists(f"/usr/sbin/{name}")]


def _wait(check, what: str, log: Path | None, timeout: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else "(no log)"
    raise RuntimeError(f"{what} did not start within {timeout:.0f} s; its log:\n{tail}")


def _kill(pid_file: Path, pid: int | None = None) -> None:
    """Stop the daemon of ``pid_file`` (or ``pid``): SIGTERM, then SIGKILL after 10 s."""
    if pid is None:
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------------------- Slurm
@dataclass
class Slurm:
    folder: Path
    conf: Path
    node: str
    partition: str = PARTITION
    pids: dict = field(default_factory=dict)

    @property
    def env(self) -> dict:
        """What a Slurm client (sbatch, squeue, submitit) needs to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args, check=True) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=60)

    def jobs(self) -> list[str]:
        """The ids of the jobs this cluster holds (any state squeue shows)."""
        out = self.run("squeue", "--noheader", "--format=%i").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def node_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "--format=%t", check=False).stdout.strip()
        return out in ("idle", "mix", "alloc")

    def stop(self) -> None:
        """Cancel every job and wait (up to 30 s) until none runs, so no job's processes outlive the
        daemons; then stop slurmd, slurmctld and munged."""
        env = {**os.environ, **self.env}
        subprocess.run(["scancel", "--full", f"--user={pwd.getpwuid(os.getuid()).pw_name}"], env=env,
                       capture_output=True, timeout=30, check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = subprocess.run(["squeue", "--noheader", "--format=%T"], env=env, capture_output=True,
                                    text=True, timeout=30, check=False)
            if listed.returncode or not listed.stdout.strip():
                break
            time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            _kill(self.folder / f"{name}.pid", self.pids.get(name))


def slurm_conf(folder: Path, node: str, cpus: int, memory_mb: int, ports: tuple[int, int],
               munge_socket: Path) -> str:
    return "\n".join([
        "ClusterName=vsetest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",  # a job per CPU: memory is not a consumable here
        "SchedulerType=sched/builtin",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        "JobRequeue=1",
        "KillWait=2",                  # SIGTERM to SIGKILL (submitit lets SIGTERM pass)
        "MinJobAge=600",               # a finished job stays visible to squeue/sacct-less queries
        "SlurmdParameters=config_overrides",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def start_slurm(folder: Path) -> Slurm:
    """munged, slurmctld and slurmd of one node (this host, on 127.0.0.1), all in ``folder``."""
    folder = Path(folder)
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(folder / "munge", 0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    munge_socket = folder / "munge" / "munge.socket"
    node = socket.gethostname()
    memory_mb = max(1, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 512)
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, node, os.cpu_count() or 1, memory_mb, (free_port(), free_port()),
                               munge_socket))
    slurm = Slurm(folder, conf, node)
    try:
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={munge_socket}",
                        f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                        f"--seed-file={folder / 'munge' / 'seed'}"], check=True, capture_output=True,
                       timeout=30)
        _wait(munge_socket.exists, "munged", folder / "munged.log")
        env = {**os.environ, **slurm.env}
        for daemon, log in (("slurmctld", "slurmctld.log"), ("slurmd", "slurmd.log")):
            subprocess.run([daemon, "-f", str(conf)] + (["-c", "-i"] if daemon == "slurmctld" else []),
                           env=env, check=True, capture_output=True, timeout=30)
            if daemon == "slurmctld":
                _wait(lambda: slurm.run("scontrol", "ping", check=False).returncode == 0, "slurmctld",
                      folder / log)
        _wait(slurm.node_idle, "slurmd (the node never became idle)", folder / "slurmd.log")
    except Exception:
        slurm.stop()
        raise
    return slurm


# ---------------------------------------------------------------------------- PostgreSQL
@dataclass
class Postgres:
    folder: Path
    port: int
    bin: Path

    @property
    def url(self) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def url_of(self, database: str) -> str:
        return f"postgresql://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        _as_user([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), name])
        return self.url_of(name)

    def stop(self) -> None:
        """pg_ctl stop (fast); the postmaster killed by its pid file if that fails; the folder removed."""
        data = self.folder / "data"
        result = subprocess.run(_runuser([str(self.bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                                          "stop"]), capture_output=True, timeout=60, check=False)
        if result.returncode:
            _kill(data / "postmaster.pid")
        shutil.rmtree(self.folder, ignore_errors=True)


def _runuser(command: list[str]) -> list[str]:
    return ["runuser", "-u", PG_USER, "--", *command] if os.geteuid() == 0 else command


def _as_user(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(_runuser(command), capture_output=True, text=True, timeout=120)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def start_postgres(folder: Path) -> Postgres:
    """initdb and pg_ctl start of a cluster in ``folder`` (owned by ``PG_USER`` when run as root),
    listening on a free port of 127.0.0.1, trusting local connections."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        user = pwd.getpwnam(PG_USER)
        os.chown(folder, user.pw_uid, user.pw_gid)  # (its parents must let that user through: /tmp does)
    binaries = postgres_bin()
    data = folder / "data"
    _as_user([str(binaries / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8",
              "--no-sync"])
    port = free_port()
    server = Postgres(folder, port, binaries)
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off -c max_connections=100"
    _as_user([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "postgres.log"), "-o", options,
              "-w", "-t", str(START_TIMEOUT_S), "start"])
    return server


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = _missing(SLURM_BINARIES)
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): `make install` installs "
                    "slurm-wlm and munge with apt-get")
    cluster = start_slurm(tmp_path_factory.mktemp("slurm"))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # submitit's sbatch/squeue, in this process
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb missing): `make "
                    "install` installs postgresql with apt-get")
    # not under pytest's temp folder: a later pytest session (of another checkout too) makes
    # /tmp/pytest-of-USER private again, and the server's user could no longer reach its folder
    server = start_postgres(Path(tempfile.mkdtemp(prefix="vse-postgres-")))
    try:
        yield server
    finally:
        server.stop()


if __name__ == "__main__":
    import sys

    what = sys.argv[1] if len(sys.argv) > 1 else "slurm"
    started = (start_slurm if what == "slurm" else start_postgres)(Path(tempfile.mkdtemp(prefix=what)))
    print(f"export SLURM_CONF={started.conf}" if what == "slurm" else started.url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # kill PID stops the services too
    try:
        signal.pause()
    finally:
        started.stop()
