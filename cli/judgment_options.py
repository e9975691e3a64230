"""The ``--judgments FILE --judgments-format F --judgments-threshold T`` options, shared by
`vse evaluate`, `vse gallery` and `vse relevance-human`: one ``judgments`` argument
(``pipeline.evaluation.judgments.JudgmentOptions`` or None)."""

from __future__ import annotations

import functools

import click

from pipeline.evaluation.judgments import DEFAULT_THRESHOLDS, FORMATS, JudgmentOptions


def judgment_options(command=None, *, required: bool = False):
    """Decorator: add the three options and pass them on as ``judgments=``."""
    if command is None:
        return functools.partial(judgment_options, required=required)

    @functools.wraps(command)
    def wrapper(*args, judgments_file=None, judgments_format=None, judgments_threshold=None, **kwargs):
        if judgments_file is None and (judgments_threshold is not None):
            raise click.UsageError("--judgments-threshold goes with --judgments FILE")
        spec = None if judgments_file is None else JudgmentOptions(judgments_file, judgments_format,
                                                                  judgments_threshold)
        return command(*args, judgments=spec, **kwargs)

    defaults = ", ".join(f"{name} {value}" for name, value in DEFAULT_THRESHOLDS.items())
    for option in reversed([
        click.option("--judgments", "judgments_file", type=click.Path(dir_okay=False), required=required,
                     help="Human judgments of (image, caption) pairs: adds agreement with people "
                          "(docs/PROTOCOL.md, Human judgments)."),
        click.option("--judgments-format", type=click.Choice(FORMATS), default=FORMATS[0], show_default=True,
                     help="flickr8k-crowdflower (CrowdFlowerAnnotations.txt), flickr8k-expert "
                          "(ExpertAnnotations.txt) or csv (image,caption_key,grade)."),
        click.option("--judgments-threshold", type=float, default=None,
                     help=f"Grade at or above which a pair counts as accepted (default: {defaults}; "
                          "csv: for grades in [0, 1])."),
    ]):
        wrapper = option(wrapper)
    return wrapper
