"""RC mode: the pair source that reads images, so the CNN runs inside every training step.

Training crops (VSE++ "RC"): resize the shorter side to the backbone's ``resize`` (256 for a
224 network), a random ``image_size`` crop and a random horizontal flip; or, with
``crop="random-resized"``, torchvision's RandomResizedCrop rule (area 8–100 %, aspect 3/4–4/3)
and the flip.  Validation and evaluation use the centre crop — the transform of
``vse extract --crops 1`` — through the current CNN, so a frozen RC model is tested on exactly
the features a 1-crop cache of the same backbone holds.

Every crop is drawn from an RNG keyed by (seed, epoch, position of the pair in the epoch):
a resumed run gets the same crops, and the crops depend neither on the batch size nor on the
number of loader workers or processes (N processes × B see the crops of one batch of N×B).
Images are decoded and cropped in DataLoader workers and travel as uint8; the model's
``PixelBackbone`` normalises them on the compute device.

Checkpoints of RC runs hold the head (projection + text encoder) under ``model`` — as a
cached run's do, so either initialises the other — and the CNN under ``backbone``:
``{"name", "weights_sha256", "finetune", "state"}``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from pipeline.backbones.cnns import Preprocessing, load_backbone
from pipeline.backbones.crops import CropPlan
from pipeline.backbones.pixels import PixelBackbone
from pipeline.core.errors import VseError
from pipeline.core.registry import CROP_MODES
from pipeline.core.runtime import default_workers
from pipeline.data.caption_index import IndexedRows
from pipeline.data.readers import load_dataset, open_image
from pipeline.networks.vse_model import VSEModel, model_of_checkpoint

RESIZED_CROP_AREA = (0.08, 1.0)
RESIZED_CROP_ASPECT = (3 / 4, 4 / 3)


@dataclass(frozen=True)
class RandomCrops:
    """Training inputs of RC mode (``batches.ImageInputs``): uint8 (B, 3, S, S) random crops."""

    paths: list[Path]
    preprocessing: Preprocessing
    mode: str
    seed: int

    def batch(self, rows: np.ndarray, epoch: int, positions: np.ndarray) -> torch.Tensor:
        side = self.preprocessing.image_size
        out = torch.empty((len(rows), 3, side, side), dtype=torch.uint8)
        for k, (row, position) in enumerate(zip(rows.tolist(), positions.tolist())):
            rng = np.random.default_rng([self.seed, epoch, position])
            out[k] = self.crop(open_image(self.paths[row]), rng)
        return out

    def crop(self, image: Image.Image, rng: np.random.Generator) -> torch.Tensor:
        p = self.preprocessing
        interpolation = TF.InterpolationMode(p.interpolation)
        if self.mode == "random":
            image = TF.resize(image, p.resize, interpolation=interpolation)
            top = int(rng.integers(0, image.height - p.image_size + 1))
            left = int(rng.integers(0, image.width - p.image_size + 1))
            image = image.crop((left, top, left + p.image_size, top + p.image_size))
        else:
            top, left, height, width = resized_crop_box(image.height, image.width, rng)
            image = TF.resized_crop(image, top, left, height, width, [p.image_size] * 2,
                                    interpolation=interpolation)
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return TF.pil_to_tensor(image)


def resized_crop_box(height: int, width: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, h, w) by torchvision's RandomResizedCrop rule, from ``rng``: up to 10 draws
    of area and log-uniform aspect; the centre crop of the clamped aspect if none fits."""
    area = height * width
    log_aspect = np.log(RESIZED_CROP_ASPECT)
    for _ in range(10):
        target = area * rng.uniform(*RESIZED_CROP_AREA)
        aspect = math.exp(rng.uniform(*log_aspect))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    aspect = width / height
    if aspect < RESIZED_CROP_ASPECT[0]:
        w, h = width, round(width / RESIZED_CROP_ASPECT[0])
    elif aspect > RESIZED_CROP_ASPECT[1]:
        w, h = round(height * RESIZED_CROP_ASPECT[1]), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class ImageIndex(IndexedRows):
    """The RC counterpart of a ``FeatureCache``: the index `vse extract` writes for this
    dataset (all its splits, so caption indices — and relevance files — agree with a default
    cache), and ``read(rows)`` → uint8 centre crops instead of features."""

    def __init__(self, dataset, preprocessing: Preprocessing, attrs: dict):
        rows, self.index = dataset.select()
        self.path = Path(dataset.root)
        self.paths = [dataset.image_paths[r] for r in rows]
        self.attrs = attrs
        self._centre = CropPlan(1, preprocessing)

    def read(self, rows) -> np.ndarray:
        """Centre crops of ``rows`` (decoded in threads: PIL releases the GIL while decoding)."""
        with ThreadPoolExecutor(max(1, default_workers())) as pool:
            crops = list(pool.map(lambda row: self._centre.prepare(open_image(self.paths[row])),
                                  np.asarray(rows).tolist()))
        return torch.stack(crops).numpy()


class ImageSource:
    """The pair source of RC mode (``batches.PairSource``): a dataset's images and a CNN."""

    def __init__(self, dataset_kind: str, root, backbone: str, *, weights=None, finetune: bool = False,
                 freeze_bn: bool = True, crop: str = "random", seed: int = 0, batch_size: int = 128,
                 dataset_options: dict | None = None, grid: bool = False):
        """``grid``: the CNN gives the set of its last feature map's cells (VSE∞'s grid features,
        pooled by the model's set head) instead of their mean."""
        if crop not in CROP_MODES:
            raise VseError(f"--crop must be one of {', '.join(CROP_MODES)}, not {crop!r}")
        # dataset_options: load_dataset's options for the kind (datasets.dataset_options: the csv layout)
        dataset = load_dataset(dataset_kind, root, **(dataset_options or {}))
        if dataset.image_paths is None:
            raise VseError("--rc needs images; this dataset has only precomputed features", dataset.root)
        loaded = load_backbone(backbone, weights, grid=grid)
        p = loaded.preprocessing
        self.backbone = PixelBackbone(loaded.module, p.mean, p.std, trainable=finetune, freeze_bn=freeze_bn)
        if finetune:
            freeze_unused_parameters(self.backbone, p.image_size)
        self.backbone_name, self.weights_sha256 = loaded.name, loaded.weights_sha256
        self.feature_dim = loaded.feature_dim
        self.set_kind = "grid" if grid else None
        self.image_pipeline = None  # the checkpoint's backbone entry and its name say it all
        name = loaded.name if not finetune else f"{loaded.name}, fine-tuned end to end (RC)"
        self.feature_source = {"backbone": name, "crops": 1, "dataset": dataset_kind, "finetuned": finetune,
                               **({"grid": list(loaded.grid)} if grid else {})}
        self.index = ImageIndex(dataset, p, {**self.feature_source, "image_size": p.image_size})
        self.inputs = RandomCrops(self.index.paths, p, crop, seed)
        self.location = str(dataset.root)
        self.encode_batch_size = batch_size

    def checkpoint_entry(self, backbone: PixelBackbone) -> dict:
        """The ``backbone`` entry of an RC checkpoint (tensors and plain values only)."""
        return {"name": self.backbone_name, "weights_sha256": self.weights_sha256,
                "finetune": backbone.trainable, "grid": self.set_kind == "grid",
                "state": backbone.cnn.state_dict()}


def freeze_unused_parameters(backbone: PixelBackbone, side: int) -> list[str]:
    """Freeze parameters the forward pass never reaches (efficientnet's ImageNet classifier,
    kept by the backbone for checks): DDP would wait for their gradients forever."""
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.enable_grad():
            backbone(torch.zeros(2, 3, side, side, dtype=torch.uint8)).float().sum().backward()
    finally:
        backbone.train(was_training)
    unused = []
    for name, parameter in backbone.named_parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.requires_grad_(False)
            unused.append(name)
        parameter.grad = None
    return unused


def rc_model(state: dict, checkpoint) -> tuple[VSEModel, Preprocessing]:
    """The model of an RC checkpoint with the CNN weights it carries, frozen, in eval mode on
    the CPU, and the CNN's preprocessing (`vse embed`)."""
    entry = state["backbone"]
    loaded = load_backbone(entry["name"], state["train_config"].get("backbone_weights"),
                           grid=bool(entry.get("grid")))
    p = loaded.preprocessing
    backbone = PixelBackbone(loaded.module, p.mean, p.std, trainable=False)
    model = model_of_checkpoint(state, checkpoint, backbone)
    return model.eval(), p
