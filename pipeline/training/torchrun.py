"""`vse torchrun`: torchrun's own elastic agent (``torch.distributed.run``) running a vse command on
every process, its failures in one line.

The agent, its rendezvous and its workers are torchrun's, untouched (vse has no rendezvous of its
own): this module parses torchrun's own options with torchrun's own parser, points the workers at
``python -m cli.main COMMAND …`` and calls ``torch.distributed.run.run``. What it adds is what a
failure prints: a rendezvous that cannot be reached (no such host, a closed port, a peer that never
joins within the join timeout) is one ``VseError`` line naming the endpoint, raised before any
worker starts, so no run folder is made, let alone claimed; a worker that fails is summed up in one
line unless it said why itself (``SAID_WHY``). torchrun's own notes on its options are shown once
the nodes have met, and dropped when they never do. The agent's C++ log lines (a retried connection,
with a C++ stack, on every try) are hidden unless ``TORCH_CPP_LOG_LEVEL`` is set; the workers keep
their own setting.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection

from pipeline.core.errors import VseError

CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"
WORKER_MODULE = "cli.main"  # what each worker runs: python -u -m cli.main COMMAND ARGS
# a worker's exit statuses that come with its own words on stderr: 1, vse's one-line error (or a
# traceback); 2, click's usage error
SAID_WHY = (1, 2)
# torchrun's notes on its options (OMP_NUM_THREADS set to 1 for each process, --node-rank ignored
# with c10d, …), logged before the rendezvous: held until the agent logs that the nodes have met
# (at INFO, which the agent's logger is opened to for that record alone), dropped if they never do
RUN_LOGGER = "torch.distributed.run"
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
RENDEZVOUS_DONE = "Rendezvous complete"


def _import_torchrun():
    """``torch.distributed.run``, imported with the agent's C++ log lines hidden (c10 reads the level
    once, when torch loads; a process that loaded torch already keeps its level). The variable is
    put back at once, so the workers, which inherit this environment, log as the user asked."""
    given = os.environ.get(CPP_LOG_LEVEL)
    if given is None:
        os.environ[CPP_LOG_LEVEL] = "FATAL"
    try:
        import torch.distributed.run as torchrun
    finally:
        if given is None:
            os.environ.pop(CPP_LOG_LEVEL, None)
    return torchrun


def parse(arguments: list[str], commands: Collection[str]):
    """torchrun's options and the vse command after them, by torchrun's own parser; the workers run
    ``python -u -m cli.main COMMAND ARGS``. A bad option or a missing or unknown command: one line."""
    torchrun = _import_torchrun()
    parser = torchrun.get_args_parser()
    parser.prog = "vse torchrun"

    def refuse(message: str):
        if "training_script" in message:  # argparse's name for the command torchrun runs
            message = "no vse command given"
        raise VseError(f"vse torchrun: {message} (torchrun's options, then a vse command: "
                       "vse torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT train …)")

    parser.error = refuse
    args = parser.parse_args(arguments)
    if args.module or args.no_python or args.run_path:
        refuse("-m, --no-python and --run-path are not for vse torchrun, which runs a vse command")
    if args.training_script not in commands:
        refuse(f"{args.training_script!r} is not a vse command")
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.training_script, args.module = WORKER_MODULE, True
    return args


def endpoint_of(args, torchrun) -> str:
    """The options that name the rendezvous endpoint, with the values torchrun resolved."""
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        return f"--master-addr {args.master_addr} --master-port {args.master_port}"
    return f"--rdzv-endpoint {torchrun.get_rdzv_endpoint(args)}"


def _join_timeout(args, torchrun) -> str:
    """The join timeout in force: --rdzv-conf join_timeout, else torchrun's default."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    given = torchrun._parse_rendezvous_config(args.rdzv_conf).get("join_timeout")
    seconds = given if given is not None else f"{RendezvousTimeout().join.total_seconds():.0f}"
    return f"{seconds} s"


def rendezvous_line(error: BaseException, args, torchrun) -> str:
    """One line for a rendezvous that failed: the endpoint, the problem, the remedy."""
    from torch.distributed.elastic.rendezvous import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    named = f" {args.rdzv_id!r}" if args.rdzv_id != "none" else ""  # torchrun's default id: "none"
    where = f"{endpoint_of(args, torchrun)}: the {args.rdzv_backend} rendezvous{named}"
    cause = error.__cause__ if error.__cause__ is not None else error
    lines = str(cause).strip().splitlines()
    detail = lines[0].rstrip(".") if lines else type(cause).__name__
    if isinstance(error, RendezvousTimeoutError):
        return (f"{where} did not complete: not all of --nnodes {args.nnodes} joined within the join "
                f"timeout of {_join_timeout(args, torchrun)}; start torchrun on every node with the same "
                "--rdzv-endpoint and --rdzv-id (or give --rdzv-conf join_timeout=SECONDS)")
    if isinstance(error, RendezvousClosedError):
        return f"{where} is closed (a node of it has ended); give a new --rdzv-id"
    if isinstance(error, RendezvousConnectionError):
        return (f"{where} cannot be reached ({detail}); check the host name and the port, and that the "
                "first node's torchrun is running there")
    # the static rendezvous, or a store lost: torch's network error itself
    return f"{where} failed ({type(cause).__name__}: {detail})"


def failed_workers_line(error, command: str) -> str | None:
    """One line for workers that failed without saying why (a signal, an exit status not in
    ``SAID_WHY``); None when every failed worker printed why itself."""
    failures = sorted(error.failures.items())
    silent = [(rank, failure) for rank, failure in failures if failure.exitcode not in SAID_WHY]
    if not silent:
        return None
    rank, failure = silent[0]
    how = (f"was killed by {failure.signal_name()}" if failure.exitcode < 0
           else f"exited with status {failure.exitcode}")
    return (f"vse {command} under torchrun: rank {rank} (pid {failure.pid}) {how}"
            f"{f'; {len(failures)} of the ranks failed' if len(failures) > 1 else ''}")


@contextlib.contextmanager
def notes_held_until_rendezvous():
    """Hold torchrun's own log records until the rendezvous completes; yields the held list (a
    failed rendezvous clears it). Whatever is still held at the end is shown then."""
    run_logger, agent_logger = logging.getLogger(RUN_LOGGER), logging.getLogger(AGENT_LOGGER)
    agent_level, shown = agent_logger.level, agent_logger.getEffectiveLevel()
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    def release() -> None:
        run_logger.removeFilter(hold)
        for record in held:
            run_logger.handle(record)
        held.clear()

    def watch(record: logging.LogRecord) -> bool:
        if RENDEZVOUS_DONE in str(record.msg):
            release()
        return record.levelno >= shown  # the agent's own records as its level says

    run_logger.addFilter(hold)
    agent_logger.addFilter(watch)
    agent_logger.setLevel(min(shown, logging.INFO))
    try:
        yield held
    finally:
        agent_logger.setLevel(agent_level)
        agent_logger.removeFilter(watch)
        release()


def launch(arguments: list[str], commands: Collection[str]) -> int:
    """Run torchrun's elastic agent on ``arguments`` (torchrun's options, then a vse command and its
    arguments) until every worker is done: 0, or 1 when workers failed and printed why themselves; a
    failure of the rendezvous, or of a worker that said nothing, is a ``VseError``."""
    args = parse(arguments, commands)  # imports torch first, with the agent's C++ log lines hidden
    torchrun = _import_torchrun()
    from torch.distributed import DistNetworkError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    command = args.training_script_args[0]
    with notes_held_until_rendezvous() as notes:
        try:
            torchrun.run(args)
            return 0
        except (RendezvousError, DistNetworkError) as error:
            notes.clear()  # the one line says it all
            raise VseError(rendezvous_line(error, args, torchrun)) from None
        except ChildFailedError as error:
            line = failed_workers_line(error, command)
            if line is None:
                return 1
            raise VseError(line) from None
