"""`vse evaluate`: metrics of saved embeddings, of a trained checkpoint, of a shortlist re-ranked, or of
many run folders. This file parses the options and checks which go together; each mode is one
library call (pipeline.evaluation.command; --runs: pipeline.reports.runs_command)."""

from __future__ import annotations

import click

from cli.dataset_root import csv_options, root_option
from cli.judgment_options import judgment_options
from cli.rescore_options import rescore_options
from pipeline.core.registry import IMAGE_DATASET_KINDS
from pipeline.data.readers.csv_layout import CsvLayout


def _parse_ks(ctx, param, value):
    if not value:
        return ()
    try:
        return tuple(int(k) for k in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


@click.command("evaluate")
@click.option("--embeddings", type=click.Path(dir_okay=False),
              help="npz with images (N×D) and captions (5N×D).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), help="A run's best.pt / last.pt.")
@click.option("--average-with", "average_with", multiple=True, type=click.Path(dir_okay=False),
              help="--checkpoint: average its split scores with these checkpoints' (repeatable), e.g. "
                   "SGRAF = the mean of an SGR and an SAF checkpoint's scores.")
@click.option("--member", type=click.IntRange(min=0), default=None, metavar="K",
              help="A checkpoint of networks trained together (ncr): evaluate its network K alone (an "
                   "ensemble of 1) instead of the mean of their scores; with --runs each such run's network "
                   "K gets its own row (its name ',member=K') beside the run's (docs/PROTOCOL.md, 'Ensemble "
                   "size').")
@click.option("--shortlist", type=click.Path(dir_okay=False),
              help="--checkpoint of a pairwise network: re-rank this dual checkpoint's top --shortlist-k of "
                   "each query instead of scoring every pair (docs/PROTOCOL.md, 'Re-ranking a shortlist').")
@click.option("--shortlist-features", type=click.Path(dir_okay=False),
              help="--shortlist: the feature cache of the dual checkpoint (default: --features).")
@click.option("--shortlist-k", type=click.IntRange(min=1), default=100, show_default=True,
              help="--shortlist: candidates per query that the pairwise network scores.")
@click.option("--runs", "run_patterns", multiple=True,
              help="Run folders (glob, quoted: 'runs/*'), repeatable: one results row per run.")
@click.option("--average-with-runs", "average_with_runs", multiple=True,
              type=click.Path(file_okay=False, exists=True),
              help="--runs: also average each run's scores with the run of the same folder name in this "
                   "folder (repeatable), e.g. an SGR sweep with an SAF sweep = the SGRAF rows; the "
                   "partner's row and the averaged row ('A + B') follow each run's.")
@click.option("--features", type=click.Path(dir_okay=False),
              help="Feature cache for --checkpoint (for --runs: default the cache each run trained on).")
@root_option(prefix="RC checkpoint (--rc run): embed this dataset's images with the run's own CNN. ")
@click.option("--dataset", "dataset_kind", type=click.Choice(IMAGE_DATASET_KINDS), default="flickr8k",
              show_default=True, help="--root: its layout.")
@csv_options("dataset_kind")
@click.option("--text-features", type=click.Path(dir_okay=False), default=None,
              help="Caption-feature file for a run trained with --text-features (default: the one it names).")
@click.option("--split", default="test", show_default=True)
@click.option("--protocol", type=click.Choice(["single", "5fold", "5k"]), default="single", show_default=True,
              help="single: all at once; 5fold: COCO 1K (mean of 5 folds); 5k: COCO 5K.")
@click.option("--order", is_flag=True, help="--embeddings are order embeddings (order similarity).")
@click.option("--relevance", type=click.Path(dir_okay=False), default=None, help="Relevance file: adds CS@K.")
@click.option("--cs", "cs_ks", callback=_parse_ks, default="100,1000", show_default=True,
              help="K values of CS@K.")
@click.option("--device", default="auto", show_default=True)
@click.option("--amp/--no-amp", default=False, show_default=True,
              help="--checkpoint: embed with mixed precision on a GPU (faster; scores then differ from "
                   "the CPU's in the last digits). Default: full fp32, no TF32.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="--runs: write results.csv here.")
@click.option("--checkpoint-name", default="best.pt", show_default=True,
              help="--runs: which checkpoint of each run.")
@judgment_options
@click.option("--overwrite", is_flag=True, help="--out: replace a file that is not a vse results table.")
@rescore_options("--checkpoint or --runs: also evaluate the scores re-scored against hubness by NAME, each "
                 "its own row")
@click.option("--keep-evaluated", is_flag=True,
              help="--out: a run whose row there has the same checkpoint bytes and evaluation options "
                   "keeps it (not evaluated again), e.g. after adding seeds to a sweep.")
def evaluate_command(embeddings, checkpoint, average_with, member, shortlist, shortlist_features, shortlist_k,
                     run_patterns, average_with_runs, features, root, dataset_kind, dataset_options,
                     text_features, split, protocol, order, relevance, cs_ks, device, amp, as_json, out,
                     checkpoint_name, judgments, overwrite, keep_evaluated, rescore):
    """Recall@K, median/mean rank and rsum (docs/PROTOCOL.md), both directions."""
    from pipeline.core.runtime import resolve_device

    dev = resolve_device(device)
    _share_over_ranks(dev)
    if sum(map(bool, (embeddings, checkpoint, run_patterns))) != 1:
        raise click.UsageError("give one of --embeddings FILE.npz, --checkpoint FILE with --features, "
                               "or --runs 'runs/*'")
    if amp and not checkpoint:
        raise click.UsageError("--amp goes with --checkpoint (how the model embeds)")
    if average_with and not (checkpoint and features):
        raise click.UsageError("--average-with goes with --checkpoint and --features")
    if average_with_runs and not run_patterns:
        raise click.UsageError("--average-with-runs goes with --runs")
    if member is not None and (embeddings or average_with or average_with_runs or shortlist or root
                               or rescore):
        raise click.UsageError("--member goes with --checkpoint (on --features) or --runs, without "
                               "--average-with(-runs), --shortlist, --root or --rescore")
    if keep_evaluated and (not (run_patterns and out) or average_with_runs):
        raise click.UsageError("--keep-evaluated goes with --runs and --out, without --average-with-runs")
    elsewhere = embeddings or shortlist or root or protocol == "5fold" or (
        run_patterns and (keep_evaluated or average_with_runs))
    rescore = rescore.plan(split, refused=elsewhere and (
        "--rescore goes with --checkpoint on --features (single or 5k protocol, --average-with too) or "
        "--runs (without --keep-evaluated and --average-with-runs)"))
    if shortlist:
        alone = not (average_with or root or relevance or judgments or protocol == "5fold")
        if not (checkpoint and features and alone):
            raise click.UsageError("--shortlist goes with --checkpoint (a pairwise network) and --features, "
                                   "without --average-with, --root, --relevance, --judgments or 5fold")
        from pipeline.evaluation.command import evaluate_shortlist

        evaluation = evaluate_shortlist(checkpoint, features, shortlist, dev,
                                        shortlist_features=shortlist_features, k=shortlist_k, split=split,
                                        protocol=protocol, amp=amp, text_features=text_features, echo=_note)
        click.echo(evaluation.render(as_json))
        return
    if shortlist_features:
        raise click.UsageError("--shortlist-features goes with --shortlist")
    if run_patterns:
        from pipeline.reports.runs_command import NoRunFolders, evaluate_run_folders

        try:
            result = evaluate_run_folders(run_patterns, dev, split=split, protocol=protocol,
                                          features=features, relevance=relevance, cs_ks=cs_ks, out=out,
                                          checkpoint_name=checkpoint_name, judgments=judgments,
                                          overwrite=overwrite, text_features=text_features,
                                          average_with_runs=average_with_runs, keep_evaluated=keep_evaluated,
                                          member=member,
                                          rescore=rescore, echo=_note)
        except NoRunFolders as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(result.table)
        from pipeline.evaluation.chance import runs_notes

        for line in [*result.closing, *runs_notes(result.rows)]:
            _note(line)
        return
    if out:
        raise click.UsageError("--out goes with --runs")
    if root and (not checkpoint or features):
        raise click.UsageError("--root goes with --checkpoint of an RC run, instead of --features")
    if text_features and (embeddings or root):
        raise click.UsageError("--text-features goes with --checkpoint (and --features) or --runs")
    if dataset_options.get("layout", CsvLayout()) != CsvLayout() and not root:
        raise click.UsageError("the --csv-* and --split-* options describe --root's CSV: give --root")
    if root and relevance:
        raise click.UsageError("--relevance rows follow a feature cache's captions: CS@K needs --features")
    if embeddings:
        if relevance:
            raise click.UsageError("--relevance needs --checkpoint and --features (caption identities)")
        from pipeline.evaluation.command import evaluate_embeddings_file

        evaluation = evaluate_embeddings_file(embeddings, protocol, dev, "order" if order else "cosine",
                                              judgments, echo=_note)
    else:
        if not features and not root:
            raise click.UsageError("--checkpoint needs --features CACHE.h5 (or --root DIR for an RC run)")
        from pipeline.evaluation.command import evaluate_checkpoint

        evaluation = evaluate_checkpoint(checkpoint, dev, features=features, root=root,
                                         dataset_kind=dataset_kind, dataset_options=dataset_options,
                                         split=split, protocol=protocol, amp=amp, text_features=text_features,
                                         average_with=average_with, relevance=relevance, cs_ks=cs_ks,
                                         judgments=judgments, rescore=rescore, member=member, echo=_note)
    click.echo(evaluation.render(as_json))
    for line in evaluation.notes if not as_json else ():  # at the end: a small split, a result at chance
        _note(line)                                        # (--json: the object alone, for a program)


def _note(message: str) -> None:
    click.echo(message, err=True)


def _share_over_ranks(device) -> None:
    """Under torchrun: join the process group, so a pairwise network's score blocks are dealt to
    the ranks (pipeline.evaluation.inference.score_split); every rank then computes the same
    metrics, and only rank 0 prints and writes (the other ranks' output goes to os.devnull)."""
    import contextlib
    import os

    from pipeline.core import distributed

    if not distributed.init_from_env(device) or distributed.is_main():
        return
    stack = contextlib.ExitStack()
    devnull = stack.enter_context(open(os.devnull, "w"))
    stack.enter_context(contextlib.redirect_stdout(devnull))
    stack.enter_context(contextlib.redirect_stderr(devnull))
    click.get_current_context().call_on_close(stack.close)
