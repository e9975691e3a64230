"""`vse torchrun`: torchrun's elastic agent running a vse command on every process (training,
evaluation or extraction across nodes); a rendezvous that cannot be reached is one line."""

from __future__ import annotations

import sys

import click


class TorchrunCommand(click.Command):
    """Every argument after `vse torchrun` is torchrun's or the vse command's (but a first -h)."""

    ignore_unknown_options = True
    allow_interspersed_args = False


@click.command("torchrun", cls=TorchrunCommand, options_metavar="")
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED, metavar="[TORCHRUN OPTIONS] COMMAND [ARGS]...")
def torchrun_command(arguments):
    """torchrun's agent running a vse command on every process, across nodes.

    Exactly `torchrun [TORCHRUN OPTIONS] -m cli.main COMMAND [ARGS]` (torchrun's own agent,
    rendezvous and options; `torchrun --help` lists them), but a rendezvous that cannot be
    reached (no such host, a closed port, a node that never joins within the join timeout) stops
    in one line naming the endpoint, exit 1, before any process starts and so before any run
    folder is made. Example, the same command on each of two nodes:

    \b
    vse torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
      --rdzv-endpoint HOST0:29400 --rdzv-id f8k-sgr \\
      train --features cache/f8k_grid.h5 --network sgr --run-dir runs/sgr
    """
    from cli.main import COMMANDS
    from pipeline.training.torchrun import launch

    status = launch(list(arguments), [name for name in COMMANDS if name != "torchrun"])
    if status:
        sys.exit(status)
