"""Human judgment files: the readers of the three formats (``FORMATS``).

- ``flickr8k-crowdflower``: ``<image>\\t<image'>#<n>\\t<fraction yes>\\t<yes>\\t<no>`` (Hodosh
  et al. 2013). Grade = yes / (yes + no); accepted when the grade >= 0.5 (default).
- ``flickr8k-expert``: ``<image>\\t<image'>#<n>\\t<g1>\\t<g2>\\t<g3>``, three expert grades 1-4.
  Grade = their mean; gain (NDCG) = (grade - 1) / 3; accepted when the mean >= 3 (default).
- ``csv``: header ``image,caption_key,grade``; gain = grade (>= 0); accepted when the grade
  >= the threshold (0.5 by default when every grade lies in [0, 1], else required).

The caption key ``<image>#<n>`` names caption n of an image as ``Flickr8k.token.txt`` does
(``pipeline.data.caption_index.caption_keys``). A bad row is a one-line ``VseError`` naming file and line.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError

FORMATS = ("flickr8k-crowdflower", "flickr8k-expert", "csv")
# The grade at or above which people "accepted" a pair, per format (csv: for grades in [0, 1]).
DEFAULT_THRESHOLDS = {"flickr8k-crowdflower": 0.5, "flickr8k-expert": 3.0, "csv": 0.5}
EXPERT_GRADES = (1, 4)
CSV_HEADER = ("image", "caption_key", "grade")


@dataclass
class Judgments:
    """Judged pairs in file order: ``image_ids[i]`` judged against caption ``caption_keys[i]``
    with ``grades[i]`` (the file's scale), ``gains[i]`` (NDCG gain, >= 0) and ``lines[i]``."""

    path: Path
    format: str
    image_ids: list[str]
    caption_keys: list[str]
    grades: np.ndarray
    gains: np.ndarray
    lines: np.ndarray
    threshold: float

    @property
    def accepted(self) -> np.ndarray:
        return self.grades >= self.threshold

    def __len__(self) -> int:
        return len(self.image_ids)


def read_judgments(path, fmt: str = "flickr8k-crowdflower", threshold: float | None = None) -> Judgments:
    """Read a judgment file; a bad row is a one-line ``VseError`` naming the file and line."""
    path = Path(path)
    if fmt not in FORMATS:
        raise VseError(f"unknown judgments format {fmt!r} (expected {', '.join(FORMATS)})", path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise VseError("judgments file not found", path) from None
    except IsADirectoryError:
        raise VseError("is a folder, not a judgments file", path) from None
    except UnicodeDecodeError as exc:
        raise VseError(f"not UTF-8 text (byte {exc.start})", path) from None
    rows = _csv_rows(text, path) if fmt == "csv" else _tab_rows(text, fmt, path)
    if not rows:
        raise VseError("no judged pairs in the file", path)
    seen: dict[tuple[str, str], int] = {}
    for lineno, image, key, _, _ in rows:
        first = seen.setdefault((image, key), lineno)
        if first != lineno:
            raise VseError(f"line {lineno}: pair {image} / {key} is already judged on line {first}", path)
    grades = np.array([r[3] for r in rows], dtype=np.float64)
    if threshold is None:
        threshold = DEFAULT_THRESHOLDS[fmt]
        if fmt == "csv" and grades.max() > 1:
            raise VseError("grades go beyond 1: say which grade counts as accepted "
                           "(--judgments-threshold)", path)
    if not math.isfinite(threshold):
        raise VseError(f"the acceptance threshold must be a finite number, not {threshold}", path)
    return Judgments(path, fmt, [r[1] for r in rows], [r[2] for r in rows], grades,
                     np.array([r[4] for r in rows], dtype=np.float64),
                     np.array([r[0] for r in rows], dtype=np.int64), float(threshold))


def _tab_rows(text: str, fmt: str, path: Path) -> list[tuple]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 5:
            raise VseError(f"line {lineno}: expected 5 tab-separated fields "
                           f"(image, caption key, 3 numbers), found {len(fields)}", path)
        image, key = fields[0], fields[1]
        _check_pair(image, key, lineno, path)
        if fmt == "flickr8k-crowdflower":
            fraction = _number(fields[2], "fraction yes", lineno, path)
            yes, no = (_count(f, what, lineno, path) for f, what in ((fields[3], "yes"), (fields[4], "no")))
            if yes + no == 0:
                raise VseError(f"line {lineno}: no votes (0 yes, 0 no)", path)
            grade = yes / (yes + no)
            if abs(fraction - grade) > 1e-3:
                raise VseError(f"line {lineno}: fraction yes {fields[2]} disagrees with "
                               f"{yes} yes / {no} no", path)
            rows.append((lineno, image, key, grade, grade))
        else:
            marks = [_count(f, "expert grade", lineno, path) for f in fields[2:]]
            low, high = EXPERT_GRADES
            if not all(low <= g <= high for g in marks):
                raise VseError(f"line {lineno}: expert grades must be {low}-{high}, found "
                               f"{' '.join(fields[2:])}", path)
            grade = sum(marks) / 3
            rows.append((lineno, image, key, grade, (grade - low) / (high - low)))
    return rows


def _csv_rows(text: str, path: Path) -> list[tuple]:
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
            raise VseError(f"line 1: expected the header {','.join(CSV_HEADER)}, found "
                           f"{','.join(header or [])!r}", path)
        rows = []
        for fields in reader:
            lineno = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != 3:
                raise VseError(f"line {lineno}: expected 3 fields (image, caption_key, grade), "
                               f"found {len(fields)}", path)
            image, key = fields[0].strip(), fields[1].strip()
            _check_pair(image, key, lineno, path)
            grade = _number(fields[2], "grade", lineno, path)
            if grade < 0:
                raise VseError(f"line {lineno}: grade {fields[2].strip()} is negative (gains are >= 0)", path)
            rows.append((lineno, image, key, grade, grade))
    except csv.Error as exc:
        raise VseError(f"line {reader.line_num}: {exc}", path) from None
    return rows


def _check_pair(image: str, key: str, lineno: int, path: Path) -> None:
    name, hash_sign, number = key.rpartition("#")
    if not image:
        raise VseError(f"line {lineno}: empty image id", path)
    if not hash_sign or not name or not number.isdigit():
        raise VseError(f"line {lineno}: caption key {key!r} is not <image>#<n>", path)


def _number(text: str, what: str, lineno: int, path: Path) -> float:
    try:
        value = float(text)
    except ValueError:
        raise VseError(f"line {lineno}: {what} {text.strip()!r} is not a number", path) from None
    if not math.isfinite(value):
        raise VseError(f"line {lineno}: {what} {text.strip()!r} is not finite", path)
    return value


def _count(text: str, what: str, lineno: int, path: Path) -> int:
    text = text.strip()
    if not text.isdigit():
        raise VseError(f"line {lineno}: {what} {text!r} is not a non-negative integer", path)
    return int(text)


@dataclass(frozen=True)
class JudgmentOptions:
    """What the user asked for: ``--judgments FILE --judgments-format F --judgments-threshold T``."""

    path: str
    format: str = "flickr8k-crowdflower"
    threshold: float | None = None

    def load(self) -> Judgments:
        return read_judgments(self.path, self.format, self.threshold)
