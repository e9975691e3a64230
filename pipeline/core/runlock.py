"""One training process per run folder: ``RUN/.lock``, held with ``flock`` while a run trains.

The holder writes its pid, host and start time into the file, so a second `vse train` on the
same folder stops with one line naming the holder. The kernel drops an ``flock`` when its
process dies (kill -9 included), so a lock file left by a dead process is simply taken over;
a run that ends (or fails) removes the file. Nothing else reads it: `vse sweep`, `vse
evaluate --runs` and `vse report` see a run folder with or without it alike.

The lock is re-entrant within a process (the sweep holds it around a run whose trainer takes
it again). Under torchrun only rank 0 takes it (``RANK`` is read from the environment, as the
process group may not exist yet). On a file system without locks (some Lustre or old NFS
mounts) training goes on unlocked after a warning.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Self

from pipeline.core.errors import VseError

LOCK_NAME = ".lock"
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
_held: dict[str, list] = {}  # real path of the lock file → [fd, depth]


def _locks_here() -> bool:
    """Rank 0 of a torchrun job, or a single process."""
    from pipeline.core.distributed import env_is_main

    return env_is_main()


class RunLock:
    """``with RunLock(run_dir):`` holds RUN_DIR/.lock (creating the folder) or raises VseError."""

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.key: str | None = None

    def acquire(self) -> Self:
        if self.key is not None or not _locks_here():
            return self
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise VseError(f"cannot create the run folder ({exc.strerror})", self.run_dir) from exc
        key = os.path.realpath(self.path)
        if key in _held:
            _held[key][1] += 1
        else:
            fd = _lock(self.path)
            _held[key] = [fd, 1]
        self.key = key
        return self

    def release(self) -> None:
        if self.key is None:
            return
        entry = _held[self.key]
        entry[1] -= 1
        if entry[1] == 0:
            del _held[self.key]
            fd = entry[0]
            if fd is not None:
                try:
                    os.unlink(self.path)  # still ours: whoever waits re-checks the inode
                except OSError:
                    pass
                os.close(fd)
        self.key = None

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):  # a trainer dropped without fit() (failed set-up) lets go of the folder
        with contextlib.suppress(Exception):  # at interpreter shutdown module globals may be gone
            self.release()


def _lock(path: Path):
    """An fd holding an exclusive flock on ``path`` (its info written), None where the file
    system has no locks; VseError naming the holder when another process has it."""
    import fcntl

    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise VseError(f"cannot create the lock file {LOCK_NAME} ({exc.strerror})", path.parent) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise VseError(f"the run folder is in use by {holder}: wait for it to end, or choose "
                           f"another --run-dir", path.parent) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise VseError(f"cannot lock {LOCK_NAME} ({exc.strerror})", path.parent) from exc
            warnings.warn(f"{path.parent}: this file system cannot lock files ({exc.strerror}); "
                          "nothing stops a second training in this run folder", stacklevel=3)
            return None
        try:  # the holder that just released it may have unlinked the file: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        return fd


def _describe(fd: int) -> str:
    """'pid 123 on host h since 2026-… UTC' from the holder's lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {info['pid']} on host {info['host']} since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not written its pid yet)"
