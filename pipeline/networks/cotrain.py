"""Networks trained together (NCR's co-teaching): k copies of one network, each with its own
weights, seen by the trainer and the commands as one pairwise network.

- Training: ``forward`` gives every copy's (B, B) score matrix, stacked (k, B, B); the loss
  (``noisy_losses.NoisyPairLoss`` with ``networks = k``) decides how each copy learns from the
  others.
- Test: ``score`` is the mean of the copies' scores (NCR's rule), so ``vse evaluate`` and
  everything that reads a split's scores take it as any pairwise network.
- A copy is any network: dual (``VSEModel``: its score is the similarity of its two sides'
  vectors) or pairwise (SGR, SAF, a user's).
- A checkpoint's ``model_config`` is the copy's, with ``co_trained: k`` added; the weights are
  ``members.0.…``, ``members.1.…``.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.core.similarity import image_caption_scores
from pipeline.networks.network import at_least_float32, network_kind

CO_TRAINED_KEY = "co_trained"


class CoTrainedConfig:
    """The copy's config (its fields are read through this one) and the number of copies."""

    def __init__(self, members: int, member):
        self.members, self.member = int(members), member

    def __getattr__(self, name):
        if name in ("members", "member"):
            raise AttributeError(name)
        return getattr(self.member, name)

    def to_dict(self) -> dict:
        return {**self.member.to_dict(), CO_TRAINED_KEY: self.members}

    @property
    def similarity(self) -> str:
        return "cosine"  # the test score is the copies' mean score, read as a pairwise network's


class CoTrained(nn.Module):
    """k networks of one config trained together; at test time the mean of their scores."""

    kind = "pairwise"
    backbone = None

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"co-training needs at least 2 networks, got {len(members)}")
        self.members = nn.ModuleList(members)
        self.member_kind = network_kind(members[0])
        self.config = CoTrainedConfig(len(members), members[0].config)

    def forward(self, images: torch.Tensor, *captions, member: int | None = None) -> torch.Tensor:
        """(k, B, B): each copy's score matrix of the batch; (B, B): copy ``member``'s alone (a
        phase of NCR's schedule, which runs one network at a time)."""
        if member is not None:
            return self._scores(self.members[member], images, captions)
        return torch.stack([self._scores(m, images, captions) for m in self.members])

    def _scores(self, member: nn.Module, images: torch.Tensor, captions: tuple) -> torch.Tensor:
        if self.member_kind == "pairwise":
            return member(images, *captions)
        img, cap = member(images, *captions)
        return image_caption_scores(img.float(), cap.float(), member.config.similarity)

    def train_member(self, member: int) -> "CoTrained":
        """Copy ``member`` in train mode, the others fixed in eval mode (NCR: ``net.train_start()``,
        ``net2.val_start()``)."""
        self.train()
        for k, copy in enumerate(self.members):
            copy.train(k == member)
        return self

    def encode_images(self, images: torch.Tensor) -> list:
        if self.member_kind == "pairwise":
            return [member.encode_images(images) for member in self.members]
        return [member.image_encoder(at_least_float32(images)) for member in self.members]

    def encode_captions(self, *captions) -> list:
        if self.member_kind == "pairwise":
            return [member.encode_captions(*captions) for member in self.members]
        return [member.text_encoder(*captions) for member in self.members]

    def score(self, image_blocks: list, caption_blocks: list) -> torch.Tensor:
        """The mean of the copies' (Bi, Bc) scores."""
        total = None
        for member, images, captions in zip(self.members, image_blocks, caption_blocks):
            if self.member_kind == "pairwise":
                part = member.score(images, captions).float()
            else:
                part = image_caption_scores(images.float(), captions.float(), member.config.similarity)
            total = part if total is None else total + part
        return total / len(self.members)

    def auxiliary_losses(self, member: int | None = None) -> dict:
        """The copies' own loss terms of their last forward (``NAME/k``); only copy ``member``'s."""
        terms = {}
        for k, member_net in enumerate(self.members):
            if member is not None and k != member:
                continue
            own = getattr(member_net, "auxiliary_losses", None)
            for name, term in (own() if own is not None else {}).items():
                terms[f"{name}/{k}"] = term
        return terms

    def head_state_dict(self) -> dict:
        return self.state_dict()

    def pool_weights(self, sizes: dict | None = None) -> dict:
        return {}
