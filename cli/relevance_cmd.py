"""`vse relevance`: caption–caption relevance vectors for a feature cache."""

from __future__ import annotations

import click

from cli.dataset_root import csv_options, root_option
from cli.judgment_options import judgment_options
from pipeline.core.registry import IMAGE_DATASET_KINDS
from pipeline.relevance.stage import DEFAULT_CBOW_THRESHOLD, METHODS
from pipeline.relevance.svd import DEFAULT_SVD_ITERATIONS


@click.command("relevance")
@click.option("--features", required=True, type=click.Path(dir_okay=False),
              help="Feature cache (.h5) whose captions get relevance vectors.")
@click.option("--method", required=True, type=click.Choice(METHODS),
              help="svd (LSEH), bert (all-MiniLM-L6-v2), cbow (mean GloVe 50d), "
                   "cbow+bert (ladder: CBoW gate, BERT score).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Relevance file to write (.h5); svd also writes OUT.svd.joblib.")
@click.option("--k", default=400, show_default=True, help="SVD dimensions (svd only).")
@click.option("--neighbours", default=0, show_default=True,
              help="Also store each caption's top-N training captions (e.g. 100; costly on CPU).")
@click.option("--fit-split", default="train", show_default=True,
              help="Split(s) to fit on and to search neighbours in, comma-separated (e.g. train,restval).")
@click.option("--batch-size", default=256, show_default=True, help="Captions per BERT batch.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16"]),
              help="Storage type of the vectors (float16 halves the file and host memory).")
@click.option("--cbow-threshold", default=DEFAULT_CBOW_THRESHOLD, show_default=True,
              help="cbow+bert: pairs with a CBoW cosine below this get relevance 0.")
@click.option("--seed", default=0, show_default=True, help="Seed of the randomized SVD.")
@click.option("--svd-iterations", default=DEFAULT_SVD_ITERATIONS, show_default=True,
              help="Power iterations of the randomized SVD (the LSEH code used 100: slower, "
                   "cosines agree to ~0.002).")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --out that is not a vse relevance file (refused otherwise).")
def relevance(features, method, out, k, neighbours, fit_split, batch_size, device, dtype,
              cbow_threshold, seed, svd_iterations, overwrite):
    """Fit on the training captions, write unit relevance vectors for every caption."""
    from pipeline.relevance.stage import build_relevance

    fit_splits = tuple(s.strip() for s in fit_split.split(",") if s.strip())
    summary = build_relevance(features, method, out, k=k, neighbours=neighbours,
                              batch_size=batch_size, device=device, dtype=dtype,
                              cbow_threshold=cbow_threshold, fit_splits=fit_splits, seed=seed,
                              svd_iterations=svd_iterations, progress=True, overwrite=overwrite)
    click.echo(f"wrote {summary.out}: {summary.num_captions} captions x {summary.dim} "
               f"({summary.method}, {summary.num_fit_captions} {'+'.join(fit_splits)} captions)")
    if summary.method == "svd" and summary.params["k"] != summary.params["k_requested"]:
        click.echo(f"note: k lowered from {summary.params['k_requested']} to {summary.params['k']} "
                   f"({summary.num_fit_captions} training captions, {summary.params['num_terms']} terms)")
    for what, count in summary.counts.items():
        if count:
            click.echo(f"note: {what.replace('_', ' ')}: {count} (relevance 0 to every caption)")
    if summary.svd_model:
        click.echo(f"svd model: {summary.svd_model} (a pickle: load only your own files)")
    if summary.neighbours:
        click.echo(f"neighbours: top {summary.neighbours} per caption")


@click.command("relevance-human")
@click.option("--features", type=click.Path(dir_okay=False), default=None,
              help="Feature cache whose captions are scored (also what --relevance files were made for).")
@root_option(prefix="Or instead of --features, a dataset (no cache needed): its captions and splits. ")
@click.option("--dataset", "dataset_kind", type=click.Choice(IMAGE_DATASET_KINDS), default="flickr8k",
              show_default=True, help="--root: its layout.")
@csv_options("dataset_kind")
@click.option("--split", default="test", show_default=True, help="The judged split.")
@click.option("--fit-split", default="train", show_default=True,
              help="Split(s) svd is fitted on, comma-separated.")
@click.option("--method", "methods", multiple=True, type=click.Choice(METHODS),
              help="Relevance methods to compute and score, repeatable (default: all, unless --relevance).")
@click.option("--relevance", "relevance_files", multiple=True, type=click.Path(dir_okay=False),
              help="Stored relevance files (of --features' cache) to score too, repeatable.")
@click.option("--k", default=400, show_default=True, help="SVD dimensions (svd only).")
@click.option("--cbow-threshold", default=DEFAULT_CBOW_THRESHOLD, show_default=True,
              help="cbow+bert: pairs with a CBoW cosine below this get relevance 0.")
@click.option("--seed", default=0, show_default=True, help="Seed of the randomized SVD.")
@click.option("--batch-size", default=256, show_default=True, help="Captions per BERT batch.")
@click.option("--device", default="auto", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON here.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --out that is not a vse relevance-human report (refused otherwise).")
@judgment_options(required=True)
def relevance_human(features, root, dataset_kind, dataset_options, split, fit_split, methods, relevance_files,
                    k, cbow_threshold, seed, batch_size, device, as_json, out, overwrite, judgments):
    """Score relevance methods as predictors of human judgments (ladder rule: an image's
    relevance to a caption is the max over the image's own captions)."""
    import json
    import shlex
    import sys

    from pipeline.evaluation.relevance_human import format_relevance_agreement, score_relevance_methods

    if bool(features) == bool(root):
        raise click.UsageError("give --features CACHE.h5 or --root DATASET_DIR")
    if relevance_files and not features:
        raise click.UsageError("--relevance files follow a feature cache's captions: give --features")
    if not methods and not relevance_files:
        methods = METHODS
    fit_splits = tuple(s.strip() for s in fit_split.split(",") if s.strip())
    report = score_relevance_methods(judgments.load(), features=features, root=root,
                                     dataset_kind=dataset_kind, split=split, fit_splits=fit_splits,
                                     methods=methods, relevance_files=relevance_files, k=k,
                                     cbow_threshold=cbow_threshold, seed=seed, batch_size=batch_size,
                                     device=device, out=out, overwrite=overwrite,
                                     echo=lambda m: click.echo(m, err=True),
                                     command=" ".join(["vse", *map(shlex.quote, sys.argv[1:])]),
                                     dataset_options=dataset_options)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(format_relevance_agreement(report["methods"]))
