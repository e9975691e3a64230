"""The vse file formats that carry a version: one table, one check.

Each file vse writes for another command to read carries ``format`` (a tag) and
``format_version``: an HDF5 file in its attributes, a pickle or a folder's ``meta.json`` as
leading items. ``FileFormat.check`` is the one comparison every reader makes, so each refusal
says the same two things: what the file is not, and which command makes it.
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


FEATURES = FileFormat("vse-features", 1, "a vse feature cache", "`vse extract`", "--features")
CAPTION_FEATURES = FileFormat("vse-caption-features", 1, "a vse caption-feature file", "`vse encode-text`",
                              "--text-features")
RELEVANCE = FileFormat("vse-relevance", 1, "a vse relevance file", "`vse relevance`", "--relevance")
SVD_MODEL = FileFormat("vse-relevance-svd", 1, "a vse SVD relevance model", "`vse relevance --method svd`")
EMBEDDINGS = FileFormat("vse-embeddings", 1, "a vse embeddings file", "`vse embed`")
SEARCH_INDEX = FileFormat("vse-index", 1, "a vse search index", "`vse index`", "--index")
VERSIONED = (FEATURES, CAPTION_FEATURES, RELEVANCE, SVD_MODEL, EMBEDDINGS, SEARCH_INDEX)
