"""The options of the ``csv`` reader (``CsvLayout``): which columns, which separator, which split.
Torch- and numpy-free, so option parsing (``core.config``, ``--help``) reads them cheaply. They are
declared as every part's options are (``values.declare`` fields, checked by
``values.declared_options`` through ``READERS.reader_options``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pipeline.core.errors import VseError
from pipeline.core.values import checked_option, declare, option_facts, option_types

CSV_SPLITS = ("train", "dev", "test")
# A split column's values: train/dev/test, and "val" for dev as in Karpathy's files.
CSV_SPLIT_VALUES = {**{s: s for s in CSV_SPLITS}, "val": "dev"}
CSV_SPLIT_KEY = "split"            # the split column read when the file has one
CSV_SPLIT_RATIO = (0.8, 0.1, 0.1)  # train/dev/test shares of a seeded split, by image
CSV_SPLIT_SEED = 0


@dataclass(frozen=True)
class CsvLayout:
    """How a ``csv`` dataset file is read: open_clip's CSV convention (an image path column,
    a caption column, a separator), with a split column or else a seeded split by image.

    Field names are the command-line options' (``--csv-img-key`` → ``csv_img_key``) and those
    of the feature-cache attributes `vse extract` records them in.  ``None`` is the default
    behaviour; a value given is a demand: a named split or id column must exist, and a split
    ratio or seed is refused for a file whose split column is read.
    """

    csv_img_key: str = declare("filepath", "The image path column (paths relative to the CSV's folder).")
    csv_caption_key: str = declare("title", "The caption column.")
    csv_separator: str = declare(",", "One character; \"\\t\" (backslash t) or \"tab\" for TSV.")
    csv_split_key: str | None = declare(None, "None: CSV_SPLIT_KEY when the file has it; \"\": no column.")
    csv_id_key: str | None = declare(None, "None: the image path is the image id.")
    # "0.8,0.1,0.1" or three numbers, kept as a tuple; None: CSV_SPLIT_RATIO
    split_ratio: str | list | tuple | None = declare(None, "Train, dev, test shares of a seeded split.")
    split_seed: int | None = declare(None, "The seed of a seeded split; None: CSV_SPLIT_SEED.", low=0)

    def __post_init__(self):
        hints = option_types(CsvLayout)
        for field_ in fields(self):  # the declared types and ranges, for a layout built directly too
            try:
                checked_option(option_flag(field_.name), getattr(self, field_.name), hints[field_.name],
                               option_facts(field_))
            except ValueError as exc:
                raise VseError(str(exc)) from None
        for name in ("csv_img_key", "csv_caption_key"):
            value = getattr(self, name)
            if not value.strip():
                raise VseError(f"{option_flag(name)} must name a column, got {value!r}")
            object.__setattr__(self, name, value.strip())
        for name in ("csv_split_key", "csv_id_key"):
            value = getattr(self, name)
            if value is not None:
                value = value.strip()
                object.__setattr__(self, name, value if value or name == "csv_split_key" else None)
        if self.csv_img_key == self.csv_caption_key:
            raise VseError(f"--csv-img-key and --csv-caption-key name the same column {self.csv_img_key!r}")
        separator = self.csv_separator
        separator = {"\\t": "\t", "tab": "\t"}.get(separator, separator)
        if len(separator) != 1 or separator in '"\r\n' or separator.isalnum():
            raise VseError("--csv-separator must be one character other than a letter, digit, quote or "
                           f"line break (\\t for TSV), got {self.csv_separator!r}")
        object.__setattr__(self, "csv_separator", separator)
        if self.split_ratio is not None:
            object.__setattr__(self, "split_ratio", parse_split_ratio(self.split_ratio))

    @property
    def seeded_split(self) -> tuple[tuple[float, float, float], int]:
        """The ratio and seed of a seeded split (the defaults where none was given)."""
        return (self.split_ratio or CSV_SPLIT_RATIO,
                CSV_SPLIT_SEED if self.split_seed is None else self.split_seed)


def option_flag(name: str) -> str:
    """The command-line flag of a reader option: ``csv_img_key`` → ``--csv-img-key``."""
    return "--" + name.replace("_", "-")


def parse_split_ratio(value) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` (or three numbers) → train/dev/test shares: each at least 0, train
    above 0, summing to 1 (within 1e-6; a sum of 1.1 is a typo, not a ratio to rescale)."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        shares = tuple(float(p) for p in parts)
    except (TypeError, ValueError):
        shares = ()
    problem = None
    if len(shares) != 3:
        problem = "give three numbers train,dev,test"
    elif not all(math.isfinite(s) and s >= 0 for s in shares):
        problem = "shares must be finite and at least 0"
    elif shares[0] == 0:
        problem = "the train share must be above 0"
    elif abs(sum(shares) - 1) > 1e-6:
        problem = f"shares must sum to 1, these sum to {sum(shares):g}"
    if problem:
        raise VseError(f"--split-ratio {value if isinstance(value, str) else list(value)!r}: {problem} "
                       "(e.g. 0.8,0.1,0.1)")
    return shares
