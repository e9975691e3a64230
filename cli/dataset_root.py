"""The ``--root`` option of `vse extract`, `vse train --rc` and `vse evaluate --root`, defined once.

``--root`` is a dataset folder, or for ``--dataset karpathy`` the ``dataset_*.json`` file itself
(a folder holding exactly one also works). The value is passed on as given: the reader of the
chosen layout (``pipeline.datasets.load_dataset``) decides what it accepts and says why not in
one line, so a missing path or a folder with several ``dataset_*.json`` is reported the same way
from every command.
"""

from __future__ import annotations

import click

ROOT_HELP = ("Dataset folder; for --dataset karpathy the dataset_*.json file itself (images are looked "
             "up next to it) or a folder holding exactly one.")

# Files and folders both pass: which one a layout needs is the reader's decision.
DATASET_ROOT = click.Path(file_okay=True, dir_okay=True)


def root_option(*, required: bool = False, prefix: str = ""):
    """The ``--root`` click option; ``prefix`` says when it applies (e.g. ``"--rc: "``)."""
    return click.option("--root", type=DATASET_ROOT, required=required, default=None,
                        help=prefix + ROOT_HELP)
