"""The names ``--image-pool`` and ``--text-pool`` accept, and the member projections of a set
head: the one list of each, torch-free (option parsing and config checks import it; the
modules live in ``pipeline.heads``).  Meant to move into ``pipeline.registry`` as is.

A pool turns a padded set of vectors into one vector, ``pool(x (B, K, E), lengths (B,))`` →
(B, E); a user's own pool is given as ``FILE.py:Class`` or ``package.module:Class`` and built
as ``Class(dim=E, **options)`` (``vse check-head`` runs its contract).
"""

from __future__ import annotations

from .plugin_import import check_spec

# Built-in set pools: name → "module:Class".  Pool image members (regions, grid cells) and
# caption tokens (BiGRU states, or cached token vectors) alike.
SET_POOLS = {
    "mean": "pipeline.heads:MeanPool",  # masked mean
    "max": "pipeline.heads:MaxPool",    # masked max per dimension
    "gpo": "pipeline.heads:GPO",        # VSE∞'s Generalized Pooling Operator
}

IMAGE_POOLS = tuple(SET_POOLS)
# "last": VSE++'s caption encoder (one-way GRU, its state after the last token; models.TextEncoder).
# A set pool over word tokens pools the states of a bidirectional GRU (gpo = VSE∞'s BiGRU
# encoder, heads.BiGRUTextEncoder); over cached token vectors it pools their per-token
# projection (heads.TokenSetTextEncoder).
LAST = "last"
TEXT_POOLS = (LAST, *SET_POOLS)

# Per-member projection of a set head (heads.SetImageHead): "linear" = fc(x) (VSE∞'s CNN-grid
# head); "linear+mlp" = fc(x) + MLP(x), MLP = Linear → BatchNorm1d → ReLU → Linear with hidden
# size embed/2 (VSE∞'s head over precomputed regions).
SET_PROJECTIONS = ("linear", "linear+mlp")

# Size augmentation of a training set (set_augment.size_augment): "precomp" = VSE∞'s rule for
# precomputed regions, "grid" = its rule for CNN grids.
SIZE_AUGMENT_RULES = ("precomp", "grid")


def check_image_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in image pool or an import path."""
    check_spec(spec, IMAGE_POOLS, "pool")


def check_text_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in text pool or an import path (a user's set pool)."""
    check_spec(spec, TEXT_POOLS, "pool")
