"""The tiny scorer of the ``ncr`` golden bundles (scripts/golden_ncr.py runs it inside the authors'
``SGRAF`` class, tests/test_ncr_golden.py inside ours): any differentiable (B, B) scores serve a
loss, and a BatchNorm makes eval mode (NCR's predictions, the fixed network) differ from train
mode (the trained network's steps), as SGRAF's SAF does."""

from __future__ import annotations

import torch
from torch import nn

FEATURE_DIM, VOCAB, WORD_DIM, DIM = 5, 9, 4, 6


class ImagePart(nn.Module):
    """SGRAF's ``img_enc``: Linear then BatchNorm1d."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(FEATURE_DIM, DIM)
        self.bn = nn.BatchNorm1d(DIM)

    def forward(self, images):
        return self.bn(self.fc(images))


class TextPart(nn.Module):
    """SGRAF's ``txt_enc(captions, lengths)``: the mean of the valid words' vectors, then Linear."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(VOCAB, WORD_DIM)
        self.fc = nn.Linear(WORD_DIM, DIM)

    def forward(self, tokens, lengths):
        lengths = torch.as_tensor(lengths, device=tokens.device)
        valid = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]
        words = self.words(tokens) * valid[..., None]
        return self.fc(words.sum(1) / lengths[:, None].to(words.dtype))


class ScorePart(nn.Module):
    """SGRAF's ``sim_enc(img, cap, lengths)``, (n_image, n_caption): sigmoid(a·cos + b)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(4.0))
        self.bias = nn.Parameter(torch.tensor(-0.3))

    def forward(self, img, cap, lengths=None):
        img = img / img.norm(dim=1, keepdim=True)
        cap = cap / cap.norm(dim=1, keepdim=True)
        return torch.sigmoid(self.scale * img @ cap.T + self.bias)


class TinyScorer(nn.Module):
    """A pairwise network (``kind``) of the three parts, as ``CoTrained`` takes one."""

    kind = "pairwise"
    config = None

    def __init__(self):
        super().__init__()
        self.image, self.text, self.score = ImagePart(), TextPart(), ScorePart()

    def forward(self, images, tokens, lengths):
        return self.score(self.image(images), self.text(tokens, lengths), lengths)
