"""`vse evaluate`: metrics of saved embeddings or of a trained checkpoint."""

from __future__ import annotations

import json

import click



def _parse_ks(ctx, param, value):
    if not value:
        return ()
    try:
        return tuple(int(k) for k in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


@click.command("evaluate")
@click.option("--embeddings", type=click.Path(dir_okay=False), help="npz with images (N×D) and captions (5N×D).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), help="A run's best.pt / last.pt.")
@click.option("--runs", "run_patterns", multiple=True,
              help="Run folders (glob, quoted: 'runs/*'), repeatable: one results row per run.")
@click.option("--features", type=click.Path(dir_okay=False),
              help="Feature cache for --checkpoint (for --runs: default the cache each run trained on).")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="RC checkpoint (--rc training): embed this dataset folder's images with the run's own CNN.")
@click.option("--dataset", "dataset_kind", type=click.Choice(["flickr8k", "karpathy"]), default="flickr8k",
              show_default=True, help="--root: its layout.")
@click.option("--text-features", type=click.Path(dir_okay=False), default=None,
              help="Caption-feature file for a run trained with --text-features (default: the one it names).")
@click.option("--split", default="test", show_default=True)
@click.option("--protocol", type=click.Choice(["single", "5fold", "5k"]), default="single", show_default=True,
              help="single: all at once; 5fold: COCO 1K (mean of 5 folds); 5k: COCO 5K.")
@click.option("--order", is_flag=True, help="--embeddings are order embeddings (order similarity).")
@click.option("--relevance", type=click.Path(dir_okay=False), default=None, help="Relevance file: adds CS@K.")
@click.option("--cs", "cs_ks", callback=_parse_ks, default="100,1000", show_default=True, help="K values of CS@K.")
@click.option("--device", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="--runs: write results.csv here.")
@click.option("--checkpoint-name", default="best.pt", show_default=True, help="--runs: which checkpoint of each run.")
def evaluate_command(embeddings, checkpoint, run_patterns, features, root, dataset_kind, text_features, split,
                     protocol, order, relevance, cs_ks, device, as_json, out, checkpoint_name):
    """Recall@K, median/mean rank and rsum (PROTOCOL.md), both directions."""
    from pipeline.evaluation import (JSON_KEYS, embed_checkpoint, evaluate_npz,
                                     evaluate_split_embeddings, format_table)
    from pipeline.runtime import resolve_device

    dev = resolve_device(device)
    if sum(map(bool, (embeddings, checkpoint, run_patterns))) != 1:
        raise click.UsageError("give one of --embeddings FILE.npz, --checkpoint FILE with --features, "
                               "or --runs 'runs/*'")
    if run_patterns:
        _evaluate_runs(run_patterns, features, split, protocol, relevance, cs_ks, dev, out, checkpoint_name,
                       text_features)
        return
    if out:
        raise click.UsageError("--out goes with --runs")
    if root and (not checkpoint or features):
        raise click.UsageError("--root goes with --checkpoint of an RC run, instead of --features")
    if text_features and (embeddings or root):
        raise click.UsageError("--text-features goes with --checkpoint (and --features) or --runs")
    if root and relevance:
        raise click.UsageError("--relevance rows follow a feature cache's captions: CS@K needs --features")
    if embeddings:
        if relevance:
            raise click.UsageError("--relevance needs --checkpoint and --features (caption identities)")
        metrics = evaluate_npz(embeddings, protocol, dev, order)
        title = f"{embeddings} ({protocol})"
    else:
        if not features and not root:
            raise click.UsageError("--checkpoint needs --features CACHE.h5 (or --root DIR for an RC run)")
        if root:
            from pipeline.rc import embed_rc_checkpoint

            emb = embed_rc_checkpoint(checkpoint, dataset_kind, root, split, dev)
        else:
            emb = embed_checkpoint(checkpoint, features, split, dev, text_features=text_features)
        metrics = evaluate_split_embeddings(emb, protocol, dev, relevance, cs_ks if relevance else ())
        title = f"{checkpoint} on {root or features} [{split}, {len(emb.images)} images, {protocol}]"
    if as_json:
        out = {k: float(metrics[k]) for k in JSON_KEYS}
        out.update({k: float(v) for k, v in metrics.items() if "_cs@" in k})
        click.echo(json.dumps(out))
    else:
        click.echo(format_table(metrics, title))


def _evaluate_runs(patterns, features, split, protocol, relevance, cs_ks, device, out, checkpoint_name,
                   text_features=None):
    from pipeline.batch_eval import evaluate_runs
    from pipeline.report import format_results, write_results
    from pipeline.runs import find_runs

    run_dirs = find_runs(patterns)
    if not run_dirs:
        raise click.UsageError(f"no run folders match {' '.join(patterns)}")
    result = evaluate_runs(run_dirs, device=device, split=split, protocol=protocol, features=features,
                           relevance=relevance, cs_ks=cs_ks if relevance else (), checkpoint=checkpoint_name,
                           echo=lambda m: click.echo(m, err=True), text_features=text_features)
    if not result.rows:
        raise click.ClickException(f"none of the {len(run_dirs)} runs could be evaluated")
    if out:
        write_results(result.rows, out)
    click.echo(format_results(result.rows, "md", "recall"))
    summary = f"{len(result.rows)} of {len(run_dirs)} runs evaluated"
    if result.skipped:
        summary += f", {len(result.skipped)} skipped"
    click.echo(summary + (f" → {out}" if out else ""), err=True)


def register(group: click.Group) -> None:
    group.add_command(evaluate_command)


