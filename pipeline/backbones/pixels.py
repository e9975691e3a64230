"""A CNN run on pixels inside training (RC mode): ``PixelBackbone`` (uint8 crops → features, the
CNN frozen or fine-tuned) and the one normalisation of pixels, ``pixel_constants`` +
``normalise_pixels``, which extraction's crops (``crops``) and RC training share. The model of a
run (``networks.vse_model.VSEModel``) is handed one as its ``backbone``.
"""

from __future__ import annotations

import torch
from torch import nn


def pixel_constants(mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """A CNN's per-channel normalisation on the 0..255 scale, shaped (1, 3, 1, 1)."""
    def scaled(values):
        return (torch.tensor(values, dtype=torch.float32) * 255).view(1, 3, 1, 1)
    return scaled(mean), scaled(std)


def normalise_pixels(pixels: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 RGB (B, 3, H, W) → float ``(x - mean) / std``, the input the CNN was trained on.
    The one normalisation of pixels: extraction (crops) and RC training (PixelBackbone)."""
    return (pixels.float() - mean) / std


class PixelBackbone(nn.Module):
    """uint8 RGB crops (B, 3, S, S) → (B, D) CNN features: the normalisation the CNN was
    trained with, then the CNN (RC mode: the features are computed inside every step).

    Frozen (``trainable=False``): no parameter takes a gradient and the CNN always runs in
    eval mode without autograd — fixed features, computed on the fly.  Trainable: with
    ``freeze_bn`` the BatchNorm layers keep their pretrained statistics (eval mode) while their
    affine weights still train, since statistics of small fine-tuning batches are noisy.
    """

    def __init__(self, cnn: nn.Module, mean, std, trainable: bool = False, freeze_bn: bool = True):
        super().__init__()
        # channels_last: faster convolutions on GPUs (tensor cores) and on CPUs (oneDNN)
        self.cnn = cnn.requires_grad_(trainable).to(memory_format=torch.channels_last)
        self.trainable = trainable
        self.freeze_bn = freeze_bn
        scaled_mean, scaled_std = pixel_constants(mean, std)
        self.register_buffer("mean", scaled_mean, persistent=False)
        self.register_buffer("std", scaled_std, persistent=False)
        self.train(self.training)

    def train(self, mode: bool = True) -> "PixelBackbone":
        super().train(mode)
        if not self.trainable:
            self.cnn.eval()
        elif self.freeze_bn:
            for module in self.cnn.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            x = normalise_pixels(pixels, self.mean, self.std)
            return self.cnn(x.contiguous(memory_format=torch.channels_last))
