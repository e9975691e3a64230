"""Entry point of the `vse` command: the click group and one-line error reporting."""

from __future__ import annotations

import sys

import click

from pipeline import __version__
from pipeline.errors import VseError


class VseGroup(click.Group):
    """A click group that turns ``VseError`` into one line on stderr and exit status 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VseError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


@click.group(cls=VseGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vse")
def cli():
    """Visual-semantic embedding toolkit: extract → relevance → train → evaluate → report."""


def _register() -> None:
    # Each module defines click commands and a `register(group)` function.
    from cli import (
        check_head_cmd,
        check_loss_cmd,
        compare_cmd,
        encode_text_cmd,
        evaluate_cmd,
        extract_cmd,
        relevance_cmd,
        report_cmd,
        search_cmd,
        train_cmd,
    )

    for module in (extract_cmd, train_cmd, evaluate_cmd, relevance_cmd, report_cmd, compare_cmd,
                   check_loss_cmd, check_head_cmd, encode_text_cmd, search_cmd):
        module.register(cli)


_register()


def main() -> None:  # console_scripts entry point
    cli()


if __name__ == "__main__":
    main()
