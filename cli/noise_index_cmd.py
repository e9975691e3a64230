"""`vse noise-index`: write the noise index of a feature cache's training split (data/noise.py), the
file `vse train --noise-index` reads and other code can load (numpy .npy, int64)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.core.registry import NOISE_MODES


@click.command("noise-index")
@click.option("--features", required=True, type=click.Path(dir_okay=False), help="The feature cache.")
@click.option("--mode", type=click.Choice(NOISE_MODES), default="caption", show_default=True,
              help="caption: one entry per training caption (NCR); image: one per training image "
                   "(DECL, RCL).")
@click.option("--rate", type=float, required=True,
              help="The share of captions or images permuted, 0 <= r < 1.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--split", default="train", show_default=True, help="The training split.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The .npy file to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
def noise_index_command(features, mode, rate, seed, split, out, overwrite):
    """Draw a noise index (NCR's procedure, a seeded RandomState) and say its true rate and sha256.
    Beside it, OUT.json says what it is and the training split it was drawn for (`vse train
    --noise-index` refuses it for another split)."""
    import numpy as np

    from pipeline.core.errors import VseError
    from pipeline.data.cache import FeatureCache
    from pipeline.data.noise import NoiseIndex, drawn_for, sidecar

    if not 0 <= rate < 1:
        raise VseError(f"--rate must be in [0, 1), got {rate}")
    if Path(out).exists() and not overwrite:
        raise VseError("exists: give --overwrite to replace it", out)
    with FeatureCache(features) as cache:
        rows = cache.split(split)
        if len(rows) == 0:
            raise VseError(f"split {split!r} has no images", features)
        train = np.flatnonzero(np.isin(cache.caption_image, rows))
        images = np.unique(cache.caption_image[train])
        local = np.searchsorted(images, cache.caption_image[train])
        made_for = drawn_for(split, [cache.captions[i] for i in train], len(images))
    noise = NoiseIndex.make(mode, rate, seed, local, len(images), made_for)
    noise.write(out)
    click.echo(f"wrote {out} and {sidecar(out).name}: {mode}-level, {len(noise.entries)} entries "
               f"({len(local)} training captions, {len(images)} images), true rate {noise.true_rate():.4f}, "
               f"sha256 {noise.sha256()}")
