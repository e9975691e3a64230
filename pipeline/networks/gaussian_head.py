"""The variance head of probabilistic embeddings (PCME, PCME++): a dual network whose declared
similarity is probabilistic (``core.similarity.is_probabilistic``: ``csd``) gives each image and
caption as one vector ``[μ, v]``, its mean (the usual encoder, L2-normalised) and its log-variance
``v = log σ²`` from a second branch of the same architecture with its own weights and no
normalisation (the authors' ``std`` encoders: ``ProbEncoderImageAggrBUTD``'s second aggregator,
the text side's ``std_linear`` + ``std_gpool``). ``vse_model`` builds it for VSE++ and VSE∞ alike:
the image side inside ``ImageEncoder`` (one backbone pass and one size augmentation feed both
branches), the caption side as ``GaussianText`` over two caption encoders.
"""

from __future__ import annotations

import torch
from torch import nn


def without_norm(encoder: nn.Module) -> nn.Module:
    """``encoder`` set to give its raw output: no L2 norm, no absolute values (a log-variance)."""
    if hasattr(encoder, "no_txtnorm"):
        encoder.no_txtnorm = True
    elif hasattr(encoder, "no_imgnorm"):
        encoder.no_imgnorm = True
    else:
        encoder.normalize = False
    encoder.use_abs = False
    return encoder


class GaussianText(nn.Module):
    """Two caption encoders of one input: ``[mean(x), log_variance(x)]`` (B, 2E)."""

    def __init__(self, mean: nn.Module, log_variance: nn.Module):
        super().__init__()
        self.mean = mean
        self.log_variance = without_norm(log_variance)

    def forward(self, *captions) -> torch.Tensor:
        return torch.cat([self.mean(*captions), self.log_variance(*captions)], dim=-1)

    def load_word_vectors(self, vectors: torch.Tensor, mask: torch.Tensor) -> int:
        """GloVe init of both branches' word embeddings; the count of one."""
        self.log_variance.load_word_vectors(vectors, mask)
        return self.mean.load_word_vectors(vectors, mask)
