"""`vse report`, `vse plot`, `vse gallery`: results tables, figures, and an HTML gallery of
retrievals."""

from __future__ import annotations

import click

from cli.judgment_options import judgment_options
from pipeline.core.registry import REPORT_LAYOUTS


@click.command("report")
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["md", "latex", "csv"]), default="md", show_default=True)
@click.option("--columns", "layout", type=click.Choice(REPORT_LAYOUTS), default="paper",
              show_default=True, help="paper: R@1 R@10 Med r per direction; recall: R@1 R@5 R@10 per "
              "direction + rsum; human: agreement with human judgments (evaluate --judgments) + rsum; "
              "noisy: R@1, rsum, mAP@R per direction and the division's AUC (training on noisy pairs).")
@click.option("--label", default="run", show_default=True, help="Column of results.csv naming each row.")
@click.option("--bold", "bold", type=click.Choice(["significant", "best", "none"]), default="significant",
              show_default=True, help="significant: a column's best mean, only when Welch's t-test over "
              "seeds puts it above the runner-up (p < 0.05); best: the best printed value; none.")
@click.option("--no-bold", "bold", flag_value="none", help="Same as --bold none.")
@click.option("--epochs-to-best", "epochs", is_flag=True,
              help="Add the epochs each run needed to reach its best validation M-Recall.")
@click.option("--seeds/--per-run", "seeds", default=None,
              help="One row per configuration, mean ± std (n) over its seeds (default: when some "
              "configuration has several seeds), or one row per run.")
@click.option("--baseline", metavar="NAME", default=None,
              help="Add a column: each configuration's p against NAME (a row's name without the seed, or a "
              "loss), Welch's two-sided t-test over seeds of rsum.")
def report_command(results, fmt, layout, label, bold, epochs, seeds, baseline):
    """Print RESULTS (from `vse evaluate --runs … --out`) as the papers' table; runs that
    differ only by seed are one row, mean ± std (n)."""
    from pipeline.reports.report import format_results, read_results

    click.echo(format_results(read_results(results), fmt, layout, label, bold, epochs, seeds, baseline))


@click.command("plot")
@click.option("--runs", "patterns", multiple=True, help="Run folders (glob, quoted), repeatable: 'runs/*'.")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="results.csv: test metrics for the negative-set and epochs figures.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Folder for PNG + PDF.")
@click.option("--overwrite", is_flag=True, help="Replace figure files in --out that vse did not write.")
def plot_command(patterns, results, out_dir, overwrite):
    """Validation curves, R@1 against negative set size, epochs to best M-Recall, learned pool weights."""
    from pipeline.reports.plots import plot_runs
    from pipeline.reports.report import read_results
    from pipeline.training.run_folder import find_runs

    if not patterns and not results:
        raise click.UsageError("give --runs 'runs/*' and/or --results results.csv")
    run_dirs = find_runs(patterns) if patterns else []
    if patterns and not run_dirs:
        raise click.UsageError(f"no run folders match {' '.join(patterns)}")
    rows = read_results(results) if results else None
    written = plot_runs(run_dirs, out_dir, rows, overwrite)
    if not written:
        click.echo("nothing to plot: the runs have no validation records yet")
    for name, paths in written.items():
        click.echo(f"{name}: {' '.join(str(p) for p in paths)}")


@click.command("gallery")
@click.option("--checkpoint", type=click.Path(dir_okay=False), required=True, help="A run's best.pt.")
@click.option("--features", type=click.Path(dir_okay=False), default=None,
              help="Feature cache (default: the one the run was trained on).")
@click.option("--images", "images_root", type=click.Path(file_okay=False), default=None,
              help="Dataset root with images/ (default: the cache's dataset_root).")
@click.option("--split", default="test", show_default=True)
@click.option("--n", type=int, default=20, show_default=True, help="Query images and query captions.")
@click.option("--k", type=int, default=5, show_default=True, help="Results shown per query.")
@click.option("--embed/--link", default=True, show_default=True,
              help="Embed JPEG thumbnails so the page stands alone (moved, mailed), or link the image files "
                   "relative to the page (smaller; works only where it was written).")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random queries.")
@click.option("--device", default="auto", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="gallery.html", show_default=True)
@judgment_options
@click.option("--overwrite", is_flag=True, help="Replace an existing --out that is not a vse gallery page.")
def gallery_command(checkpoint, features, images_root, split, n, k, embed, seed, device, out, judgments,
                    overwrite):
    """A static HTML page of query images with their top captions and query captions with
    their top images, ground truth marked (opens in a browser, no server)."""
    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.core.runtime import resolve_device
    from pipeline.reports.gallery import build_gallery

    if not features:
        features = load_checkpoint(checkpoint)["train_config"].get("features")
        if not features:
            raise click.UsageError("the checkpoint names no feature cache: give --features")
    summary = build_gallery(checkpoint, features, out, images_root=images_root, split=split, n=n, k=k,
                            embed=embed, seed=seed, device=resolve_device(device),
                            judgments=judgments.load() if judgments else None, overwrite=overwrite)
    if summary.missing_images:
        click.echo(f"warning: {len(summary.missing_images)} image(s) not found under "
                   f"{images_root or 'the cache dataset_root'} (shown by name), "
                   f"e.g. {summary.missing_images[0]}",
                   err=True)
    click.echo(f"gallery: {summary.path} ({summary.image_queries} image and "
               f"{summary.caption_queries} caption queries)")
