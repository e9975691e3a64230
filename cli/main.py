"""Entry point of the `vse` command: the click group and one-line error reporting."""

from __future__ import annotations

import importlib
import sys
from collections.abc import MutableMapping

import click

from pipeline import __version__
from pipeline.core.errors import VseError

# Old command names kept for one version: old → new (a note on stderr says so when one is used).
ALIASES = {"check-head": "check-pool"}


class VseGroup(click.Group):
    """A click group that turns ``VseError`` (and an exception raised inside a user's plug-in:
    ``plugin_import.user_code_error``) into one line on stderr and exit status 1, and takes the
    old names of ``ALIASES``."""

    def get_command(self, ctx, name):
        if name in ALIASES:
            click.echo(f"note: `vse {name}` is now `vse {ALIASES[name]}`; the old name goes in the next "
                       "version", err=True)
            name = ALIASES[name]
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VseError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except Exception as exc:  # the user's plug-in raised it: one line; a bug of vse: its traceback
            from pipeline.core.plugin_import import user_code_error

            error = user_code_error(exc)
            if error is None:
                raise
            click.echo(f"error: {error}", err=True)
            sys.exit(1)


# Every command: name → "module:attribute". A command's module is imported only when the
# command is run or its help is shown (click's lazily loaded subcommands), so `vse train --help`
# reads no torch, and a broken optional dependency of one command never stops the others.
COMMANDS = {
    "extract": "cli.extract_cmd:extract_command",
    "info": "cli.extract_cmd:info_command",
    "encode-text": "cli.encode_text_cmd:encode_text",
    "relevance": "cli.relevance_cmd:relevance",
    "relevance-human": "cli.relevance_cmd:relevance_human",
    "train": "cli.train_cmd:train_command",
    "sweep": "cli.sweep_cmd:sweep_command",
    "tune": "cli.tune_cmd:tune_command",
    "torchrun": "cli.torchrun_cmd:torchrun_command",
    "evaluate": "cli.evaluate_cmd:evaluate_command",
    "report": "cli.report_cmd:report_command",
    "compare": "cli.compare_cmd:compare_command",
    "claims": "cli.claims_cmd:claims_command",
    "plot": "cli.report_cmd:plot_command",
    "gallery": "cli.report_cmd:gallery_command",
    "check-loss": "cli.check_loss_cmd:check_loss_command",
    "check-pool": "cli.check_pool_cmd:check_pool_command",
    "check-network": "cli.check_network_cmd:check_network_command",
    "noise-index": "cli.noise_index_cmd:noise_index_command",
    "embed": "cli.embed_cmd:embed_command",
    "index": "cli.search_cmd:index",
    "search": "cli.search_cmd:search",
    "serve": "cli.search_cmd:serve",
}


class LazyCommands(MutableMapping):
    """The group's commands, each imported on first access from its ``"module:attribute"``."""

    def __init__(self, specs: dict):
        self._specs, self._loaded = dict(specs), {}

    def __getitem__(self, name):
        if name not in self._loaded:
            module, _, attribute = self._specs[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), attribute)
        return self._loaded[name]

    def __setitem__(self, name, command):
        self._specs.setdefault(name, "")
        self._loaded[name] = command

    def __delitem__(self, name):
        del self._specs[name]
        self._loaded.pop(name, None)

    def __iter__(self):
        return iter(self._specs)

    def __len__(self):
        return len(self._specs)


@click.group(cls=VseGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vse")
def cli():
    """Visual-semantic embedding toolkit: extract → relevance → train → evaluate → report."""


cli.commands = LazyCommands(COMMANDS)


def main() -> None:  # console_scripts entry point
    cli()


if __name__ == "__main__":
    main()
