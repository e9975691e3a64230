"""`vse evaluate`: metrics of saved embeddings or of a trained checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.dataset_root import csv_options, root_option
from cli.judgment_options import judgment_options
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
@click.option("--keep-evaluated", is_flag=True,
              help="--out: a run whose row there has the same checkpoint bytes and evaluation options "
                   "keeps it (not evaluated again), e.g. after adding seeds to a sweep.")
def evaluate_command(embeddings, checkpoint, average_with, shortlist, shortlist_features, shortlist_k,
                     run_patterns, average_with_runs, features, root, dataset_kind, dataset_options,
                     text_features, split, protocol, order, relevance, cs_ks, device, amp, as_json, out,
                     checkpoint_name, judgments, overwrite, keep_evaluated):
    """Recall@K, median/mean rank and rsum (docs/PROTOCOL.md), both directions."""
    from pipeline.core.runtime import resolve_device
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import (
        cs_note,
        embed_checkpoint,
        evaluate_npz,
        evaluate_split_embeddings,
        format_table,
        json_metrics,
        relevance_for_cache,
    )

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
    if keep_evaluated and (not (run_patterns and out) or average_with_runs):
        raise click.UsageError("--keep-evaluated goes with --runs and --out, without --average-with-runs")
    if shortlist:
        alone = not (average_with or root or relevance or judgments or protocol == "5fold")
        if not (checkpoint and features and alone):
            raise click.UsageError("--shortlist goes with --checkpoint (a pairwise network) and --features, "
                                   "without --average-with, --root, --relevance, --judgments or 5fold")
        _evaluate_shortlist(checkpoint, features, text_features, shortlist, shortlist_features or features,
                            shortlist_k, split, protocol, dev, amp, as_json)
        return
    if shortlist_features:
        raise click.UsageError("--shortlist-features goes with --shortlist")
    if run_patterns:
        _evaluate_runs(run_patterns, features, split, protocol, relevance, cs_ks, dev, out, checkpoint_name,
                       judgments, overwrite, text_features, average_with_runs, keep_evaluated)
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
        similarity = "order" if order else "cosine"
        metrics = evaluate_npz(embeddings, protocol, dev, similarity)
        title = f"{embeddings} ({protocol})"
        if judgments:
            from pipeline.evaluation.evaluate import judge_npz

            metrics.update(_report_matched(*judge_npz(embeddings, judgments.load(), similarity, dev)))
    else:
        if not features and not root:
            raise click.UsageError("--checkpoint needs --features CACHE.h5 (or --root DIR for an RC run)")
        if root:
            from pipeline.evaluation.inference import embed_rc_checkpoint

            emb = embed_rc_checkpoint(checkpoint, dataset_kind, root, split, dev, amp=amp,
                                      dataset_options=dataset_options)
        else:
            with FeatureCache(features) as cache:  # a relevance file of other captions: refused first
                relevance = relevance_for_cache(relevance, cache) if relevance else None
                emb = embed_checkpoint(checkpoint, cache, split, dev, amp=amp, text_features=text_features)
                if average_with:
                    from pipeline.evaluation.evaluate import average_scores

                    emb = average_scores([emb] + [embed_checkpoint(other, cache, split, dev, amp=amp)
                                                  for other in average_with], [checkpoint, *average_with])
        metrics = evaluate_split_embeddings(emb, protocol, dev, relevance, cs_ks if relevance else ())
        note = cs_note(cs_ks, len(emb.images), split) if relevance else None
        if note:
            click.echo(note, err=True)
        named = " + ".join([checkpoint, *average_with]) + (" (scores averaged)" if average_with else "")
        title = f"{named} on {root or features} [{split}, {len(emb.images)} images, {protocol}]"
        if judgments:
            metrics.update(_judge_split(emb, judgments, features, root, dataset_kind, dev, dataset_options))
    if as_json:
        click.echo(json.dumps(json_metrics(metrics)))
    else:
        from pipeline.evaluation.judgments import format_human

        click.echo("\n".join(filter(None, [format_table(metrics, title), format_human(metrics)])))


def _evaluate_shortlist(checkpoint, features, text_features, shortlist, shortlist_features, k, split,
                        protocol, device, amp, as_json) -> None:
    """A pairwise checkpoint re-ranking a dual checkpoint's top k (pipeline.evaluation.shortlist)."""
    import time

    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import embed_checkpoint, format_table, json_metrics
    from pipeline.evaluation.inference import check_features_match, load_model
    from pipeline.evaluation.shortlist import check_kinds, rerank_split
    from pipeline.models.network import network_kind

    loaded = load_model(checkpoint, device)  # each checkpoint's kind before the split is embedded
    check_kinds(loaded.model, network_kind(load_model(shortlist, device).model) == "pairwise", checkpoint,
                shortlist)
    dual = embed_checkpoint(shortlist, shortlist_features, split, device, amp=amp)
    started = time.perf_counter()
    with FeatureCache(features) as cache:
        check_features_match(cache, loaded.model, loaded.state.get("feature_source", {}), checkpoint)
        captions = loaded.captions(cache, text_features, checkpoint)
        reranked = rerank_split(loaded.model, cache, captions, split, device, dual, k, amp=amp,
                                model_path=checkpoint, dual_path=shortlist)
    seconds = time.perf_counter() - started
    metrics = reranked.metrics()
    scored = (f"scored {reranked.pairs_scored:,} of {reranked.pairs:,} pairs "
              f"({100 * reranked.pairs_scored / reranked.pairs:.1f}%) in {seconds:.1f} s")
    if as_json:
        click.echo(json.dumps({**json_metrics(metrics), "shortlist_k": k, "seconds": round(seconds, 2),
                               "pairs_scored": reranked.pairs_scored, "pairs": reranked.pairs}))
        return
    click.echo(format_table(metrics, f"{checkpoint} re-ranking the top {k} of {shortlist} on {features} "
                                     f"[{split}, {len(reranked.i2t)} images, {protocol}]"))
    click.echo(scored)


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


def _judge_split(emb, judgments, features, root, dataset_kind, device, dataset_options=None) -> dict:
    """Human-judgment metrics of a checkpoint's split embeddings; caption keys are rebuilt from
    the cache (or dataset) order and checked against Flickr8k.token.txt when it is at hand."""
    from pipeline.evaluation.evaluate import judge_split
    from pipeline.evaluation.judgments import token_file_near

    loaded = judgments.load()
    if root:
        from pipeline.data.readers import load_dataset

        index = load_dataset(dataset_kind, root, **(dataset_options or {})).select()[1]
        return _report_matched(*judge_split(emb, index, loaded, device, token_file_near(root)))
    from pipeline.data.cache import FeatureCache

    with FeatureCache(features) as cache:
        token_file = token_file_near(cache.attrs.get("dataset_root"))
        return _report_matched(*judge_split(emb, cache, loaded, device, token_file))


def _report_matched(metrics: dict, matched) -> dict:
    click.echo(f"judgments: {matched.summary()}", err=True)
    return metrics


def _evaluate_runs(patterns, features, split, protocol, relevance, cs_ks, device, out, checkpoint_name,
                   judgments=None, overwrite=False, text_features=None, average_with_runs=(),
                   keep_evaluated=False):
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
        raise click.UsageError(f"no run folders match {' '.join(patterns)}")
    result = evaluate_runs(run_dirs, device=device, split=split, protocol=protocol, features=features,
                           relevance=relevance, cs_ks=cs_ks if relevance else (), checkpoint=checkpoint_name,
                           echo=lambda m: click.echo(m, err=True),
                           judgments=judgments.load() if judgments else None,
                           text_features=text_features, average_with=average_with_runs, kept=kept)
    if not result.rows:
        raise click.ClickException(f"none of the {len(run_dirs)} runs could be evaluated")
    if relevance:
        for note in dict.fromkeys(cs_note(cs_ks, row["images"], split) for row in result.rows):
            if note:
                click.echo(note, err=True)
    if out and distributed.is_main():
        write_results(result.rows, out)
    click.echo(format_results(result.rows, "md", "human" if judgments else "recall"))
    if judgments:
        first = result.rows[0]
        click.echo(f"judgments: {first['human_pairs']:.0f} judged pairs in the split, "
                   f"{first['human_unmatched']:.0f} outside it (left out)", err=True)
    summary = f"{len(result.rows)} of {len(run_dirs)} runs evaluated"
    if keep_evaluated:
        summary += f" ({result.kept} kept from {out})"
    if average_with_runs:
        summary = f"{len(result.rows)} rows from {len(run_dirs)} runs, their partners and averages"
    if result.skipped:
        summary += f", {len(result.skipped)} skipped"
    click.echo(summary + (f" → {out}" if out else ""), err=True)
