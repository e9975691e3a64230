"""`vse check-pool POOL`: run the set-pool contract (pipeline.networks.pool_check) on a built-in pool or
a user's own (FILE.py:Class, package.module:Class) and print a table; exit 1 if a check fails."""

from __future__ import annotations

import sys

import click

from cli.train_options import parse_key_values


@click.command("check-pool")
@click.argument("pool")
@click.option("--pool-option", "pool_option", multiple=True, callback=parse_key_values,
              help="A pool option, KEY=VALUE (JSON value), repeatable; the pool is built as "
                   "Class(dim=E, **options).")
@click.option("--sequence", is_flag=True,
              help="The pool reads caption tokens in order: permuting the members is reported, not "
                   "required to leave the output unchanged.")
@click.option("--seed", type=int, default=0, show_default=True)
def check_pool_command(pool, pool_option, sequence, seed):
    """Check that POOL (a built-in set pool, FILE.py:Class or package.module:Class) keeps the
    set-pool contract: output (B, E) for several K and E, padding ignored, a set alone = in
    the batch, invariance to permuting the members, gradient to every member and no padding,
    lengths 1 and K, finite for large inputs, and its speed at B = 128, K = 36, E = 1024."""
    from pipeline.core.checks import format_results
    from pipeline.networks.pool_check import run_pool_contract

    results = run_pool_contract(pool, pool_option, sequence=sequence, seed=seed)
    click.echo(format_results(pool, results, command="check-pool"))
    if any(r.ok is False for r in results):
        sys.exit(1)
