"""The vse file formats that carry a version: one table, one check.

Each file vse writes for another command to read carries ``format`` (a tag) and
``format_version``: an HDF5 file in its attributes, a pickle or a folder's ``meta.json`` as
leading items. ``FileFormat.check`` is the one comparison every reader makes, so each refusal
says the same two things: what the file is not, and which command makes it. ``FileFormat.open``
is the one way an HDF5 file of these formats is opened for reading: it says, in one line naming
the file, that it is missing, not HDF5, another file (its format tag), another version, or
half-written (no ``complete`` attribute, for the formats whose writers set one last).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import VseError
from pipeline.core.fsutil import guard_output


@dataclass(frozen=True)
class FileFormat:
    tag: str               # the ``format`` value
    version: int           # the ``format_version`` this vse writes and reads
    noun: str              # "a vse feature cache": what the messages call it
    made_by: str           # the command that makes it
    option: str | None = None  # the option that takes it, where one does
    completes: bool = False    # the writer sets ``complete`` = True last (a file without it: half-written)

    @property
    def name(self) -> str:
        """"feature cache": the noun without its article, as a message's subject."""
        return self.noun.removeprefix("a vse ")

    def stamp(self) -> dict:
        """The two items a writer puts first."""
        return {"format": self.tag, "format_version": self.version}

    def guard(self, path, overwrite: bool = False) -> None:
        """Refuse to replace an existing ``path`` that is not of this format (``fsutil.guard_output``)."""
        guard_output(path, self.tag, self.noun, overwrite)

    def check(self, attrs, path: Path | str | None) -> None:
        """VseError, naming ``path``, unless ``attrs`` (a mapping) holds this tag and version."""
        found = attrs.get("format") if isinstance(attrs, Mapping) else None
        if found != self.tag:
            raise VseError(f"not {self.noun} (format attribute {found!r}; {self.made_by} makes them)", path)
        version = attrs.get("format_version")
        if version != self.version or isinstance(version, bool):
            raise VseError(f"unsupported format_version {version!r} of {self.noun} "
                           f"(this vse reads {self.version})", path)

    def open(self, path):
        """``path`` opened read-only (``h5py.File``, the caller closes it: ``with FMT.open(p) as f``),
        once its stamp is checked: missing, not HDF5, another file, another version and (where the
        format ``completes``) half-written are each one ``VseError`` line naming ``path``. A symlink
        is opened at its target, so files beside it (a feature cache's shards) are found."""
        import h5py

        path = Path(path)
        if not path.is_file():
            raise VseError(f"{self.name} not found ({self.made_by} makes them)", path)
        try:
            f = h5py.File(path.resolve(), "r")
        except PermissionError:
            raise VseError(f"cannot read the {self.name} (permission denied)", path) from None
        except OSError:
            raise VseError("not a readable HDF5 file (truncated or another format)", path) from None
        try:
            attrs = {k: _plain(f.attrs[k]) for k in ("format", "format_version", "complete") if k in f.attrs}
            self.check(attrs, path)
            if self.completes and not attrs.get("complete"):
                raise VseError(f"{self.name} is not complete ({self.made_by} did not finish it)", path)
        except BaseException:
            f.close()
            raise
        return f


def _plain(value):
    """An HDF5 attribute as the Python value it stands for (bytes decoded, numpy scalars unwrapped),
    so comparisons hold and messages read plainly."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", None) == 0 else value


FEATURES = FileFormat("vse-features", 1, "a vse feature cache", "`vse extract`", "--features",
                      completes=True)
CAPTION_FEATURES = FileFormat("vse-caption-features", 1, "a vse caption-feature file", "`vse encode-text`",
                              "--text-features", completes=True)
RELEVANCE = FileFormat("vse-relevance", 1, "a vse relevance file", "`vse relevance`", "--relevance")
SVD_MODEL = FileFormat("vse-relevance-svd", 1, "a vse SVD relevance model", "`vse relevance --method svd`")
EMBEDDINGS = FileFormat("vse-embeddings", 1, "a vse embeddings file", "`vse embed`", completes=True)
SEARCH_INDEX = FileFormat("vse-index", 1, "a vse search index", "`vse index`", "--index")
VERSIONED = (FEATURES, CAPTION_FEATURES, RELEVANCE, SVD_MODEL, EMBEDDINGS, SEARCH_INDEX)
