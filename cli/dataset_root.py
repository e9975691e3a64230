"""The dataset options of `vse extract`, `vse train --rc`, `vse evaluate --root` and `vse relevance-human`,
defined once: ``--root`` and the csv layout options (``--csv-img-key`` … ``--split-seed``).

``--root`` is a dataset folder, or for ``--dataset karpathy`` the ``dataset_*.json`` file itself
(a folder holding exactly one also works), or for ``--dataset csv`` the CSV file. The value is passed
on as given: the reader of the chosen layout (``pipeline.data.readers.load_dataset``) decides what it
accepts and says why not in one line, so a missing path or a folder with several ``dataset_*.json``
is reported the same way from every command.
"""

from __future__ import annotations

import functools

import click

from pipeline.core.registry import READERS
from pipeline.data.readers.csv_layout import (
    CSV_SPLIT_KEY,
    CSV_SPLIT_RATIO,
    CSV_SPLIT_SEED,
    CsvLayout,
    option_flag,
)

ROOT_HELP = ("Dataset folder; for --dataset karpathy the dataset_*.json file itself (images are looked "
             "up next to it) or a folder holding exactly one; for --dataset csv the CSV file (image paths "
             "relative to its folder).")

# Files and folders both pass: which one a layout needs is the reader's decision.
DATASET_ROOT = click.Path(file_okay=True, dir_okay=True)


def root_option(*, required: bool = False, prefix: str = ""):
    """The ``--root`` click option; ``prefix`` says when it applies (e.g. ``"--rc: "``)."""
    return click.option("--root", type=DATASET_ROOT, required=required, default=None,
                        help=prefix + ROOT_HELP)


# Help of the csv options (``pipeline.data.readers.CsvLayout``'s fields, whose defaults they show).
CSV_OPTION_HELP = {
    "csv_img_key": f"--dataset csv: the image path column [default: {CsvLayout.csv_img_key}].",
    "csv_caption_key": f"--dataset csv: the caption column [default: {CsvLayout.csv_caption_key}].",
    "csv_separator": f"--dataset csv: the field separator, one character; \\t for TSV "
                     f"[default: {CsvLayout.csv_separator}].",
    "csv_split_key": f"--dataset csv: the split column, values train/dev/test (val = dev) [default: "
                     f"{CSV_SPLIT_KEY} when the file has it, else a seeded split; '' ignores the column].",
    "csv_id_key": "--dataset csv: an image id column (one id per image file) [default: the image path].",
    "split_ratio": "--dataset csv without a split column: train,dev,test shares of the seeded split, by "
                   f"image [default: {','.join(map(str, CSV_SPLIT_RATIO))}].",
    "split_seed": f"--dataset csv without a split column: seed of the split [default: {CSV_SPLIT_SEED}].",
}
CSV_OPTION_TYPES = {"split_seed": int}


def csv_option_decorators(names=READERS.option_names(), applies: str = "--dataset csv") -> list:
    """One click option per csv layout field, default None (= the layout's default): what
    ``csv_options`` adds, and what `vse train` can add as TrainConfig fields of the same names.
    ``names``: a subset; ``applies`` replaces "--dataset csv" in their help (`vse embed`)."""
    return [click.option(option_flag(name), name, type=CSV_OPTION_TYPES.get(name, str), default=None,
                         help=CSV_OPTION_HELP[name].replace("--dataset csv", applies))
            for name in names]


def csv_options(kind_param: str):
    """Adds the csv layout options to a command whose ``--dataset`` parameter is ``kind_param``;
    the command receives ``dataset_options`` (``load_dataset``'s options for that kind, from
    ``pipeline.data.readers.dataset_options``) in their place: a csv option given with another
    ``--dataset`` stops in one line."""

    def decorate(command):
        @functools.wraps(command)
        def with_dataset_options(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in READERS.option_names()}
            kwargs["dataset_options"] = READERS.reader_options(kwargs[kind_param], **values)
            return command(*args, **kwargs)

        for option in reversed(csv_option_decorators()):
            with_dataset_options = option(with_dataset_options)
        return with_dataset_options

    return decorate
