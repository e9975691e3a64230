"""The names of the house: the one list of every kind of built-in part, torch-free.

timm's rule: a registry is the single source of names, and factories build the parts. Each
registry maps a name to ``"module:attribute"``, resolved only when the part is built, so
option parsing, ``--help`` and config checks (``pipeline.core.config``) know every name without
importing torch. The modules that hold the parts take their tables from here
(``losses.LOSSES``, ``backbones.BUILDERS``, ``heads``' pools), and a test resolves every entry.

A user's own loss or set pool is an import path instead of a name (``FILE.py:Class`` or
``package.module:Class``; ``pipeline.core.plugin_import``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from pipeline.core.plugin_import import check_spec


class Registry(Mapping):
    """``name → "module:attribute"`` of one kind of part, in the order names are shown."""

    def __init__(self, kind: str, entries: dict[str, str]):
        self.kind = kind
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> str:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def get_part(self, name: str):
        """The attribute ``name`` stands for (imports its module)."""
        module, _, attribute = self._entries[name].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def resolved(self) -> dict:
        """Every name with its part (imports the modules)."""
        return {name: self.get_part(name) for name in self._entries}

    def check(self, spec) -> None:
        """VseError unless ``spec`` is a name here or an import path (a user's own part)."""
        check_spec(spec, self.names, self.kind)


# ---------------------------------------------------------------------------- losses
LOSSES = Registry("loss", {
    "sh": "pipeline.models.losses:SumHingeLoss",              # VSE0: sum of hinges
    "mh": "pipeline.models.losses:MaxHingeLoss",              # VSE++: max of hinges (hardest negative)
    "order": "pipeline.models.losses:OrderLoss",              # order embeddings
    "lseh": "pipeline.models.losses:SemanticHardNegativeLoss",  # LSEH
    "ladder": "pipeline.models.losses:LadderLoss",            # the ladder loss
    "csn": "pipeline.models.losses:CrossModalInfoNCELoss",    # ConVSE
    "cmn": "pipeline.models.losses:HardestNegativeContrastiveLoss",  # ConVSE++
    "mvn": "pipeline.models.losses:MultiViewNTXentLoss",      # multi-view NT-Xent
})

# ---------------------------------------------------------------------------- image backbones
BACKBONES = Registry("backbone", {
    "efficientnet-lite0": "pipeline.models.backbones:efficientnet_lite0",
    "efficientnet-lite1": "pipeline.models.backbones:efficientnet_lite1",
    "efficientnet-lite2": "pipeline.models.backbones:efficientnet_lite2",
    "resnet152": "pipeline.models.backbones:resnet152",
    "vgg19": "pipeline.models.backbones:vgg19",
    "tiny": "pipeline.models.backbones:tiny",                 # fixed random weights, for tests
})

# ---------------------------------------------------------------------------- heads
# A vector's projection into the joint space: "linear" (VSE++), "mlp" (ConVSE's two layers).
PROJECTIONS = ("linear", "mlp")

# Set pools: a padded set of vectors → one vector, ``pool(x (B, K, E), lengths (B,))`` →
# (B, E). They pool image members (regions, grid cells) and caption tokens (BiGRU states, or
# cached token vectors) alike; a user's own pool is built as ``Class(dim=E, **options)``
# (``vse check-head`` runs its contract).
SET_POOLS = Registry("pool", {
    "mean": "pipeline.models.heads:MeanPool",  # masked mean
    "max": "pipeline.models.heads:MaxPool",    # masked max per dimension
    "gpo": "pipeline.models.heads:GPO",        # VSE∞'s Generalized Pooling Operator
})
IMAGE_POOLS = SET_POOLS.names
# "last": VSE++'s caption encoder (one-way GRU, its state after the last token; models.TextEncoder).
# A set pool over word tokens pools the states of a bidirectional GRU (gpo = VSE∞'s BiGRU
# encoder, heads.BiGRUTextEncoder); over cached token vectors it pools their per-token
# projection (heads.TokenSetTextEncoder).
LAST = "last"
TEXT_POOLS = (LAST, *SET_POOLS.names)

# Per-member projection of a set head (heads.SetImageHead): "linear" = fc(x) (VSE∞'s CNN-grid
# head); "linear+mlp" = fc(x) + MLP(x), MLP = Linear → BatchNorm1d → ReLU → Linear with hidden
# size embed/2 (VSE∞'s head over precomputed regions).
SET_PROJECTIONS = ("linear", "linear+mlp")

# Size augmentation of a training set (set_augment.size_augment): "precomp" = VSE∞'s rule for
# precomputed regions, "grid" = its rule for CNN grids.
SIZE_AUGMENT_RULES = ("precomp", "grid")

# ---------------------------------------------------------------------------- training
# Adam's kernels: the same update, rounded differently (PROTOCOL.md). "fused" is one pass over
# each parameter; "default" is PyTorch's own choice, which every run before the option used.
ADAM_KERNELS = ("fused", "default")
# RC mode's training crop: resize 256 + random 224 (VSE++), or a random-resized crop; + flip.
CROP_MODES = ("random", "random-resized")


def check_image_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in image pool or an import path."""
    check_spec(spec, IMAGE_POOLS, "pool")


def check_text_pool(spec) -> None:
    """VseError unless ``spec`` is a built-in text pool or an import path (a user's set pool)."""
    check_spec(spec, TEXT_POOLS, "pool")
