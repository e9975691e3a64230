"""`vse embed`: a checkpoint's embeddings of new images and captions (pipeline/search/embed.py)."""

from __future__ import annotations

import click

from cli.dataset_root import csv_option_decorators

EMBED_CSV_OPTIONS = ("csv_img_key", "csv_caption_key", "csv_separator", "csv_id_key")


def _with_csv_options(command):
    for option in reversed(csv_option_decorators(EMBED_CSV_OPTIONS, "a CSV input")):
        command = option(command)
    return command


@click.command("embed")
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option("--images", type=click.Path(), help="A folder of images, one image, a CSV (image column), "
              "or a list file of paths (one per line, relative to the list's folder).")
@click.option("--captions", type=click.Path(dir_okay=False),
              help="A text file (one caption per line) or a CSV (caption column).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Embeddings file (.h5) to write.")
@_with_csv_options
@click.option("--features", type=click.Path(dir_okay=False),
              help="The feature cache whose image pipeline to use, when the checkpoint does not record "
                   "it (older checkpoints) and the cache it names has moved.")
@click.option("--batch-size", type=int, default=None,
              help="Images per forward pass [default: vse extract's].")
@click.option("--workers", type=int, default=None, help="Image decoding processes [default: the cores - 1].")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1, mps.")
@click.option("--strict", is_flag=True, help="Stop (writing nothing) if any image cannot be read, "
              "instead of skipping and listing it.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file that vse did not write.")
@click.option("--progress/--no-progress", default=True, show_default=True)
def embed_command(checkpoint, images, captions, out, csv_img_key, csv_caption_key, csv_separator, csv_id_key,
                  features, batch_size, workers, device, strict, overwrite, progress):
    """Embed images and/or captions with CHECKPOINT's own pipelines into an embeddings file
    (unit vectors, ids, paths or texts, the checkpoint's sha256), for `vse index`.

    Resumable: run the same command again after an interruption. Unreadable images are
    skipped, counted and listed in the file (/images/failed)."""
    from pipeline.data.readers.csv_layout import CsvLayout
    from pipeline.search.embed import embed_files

    values = dict(csv_img_key=csv_img_key, csv_caption_key=csv_caption_key, csv_separator=csv_separator,
                  csv_id_key=csv_id_key)
    given = {k: v for k, v in values.items() if v is not None}
    result = embed_files(checkpoint, out, images, captions, layout=CsvLayout(**given), device=device,
                         batch_size=batch_size, workers=workers, features=features, strict=strict,
                         overwrite=overwrite, progress=progress)
    if images is not None:
        speed = f", {result.images_per_second:.1f} images/s" if result.images_computed else ""
        click.echo(f"images: {result.images} embedded, {len(result.failed)} skipped{speed}")
        for line in result.failed[:5]:
            click.echo("  skipped " + line.replace("\t", ": "))
        if len(result.failed) > 5:
            click.echo(f"  … {len(result.failed) - 5} more in /images/failed")
    if captions is not None:
        click.echo(f"captions: {result.captions} embedded")
    parts = "part" if result.parts_reused == 1 else "parts"
    reused = f", {result.parts_reused} {parts} reused" if result.parts_reused else ""
    click.echo(f"→ {result.path} ({result.dim}-d{reused})")
