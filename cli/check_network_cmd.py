"""`vse check-network NETWORK`: run the network contract of its kind (pipeline.networks.network_check) on
a built-in network or a user's own (FILE.py:Class), dual or pairwise, and print a table; exit 1 if a
check fails."""

from __future__ import annotations

import sys

import click

from cli.train_options import parse_key_values


@click.command("check-network")
@click.argument("network")
@click.option("--network-option", "network_option", multiple=True, callback=parse_key_values,
              help="An option of the network, NAME=VALUE (JSON value), repeatable.")
@click.option("--words", is_flag=True, help="Captions as word ids (the network's own word encoder) "
                                            "instead of cached token vectors (VSE's own model: always).")
@click.option("--seed", type=int, default=0, show_default=True)
def check_network_command(network, network_option, words, seed):
    """Check that NETWORK (a built-in name, or your own FILE.py:Class) keeps the contract of its
    kind. Pairwise: a (B, B) score matrix and (Bi, Bc) blocks, blocks equal to pairs scored alone.
    Dual: (B, E) embeddings of both sides, each row equal to its item embedded alone. Both: padding
    never read, the batch order not mattering, finite gradients to every parameter, the same scores
    after a state dict round trip, and its ms per training step."""
    from pipeline.core.checks import format_results
    from pipeline.networks.network_check import run_network_contract

    results = run_network_contract(network, network_option, words=words, seed=seed)
    click.echo(format_results(network, results, command="check-network"))
    if any(r.ok is False for r in results):
        sys.exit(1)
