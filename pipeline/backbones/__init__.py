"""Image backbones and how they run, for extraction and RC training: the CNNs with their
preprocessing (``cnns``: ``load_backbone``, ``Backbone``, ``Preprocessing``; the names in
``core.registry.BACKBONES``), the engines that run them (``engines``: torch, ONNX Runtime),
crops of an image (``crops``: ``CropPlan``) and pixels to features inside training
(``pixels``: ``PixelBackbone`` and the one normalisation of pixels).

The package hands on its public names (``from pipeline.backbones import load_backbone``): every
builder of ``core.registry.BACKBONES``, 0.1.0's names of ``pipeline.backbones`` (now ``cnns``)
and the parts below, each imported when first read, so ``import pipeline.backbones`` stays
torch-free.

May import: ``pipeline.core``.
"""

from __future__ import annotations

from pipeline.core.registry import BACKBONES, Registry

# name → "module:attribute" of every public name: the registry's builders, then the rest.
PUBLIC = Registry("name", {
    **{spec.rpartition(":")[2]: spec for spec in BACKBONES.values()},
    **{name: f"pipeline.backbones.cnns:{name}" for name in (
        "load_backbone", "Backbone", "Preprocessing", "GridSet", "BUILDERS", "BACKBONE_NAMES",
        "IMAGENET_MEAN", "IMAGENET_STD", "INCEPTION_MEAN", "INCEPTION_STD", "EFFICIENTNET_CROP_PADDING",
        "efficientnet_resize", "resize_for", "scaled", "TINY_SEED", "TINY_IMAGE_SIZE", "TINY_FEATURE_DIM")},
    "CropPlan": "pipeline.backbones.crops:CropPlan",
    "build_engine": "pipeline.backbones.engines:build_engine",
    **{name: f"pipeline.backbones.pixels:{name}" for name in ("PixelBackbone", "normalise_pixels",
                                                             "pixel_constants")},
})
__all__ = list(PUBLIC)

__getattr__, __dir__ = PUBLIC.face(globals())
