"""The crops a backbone sees: 1 centre crop, or 10 crops averaged (TenCrop).

- 1 crop: resize the shorter side to ``resize`` (256 for a 224 network), centre crop
  ``image_size`` (the torchvision ImageNet evaluation transform).
- 10 crops: resize to ``resize`` × ``resize`` (as the 10-crop features of Kiros et al. and
  VSE++), then the 4 corners and the centre and the same 5 of the horizontally flipped
  image (``torchvision.transforms.TenCrop`` order); features are averaged over the 10.

The work is split where it is cheapest: ``prepare`` (decode-side resize, in DataLoader
workers) produces a small uint8 tensor per image, all the same shape so images batch;
``network_input`` (on the compute device) cuts the crops of a whole batch at once,
normalises them and returns one (B·crops, 3, S, S) float tensor, so a 10-crop batch is a
single forward pass of 10·B images.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image

from pipeline.backbones.cnns import Preprocessing
from pipeline.backbones.pixels import normalise_pixels, pixel_constants
from pipeline.core.errors import VseError

CROP_COUNTS = (1, 10)


@dataclass(frozen=True)
class CropPlan:
    crops: int
    preprocessing: Preprocessing

    def __post_init__(self):
        if self.crops not in CROP_COUNTS:
            raise VseError(f"--crops must be 1 or 10, not {self.crops}")

    @property
    def resize_mode(self) -> str:
        return "shorter_side" if self.crops == 1 else "square"

    @property
    def prepared_shape(self) -> tuple[int, int, int]:
        side = self.preprocessing.image_size if self.crops == 1 else self.preprocessing.resize
        return (3, side, side)

    def prepare(self, image: Image.Image) -> torch.Tensor:
        """RGB PIL image → uint8 (3, H, W) of ``prepared_shape`` (runs in loader workers)."""
        p = self.preprocessing
        interpolation = TF.InterpolationMode(p.interpolation)
        if self.crops == 1:
            image = TF.center_crop(TF.resize(image, p.resize, interpolation=interpolation),
                                   p.image_size)
        else:
            image = TF.resize(image, [p.resize, p.resize], interpolation=interpolation)
        # contiguous CHW now (numpy's transpose copy): torch's strided uint8 copy of an HWC view,
        # as stacking pil_to_tensor's permuted views does, costs several times the decode when
        # torch runs more than one thread
        return torch.from_numpy(np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1)))

    def blank(self) -> torch.Tensor:
        """The stand-in for an image that could not be read."""
        return torch.zeros(self.prepared_shape, dtype=torch.uint8)

    def network_input(self, prepared: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
        """uint8 (B, 3, H, W) on the compute device → normalised float (B·crops, 3, S, S).

        Crops of one image are consecutive (image-major), as ``average`` expects.
        """
        mean, std = _scaled_mean_std(self.preprocessing.mean, self.preprocessing.std, prepared.device)
        x = normalise_pixels(prepared, mean, std)  # elementwise: before the crops, same bits
        if self.crops == 10:
            # cut from the float image: torch's strided copy of uint8 crop views took 2.8x as long
            x = torch.stack(TF.ten_crop(x, [self.preprocessing.image_size] * 2), dim=1).flatten(0, 1)
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x

    def average(self, features: torch.Tensor) -> torch.Tensor:
        """(B·crops, D) → (B, D) float32: the mean over each image's crops."""
        features = features.float()
        if self.crops == 1:
            return features
        return features.view(-1, self.crops, features.shape[-1]).mean(dim=1)


@functools.lru_cache(maxsize=8)
def _scaled_mean_std(mean, std, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalisation constants on the 0..255 scale, made once per device (not per batch)."""
    mean, std = pixel_constants(mean, std)
    return mean.to(device), std.to(device)
