"""Atomic file writes: a file at its final path is always complete.

Everything durable (cache files, shards, checkpoints, relevance files, results) is written
to a temporary sibling and renamed into place only after it is fully written and fsynced,
so a run killed at any moment never leaves a half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import io
import os
import re
import shutil
from pathlib import Path

from pipeline.core.errors import VseError


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


def flush_to_disk(path) -> None:
    """fsync ``path`` now (a full disk shows here, before anything depends on the file)."""
    _fsync_file(Path(path))


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


@contextlib.contextmanager
def atomic_dir(path):
    """Yield a new temporary folder next to ``path``; put it in place of ``path`` on success.

    The folder is filled under a hidden name (``.NAME.PID.tmp``), every file in it fsynced,
    then renamed onto ``path``. An existing ``path`` (checked by ``guard_output`` first) is
    renamed aside (``.NAME.PID.old``) just before and removed after: a process killed
    between the two renames leaves no folder at ``path`` and both folders complete under
    their hidden names, never a half-written one at ``path``. On any exception the temporary
    folder is removed and ``path`` is left untouched. Temporary folders of processes that no
    longer run are removed when the next one starts.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise VseError(f"cannot create output folder ({exc.strerror})", path.parent) from exc
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = stale.name[len(path.name) + 2:-len(".tmp")]
        if stale.is_dir() and pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    old = path.with_name(f".{path.name}.{os.getpid()}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        for item in tmp.rglob("*"):
            if item.is_file():
                _fsync_file(item)
        _fsync_dir(tmp)
        if os.path.lexists(path):
            os.replace(path, old)
            os.replace(tmp, path)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                _unlink_quietly(old)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise VseError("no space left on device while writing", path) from exc
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise VseError(f"cannot write ({reason})", path) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes (a checkpoint's, weights', index file's identity)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sampled_sha256(path, start: int = 0, length: int | None = None, blocks: int = 32,
                   block_size: int = 1 << 16) -> str:
    """Hex sha256 of ``blocks`` blocks of ``block_size`` bytes spread evenly over bytes
    [start, start + length) of a file (the first and the last block included), and of the
    range itself: what identifies a file too large to read whole (a 33 GB array of regions costs
    32 reads of 64 KiB). Another file of the same size is told apart unless it differs only
    between the samples."""
    with open(path, "rb") as handle:
        end = handle.seek(0, os.SEEK_END) if length is None else start + length
        digest = hashlib.sha256(f"{start}:{end}:{blocks}:{block_size}".encode())
        span = max(0, end - start - block_size)
        for i in range(blocks):
            handle.seek(start + (span * i) // max(1, blocks - 1))
            digest.update(handle.read(min(block_size, end - start)))
    return digest.hexdigest()


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


# ---------------------------------------------------------------------------- output guard

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_SNIFF_BYTES = 1 << 16
_JSON_FORMAT = re.compile(r'\s*\{\s*"format"\s*:\s*"([^"\\]*)"')  # {"format": "TAG", ...
FOLDER_META = "meta.json"  # a folder output's description, JSON with a leading "format" tag
RESULTS_FORMAT = "vse-results"  # a results.csv (reports.report): its header starts "run," and has rsum


def output_format(path) -> str | None:
    """The format tag of a file vse writes, read without running anything: an HDF5 file's
    ``format`` attribute, a pickle's (joblib) leading ``"format": TAG`` item, a PNG's
    ``format`` text chunk, a PDF's ``/Creator``, an HTML page's ``<meta name="generator">``, a
    JSON object's leading ``"format": TAG`` item, ``RESULTS_FORMAT`` for a CSV whose header
    starts with ``run`` and has ``rsum``, a folder's by its ``FOLDER_META`` JSON file. None for
    anything else (a file or folder vse did not write)."""
    path = Path(path)
    if path.is_dir():  # a folder output (a search index) describes itself in FOLDER_META
        return output_format(path / FOLDER_META) if (path / FOLDER_META).is_file() else None
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
            if head.startswith(_PNG_MAGIC):
                fh.seek(0)
                return _png_format(fh.read())
            if head.startswith(b"%PDF"):
                fh.seek(max(0, path.stat().st_size - _SNIFF_BYTES))
                return _pdf_format(fh.read())
    except OSError:
        return None
    if head.startswith(_HDF5_MAGIC):
        return _hdf5_format(path)
    if head[:1] == b"\x80":  # pickle protocol 2+ (joblib)
        return _pickle_format(head)
    text = head.decode("utf-8", errors="replace")
    match = (_JSON_FORMAT.match(text)
             or re.search(r'<meta name="generator" content="([^"]*)"', text[:4096]))
    if match:
        return match.group(1)
    header = text.split("\n", 1)[0].rstrip("\r").split(",")
    if header[0] == "run" and "rsum" in header:
        return RESULTS_FORMAT
    return None


def guard_output(path, fmt: str, what: str, overwrite: bool = False) -> None:
    """Refuse to replace an existing ``path`` that is not this command's own output (format
    tag ``fmt``, e.g. ``vse-features``; ``what`` names it in the message), unless
    ``overwrite``. A folder is replaced only when it is this command's own output (written
    through ``atomic_dir``), whatever ``overwrite`` says. Nothing is deleted here: the new
    output replaces the old file atomically once it is complete."""
    path = Path(path)
    if path.is_dir():
        if output_format(path) == fmt:
            return
        # a folder vse did not make is never deleted, even with --overwrite
        raise VseError(f"is a folder, not {what}", path)
    if overwrite or not path.exists():
        return
    found = output_format(path)
    if found != fmt:
        kind = f"format {found!r}" if found else "a file vse did not write"
        raise VseError(f"exists and is not {what} ({kind}); --overwrite replaces it", path)


def _hdf5_format(path: Path) -> str | None:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("format")
    except (OSError, KeyError):
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _pickle_format(head: bytes) -> str | None:
    """The value after a leading ``"format"`` string in a pickle, found by parsing its
    opcodes (pickletools never builds objects, so nothing runs)."""
    import pickletools

    strings = []
    try:
        for opcode, arg, _ in pickletools.genops(head):
            if isinstance(arg, str) and "UNICODE" in opcode.name:
                strings.append(arg)
                if len(strings) == 2:
                    break
    except Exception:  # noqa: BLE001 - any malformed or cut pickle means: no tag
        return None
    return strings[1] if len(strings) == 2 and strings[0] == "format" else None


def _png_format(data: bytes) -> str | None:
    at = len(_PNG_MAGIC)
    while at + 8 <= len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            if key == b"format":
                return value.decode("latin-1")
        if kind == b"IEND":
            break
        at += 12 + length
    return None


def _pdf_format(tail: bytes) -> str | None:
    match = re.search(rb"/Creator \(([^)]*)\)", tail)
    return match.group(1).decode("latin-1") if match else None
