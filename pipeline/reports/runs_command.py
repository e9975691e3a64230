"""`vse evaluate --runs`: one results row per run folder, as a table, and results.csv with
``--out`` (the other modes of `vse evaluate` are ``pipeline.evaluation.command``'s; this one reads
training's run folders, so it sits here). The CLI (cli/evaluate_cmd.py) checks the options and
calls ``evaluate_run_folders``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import VseError


class NoRunFolders(VseError):
    """The patterns match no run folder (the command line's mistake: the CLI says so as a usage error)."""


@dataclass
class RunsEvaluation:
    rows: list[dict]
    table: str                                       # the markdown table the command prints
    closing: list[str] = field(default_factory=list)  # the notes printed after the table


def evaluate_run_folders(patterns, device, *, split: str = "test", protocol: str = "single", features=None,
                         relevance=None, cs_ks=(), out=None, checkpoint_name: str = "best.pt", judgments=None,
                         overwrite: bool = False, text_features=None, average_with_runs=(),
                         keep_evaluated: bool = False, member: int | None = None, rescore=None,
                         echo: Callable[[str], None] = lambda _: None) -> RunsEvaluation:
    """Evaluate the checkpoint ``checkpoint_name`` of every run folder matching ``patterns``
    (``reports.batch_eval.evaluate_runs``), write the rows to ``out`` (checked before any
    evaluation; with ``keep_evaluated`` its rows of unchanged checkpoints are kept), and return the
    table with the notes that follow it; ``member``: each co-trained run's network of that index also
    gets its own row. Notes on the way go to ``echo``."""
    from pipeline.core import distributed
    from pipeline.core.fsutil import RESULTS_FORMAT, guard_output
    from pipeline.evaluation.evaluate import cs_note
    from pipeline.reports.batch_eval import evaluate_runs
    from pipeline.reports.report import format_results, read_results, write_results
    from pipeline.training.run_folder import find_runs

    if out:  # before hours of evaluation, not after
        guard_output(out, RESULTS_FORMAT, "a vse results table", overwrite)
    kept = read_results(out) if keep_evaluated and Path(out).is_file() else ()

    run_dirs = find_runs(patterns)
    if not run_dirs:
        raise NoRunFolders(f"no run folders match {' '.join(patterns)}")
    result = evaluate_runs(run_dirs, device=device, split=split, protocol=protocol, features=features,
                           relevance=relevance, cs_ks=cs_ks if relevance else (), checkpoint=checkpoint_name,
                           echo=echo, judgments=judgments.load() if judgments else None,
                           text_features=text_features, average_with=average_with_runs, kept=kept,
                           member=member, rescore=rescore)
    if not result.rows:
        raise VseError(f"none of the {len(run_dirs)} runs could be evaluated")
    if relevance:
        for note in dict.fromkeys(cs_note(cs_ks, row["images"], split) for row in result.rows):
            if note:
                echo(note)
    if out and distributed.is_main():
        write_results(result.rows, out)
    closing = []
    if judgments:
        first = result.rows[0]
        closing.append(f"judgments: {first['human_pairs']:.0f} judged pairs in the split, "
                       f"{first['human_unmatched']:.0f} outside it (left out)")
    summary = f"{len(result.rows)} of {len(run_dirs)} runs evaluated"
    if member is not None:
        summary = f"{len(result.rows)} rows from {len(run_dirs)} runs and network {member} of the co-trained"
    if keep_evaluated:
        summary += f" ({result.kept} kept from {out})"
    if average_with_runs:
        summary = f"{len(result.rows)} rows from {len(run_dirs)} runs, their partners and averages"
    if result.skipped:
        summary += f", {len(result.skipped)} skipped"
    closing.append(summary + (f" → {out}" if out else ""))
    return RunsEvaluation(result.rows, format_results(result.rows, "md", "human" if judgments else "recall"),
                          closing)
