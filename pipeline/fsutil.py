"""Atomic file writes: a file at its final path is always complete.

Everything durable (cache files, shards, checkpoints, relevance files, results) is written
to a temporary sibling and renamed into place only after it is fully written and fsynced,
so a run killed at any moment never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from pathlib import Path

from .errors import VseError


@contextlib.contextmanager
def atomic_path(path, suffix: str = ".tmp"):
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and the final path is left untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VseError(f"cannot create output folder ({exc.strerror})", path.parent) from exc
    tmp = path.with_name(f".{path.name}.{os.getpid()}{suffix}")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        _unlink_quietly(tmp)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise VseError("no space left on device while writing", path) from exc
        # EACCES, EROFS, EFBIG (ulimit -f, FAT32), EIO …: the environment, not a bug
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise VseError(f"cannot write ({reason})", path) from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise


def remove_stale_temporaries(folder) -> list[Path]:
    """Delete the temporaries ``atomic_path`` left in ``folder`` when its process was killed
    (``.NAME.PID.tmp`` whose PID no longer runs); returns what was removed."""
    removed = []
    for tmp in Path(folder).glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2] if tmp.name.count(".") >= 3 else ""
        if not pid.isdigit() or _process_alive(int(pid)):
            continue
        _unlink_quietly(tmp)
        removed.append(tmp)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def write_atomic(path, data) -> None:
    """Write ``data`` (bytes-like) to ``path`` atomically, in one plain write."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_h5(path):
    """Yield a new ``h5py.File`` built in memory; write it to ``path`` atomically at the end.

    HDF5 writing to disk itself handles a failing write badly: on a full disk (or past
    ``ulimit -f``) it raises RuntimeError while flushing, or crashes while closing the
    file. Built in memory, the file reaches the disk in one plain write whose failure is
    an ordinary OSError (→ VseError). The price is the file's size in memory while writing.
    """
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        yield f
    write_atomic(path, buffer.getbuffer())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """Makes the rename durable; some filesystems cannot fsync a folder, which is fine."""
    with contextlib.suppress(OSError):
        _fsync_file(path)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
