"""`vse extract` (images → feature cache) and `vse info` (what a cache holds, checked)."""

from __future__ import annotations

import click

from cli.dataset_root import csv_options, root_option
from pipeline.backbones.cnns import BACKBONE_NAMES
from pipeline.backbones.engines import ENGINES
from pipeline.core.errors import VseError
from pipeline.core.registry import DATASET_KINDS, READERS
from pipeline.data.cache import DEFAULT_SHARD_SIZE, FeatureCache


def _at_least(low: int):
    """A callback refusing a number below ``low`` in one line (exit 1)."""

    def check(ctx, param, value):
        if value is not None and value < low:
            raise VseError(f"{param.opts[0]} must be at least {low}, got {value}")
        return value

    return check


def _split_list(ctx, param, value):
    if value is None:
        return None
    names = [s.strip() for s in value.split(",") if s.strip()]
    if not names:
        raise click.BadParameter("give split names separated by commas, e.g. train,dev,test")
    return names


@click.command("extract")
@click.option("--dataset", "kind", required=True, type=click.Choice(DATASET_KINDS),
              help="Layout of --root; a layout without images (vsepp-precomp) imports its precomputed "
                   "features (no CNN).")
@root_option(required=True)
@csv_options("kind")
@click.option("--splits", callback=_split_list, default=None,
              help="Comma-separated splits to extract (default: all of the dataset's).")
@click.option("--backbone", default="efficientnet-lite0", show_default=True,
              type=click.Choice(BACKBONE_NAMES),
              help="CNN; 'tiny' is a random test-only net.")
@click.option("--crops", type=click.Choice(["1", "10"]), default="1", show_default=True,
              help="1: centre crop; 10: corners + centre and their flips, features averaged.")
@click.option("--grid", is_flag=True,
              help="Keep the CNN's last feature map as a set of its h×w cells, (N, h·w, D) float16, "
                   "instead of their mean (VSE∞'s grid features; EfficientNet-Lite0 at 224: 7 × 7 × 1280).")
@click.option("--input-scale", type=float, default=1.0, show_default=True,
              help="Feed the CNN images this many times larger (crop and resize): a larger map "
                   "(2.0: 14 × 14), as VSE∞'s --input_scale_factor.")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Cache file (.h5); shards go to OUT.shards/.")
@click.option("--batch-size", type=int, callback=_at_least(1), default=32, show_default=True,
              help="Images per forward pass (× crops); changing it recomputes the shards (their "
                   "features depend on the batch in the last float bits).")
@click.option("--workers", type=int, callback=_at_least(0), default=None,
              help="Image-loading processes [default: onnxruntime: one per core, at most 8, each decoding "
                   "and running its own session; torch: cores - 1, at most 8]. 0: all in this process.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
              help="Who runs the CNN: auto = onnxruntime on a CPU when installed (about 8× torch), "
                   "torch on a GPU. A run is resumed only by the engine that started it.")
@click.option("--shard-size", type=int, callback=_at_least(1), default=DEFAULT_SHARD_SIZE, show_default=True,
              help="Rows per shard (the unit of resuming and of work per rank).")
@click.option("--weights", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Backbone weights file (default: the package's / the torch hub cache's).")
@click.option("--skip-bad-images", is_flag=True,
              help="Store zeros for unreadable images (listed in the cache's bad_images) instead of "
                   "stopping.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --out that is not a vse feature cache (refused otherwise).")
def extract_command(kind, root, dataset_options, splits, backbone, crops, grid, input_scale, out, batch_size,
                    workers, device, shard_size, weights, skip_bad_images, quiet, overwrite, engine):
    """Extract image features into a sharded HDF5 cache; rerun the same command to resume.

    Under torchrun each rank computes every world_size-th shard.
    """
    from pipeline.core import distributed
    from pipeline.data.extract import ExtractOptions, extract_features, import_precomputed
    from pipeline.data.readers import load_dataset

    dataset = load_dataset(kind, root, **dataset_options)
    if not READERS.entries[kind].images:  # a feature-only layout: its features are imported, no CNN
        result = import_precomputed(dataset, out, splits, shard_size=shard_size, dataset_kind=kind,
                                    overwrite=overwrite)
    else:
        options = ExtractOptions(backbone=backbone, crops=int(crops), batch_size=batch_size,
                                 workers=workers, device=device, shard_size=shard_size,
                                 weights=weights, skip_bad_images=skip_bad_images, progress=not quiet,
                                 overwrite=overwrite, engine=engine, grid=grid, input_scale=input_scale)
        result = extract_features(dataset, out, splits, options, dataset_kind=kind)
    if not distributed.is_main():
        return
    for line in dataset.report.lines():
        click.echo(f"dataset: skipped or changed {line}", err=True)
    for line in result.bad_images:
        click.echo(f"unreadable image stored as zeros: {line}", err=True)
    speed = f", {result.images_per_second:.1f} images/s" if result.images_computed else ""
    what = (f"{result.num_images} images × {result.feature_dim}" if result.set_size is None else
            f"{result.num_images} images × {result.set_size} × {result.feature_dim} (sets)")
    storage = (f"{result.num_shards} shards, {result.shards_computed} computed here, "
               f"{result.shards_reused} reused or by other ranks{speed}" if result.num_shards else
               "no copy: the features are read where they are")
    click.echo(f"wrote {result.path}: {what} ({storage})")


@click.command("info")
@click.argument("path", type=click.Path(dir_okay=False))
def info_command(path):
    """Show what a feature cache holds and check it (exit 1 if it is broken)."""
    with FeatureCache(path) as cache:
        click.echo(f"{cache.path}")
        for key, value in sorted(cache.attrs.items()):
            if key != "config":
                click.echo(f"  {key}: {value}")
        storage = ("virtual over shards" if cache.features.is_virtual else
                   "read in place from the files it names" if cache.features.external else "stored inline")
        shape = " × ".join(map(str, cache.features.shape))
        click.echo(f"features: {shape} {cache.features.dtype}, {cache.num_images} rows of {cache.layout} "
                   f"({storage})")
        click.echo(f"captions: {len(cache.captions)}"
                   + (f", e.g. {cache.captions[0]!r}" if cache.captions else ""))
        click.echo("splits:")
        for name in cache.split_names:
            click.echo(f"  {name}: {len(cache.split(name))} images, "
                       f"{len(cache.split_captions(name))} captions")
        report = cache.check()
        if not report.ok:
            raise VseError(f"broken cache: {report.summary()}", cache.path)
        click.echo(f"check: {report.summary()}")
