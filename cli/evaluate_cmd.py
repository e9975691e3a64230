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
@click.option("--features", type=click.Path(dir_okay=False), help="Feature cache for --checkpoint.")
@click.option("--split", default="test", show_default=True)
@click.option("--protocol", type=click.Choice(["single", "5fold", "5k"]), default="single", show_default=True,
              help="single: all at once; 5fold: COCO 1K (mean of 5 folds); 5k: COCO 5K.")
@click.option("--order", is_flag=True, help="--embeddings are order embeddings (order similarity).")
@click.option("--relevance", type=click.Path(dir_okay=False), default=None, help="Relevance file: adds CS@K.")
@click.option("--cs", "cs_ks", callback=_parse_ks, default="100,1000", show_default=True, help="K values of CS@K.")
@click.option("--device", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def evaluate_command(embeddings, checkpoint, features, split, protocol, order, relevance, cs_ks, device, as_json):
    """Recall@K, median/mean rank and rsum (PROTOCOL.md), both directions."""
    from pipeline.evaluation import (JSON_KEYS, embed_checkpoint, evaluate_npz,
                                     evaluate_split_embeddings, format_table)
    from pipeline.runtime import resolve_device

    dev = resolve_device(device)
    if bool(embeddings) == bool(checkpoint):
        raise click.UsageError("give either --embeddings FILE.npz or --checkpoint FILE with --features")
    if embeddings:
        if relevance:
            raise click.UsageError("--relevance needs --checkpoint and --features (caption identities)")
        metrics = evaluate_npz(embeddings, protocol, dev, order)
        title = f"{embeddings} ({protocol})"
    else:
        if not features:
            raise click.UsageError("--checkpoint needs --features CACHE.h5")
        emb = embed_checkpoint(checkpoint, features, split, dev)
        metrics = evaluate_split_embeddings(emb, protocol, dev, relevance, cs_ks if relevance else ())
        title = f"{checkpoint} on {features} [{split}, {len(emb.images)} images, {protocol}]"
    if as_json:
        out = {k: float(metrics[k]) for k in JSON_KEYS}
        out.update({k: float(v) for k, v in metrics.items() if "_cs@" in k})
        click.echo(json.dumps(out))
    else:
        click.echo(format_table(metrics, title))


def register(group: click.Group) -> None:
    group.add_command(evaluate_command)


