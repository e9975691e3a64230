"""`vse check-loss LOSS`: run the loss contract (pipeline.losses.check) on a built-in loss or a
user's own (FILE.py:Class, package.module:Class) and print a table; exit 1 if a check fails."""

from __future__ import annotations

import sys

import click

from cli.train_options import parse_key_values


@click.command("check-loss")
@click.argument("loss")
@click.option("--loss-option", "loss_option", multiple=True, callback=parse_key_values,
              help="A loss option, KEY=VALUE (JSON value), repeatable.")
@click.option("--no-distributed", is_flag=True, help="Skip the 2-process gloo check (spawns processes).")
@click.option("--seed", type=int, default=0, show_default=True)
def check_loss_command(loss, loss_option, no_distributed, seed):
    """Check that LOSS (a built-in name, FILE.py:Class or package.module:Class) keeps the loss
    contract: finite scalar, float64 gradcheck, same-image pairs never negatives, invariance
    to permuting the batch, 2 gloo processes = one process, and its speed at B = 128."""
    from pipeline.core.checks import format_results
    from pipeline.losses.check import run_contract

    results = run_contract(loss, loss_option, distributed=not no_distributed, seed=seed)
    click.echo(format_results(loss, results))
    if any(r.ok is False for r in results):
        sys.exit(1)
