"""The ``--rescore NAME --rescore-option NAME.KEY=VALUE --rescore-bank-split SPLIT --rescore-bank-size N
--rescore-index KIND --transductive`` options, shared by `vse evaluate` and `vse compare`: one
``rescore`` argument (``RescoreArgs``), whose ``plan(split)`` is the checked plan
(``pipeline.evaluation.rescore.plan_rescore``) or None without --rescore."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import click

from cli.train_options import parse_key_values
from pipeline.core.registry import RESCORERS

OTHERS = "--rescore-option, --rescore-bank-split, --rescore-bank-size, --rescore-index and --transductive"


@dataclass(frozen=True)
class RescoreArgs:
    """The six options as given."""

    names: tuple = ()
    options: dict = field(default_factory=dict)
    bank_split: str | None = None
    bank_size: int | None = None
    transductive: bool = False
    index: str | None = None

    def __bool__(self) -> bool:
        return bool(self.names)

    def plan(self, split: str, refused: str | None = None):
        """The checked plan of the evaluated ``split``, or None without --rescore (its other options are
        then a usage error); ``refused``: the usage error to raise when --rescore is given (it does not
        go with the command's mode)."""
        if not self.names:
            if self.options or self.bank_size or self.bank_split or self.transductive or self.index:
                raise click.UsageError(f"{OTHERS} go with --rescore NAME")
            return None
        if refused:
            raise click.UsageError(refused)
        from pipeline.evaluation.rescore import BANK_SPLIT, plan_rescore
        from pipeline.evaluation.rescore_bank import BANK_INDEX

        return plan_rescore(self.names, self.options, split=split, bank_split=self.bank_split or BANK_SPLIT,
                            bank_size=self.bank_size, transductive=self.transductive,
                            index=self.index or BANK_INDEX)


def rescore_options(help: str):
    """Decorator: add the six options (``help``: what --rescore does in this command) and pass them on
    as ``rescore=RescoreArgs(...)``."""

    def decorate(command):
        @functools.wraps(command)
        def wrapper(*args, rescore_names=(), rescore_option=(), rescore_bank_split=None,
                    rescore_bank_size=None, transductive=False, rescore_index=None, **kwargs):
            given = RescoreArgs(tuple(rescore_names), dict(rescore_option or ()), rescore_bank_split,
                                rescore_bank_size, transductive, rescore_index)
            return command(*args, rescore=given, **kwargs)

        for option in reversed([
            click.option("--rescore", "rescore_names", multiple=True, metavar="NAME",
                         help=f"{help} ({', '.join(RESCORERS.names)}), repeatable (docs/PROTOCOL.md, "
                              "'Re-scoring at test time')."),
            click.option("--rescore-option", "rescore_option", multiple=True, callback=parse_key_values,
                         metavar="NAME.KEY=VALUE",
                         help="--rescore: a method's option (JSON value), repeatable; KEY=VALUE with one "
                              "method."),
            click.option("--rescore-bank-split", default=None,
                         help="--rescore: the split whose embeddings form the reference bank (default: the "
                              "training split; never the evaluated split without --transductive)."),
            click.option("--rescore-bank-size", type=click.IntRange(min=1), default=None,
                         help="--rescore: the bank's first N images of its split and their captions "
                              "(default: all)."),
            click.option("--rescore-index", default=None, metavar="KIND",
                         help="--rescore: the FAISS index of csls's and nnn's k-NN over a dual network's "
                              "bank (default: exact; the approximate ones, recorded with the result, and "
                              "their parameters: docs/PROTOCOL.md, 'Cost')."),
            click.option("--transductive", is_flag=True,
                         help="--rescore: allow corrections that read the test queries themselves (dsl, or a "
                              "bank of the evaluated split); recorded with the result."),
        ]):
            wrapper = option(wrapper)
        return wrapper

    return decorate
