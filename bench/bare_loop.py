"""The bare PyTorch loop of the fast loop's model (issue 50): a linear head over cached image vectors
and one over cached caption vectors, each L2-normalised, VSE++'s max of hinges (margin 0.2, pairs
of one image masked), Adam (fused, as `vse train`'s), clipping at 2, the forward under autocast
when given a dtype (as the run chooses). The cache lies on the device and each batch is gathered
there: no host → device copy, no host sync in the loop.
bench/dual_step.py times `vse train`'s Trainer against it (``ours_over_bare``)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn import functional as F


def bare_loop(images, vectors, caption_image, batch: int, embed: int, dtype=None, seed: int = 0):
    """``run(steps)``: that many steps over a fresh random order of the captions on the device."""
    torch.manual_seed(seed)
    device = images.device
    image_head = nn.Linear(images.shape[1], embed).to(device)
    text_head = nn.Linear(vectors.shape[1], embed).to(device)
    params = [*image_head.parameters(), *text_head.parameters()]
    opt = torch.optim.Adam(params, lr=2e-4, fused=True)
    cast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext

    def step(captions):
        ids = caption_image[captions]
        with cast():
            img, cap = image_head(images[ids]), text_head(vectors[captions])
        img, cap = F.normalize(img.float(), dim=1), F.normalize(cap.float(), dim=1)
        scores = img @ cap.t()
        diagonal = scores.diagonal()[:, None]
        same = ids[:, None] == ids[None, :]
        cost_c = (0.2 + scores - diagonal).clamp(min=0).masked_fill(same, 0)    # image → captions
        cost_i = (0.2 + scores - diagonal.t()).clamp(min=0).masked_fill(same, 0)  # caption → images
        loss = cost_c.max(1).values.sum() + cost_i.max(0).values.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 2.0)
        opt.step()
        return loss

    def run(steps: int):
        order = torch.randperm(len(vectors), device=device)
        loss = None
        for s in range(steps):
            start = (s * batch) % max(1, len(order) - batch + 1)
            loss = step(order[start:start + batch])
        return loss

    return run
