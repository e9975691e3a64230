"""Re-ranking a dual network's shortlist with a pairwise network, measured against exhaustive scoring.

A pairwise network (SGR, SAF) scores every image × caption pair jointly: 5M pairs for the
Flickr8k test split. Deployed, it re-ranks the top ``k`` of a dual network, whose vectors a
FAISS index searches. ``rerank_split`` measures that on a split, with the metrics of
``pipeline.evaluation.metrics``:

- the dual network's scores give each image query its top ``k`` captions and each caption
  query its top ``k`` images (ties at the k-th place: ``torch.topk``'s choice);
- the pairwise network scores only the pairs of some shortlist, once each;
- an image query's ranking is its shortlist by the pairwise scores, then every other caption
  by the dual scores (so R@K for K <= k is the re-ranked search's, and the ranks beyond k are
  the dual network's); the same for a caption query with its own shortlist.

With ``k`` >= the number of candidates, every pair is scored and the metrics are exhaustive
scoring's; with ``k = 1`` the first hit is the dual network's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.runtime import precision
from pipeline.core.similarity import image_caption_scores
from pipeline.data.cache import FeatureCache
from pipeline.data.captions import CaptionEncoder
from pipeline.evaluation.inference import CAPTION_BLOCK, IMAGE_BLOCK, SplitEmbeddings, read_image_features
from pipeline.evaluation.metrics import retrieval_metrics, similarity_ranks
from pipeline.networks.network import at_least_float32, network_kind


@dataclass
class Reranked:
    """Both directions' rankings as (N, M) matrices whose row / column order is the ranking."""

    i2t: torch.Tensor          # (N, M) float64, image queries: ranked along each row
    t2i: torch.Tensor          # (N, M) float64, caption queries: ranked along each column
    caption_image: np.ndarray
    pairs_scored: int          # pairs the pairwise network scored
    k: int

    @property
    def pairs(self) -> int:
        return self.i2t.numel()

    def metrics(self) -> dict:
        """R@K, medr, meanr and rsum: the image queries' from ``i2t``, the captions' from ``t2i``."""
        eye = torch.eye(len(self.i2t), dtype=self.i2t.dtype)
        i2t, _ = similarity_ranks(eye, self.i2t.T.contiguous(), self.caption_image)
        _, t2i = similarity_ranks(eye, self.t2i.T.contiguous(), self.caption_image)
        return retrieval_metrics(i2t, t2i)


def shortlists(dual_scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, M) boolean masks: each image's top ``k`` captions, each caption's top ``k`` images."""
    if k < 1:
        raise VseError(f"--shortlist-k must be at least 1, not {k}")
    n, m = dual_scores.shape
    i2t = torch.zeros(n, m, dtype=torch.bool)
    i2t.scatter_(1, dual_scores.topk(min(k, m), dim=1).indices, True)
    t2i = torch.zeros(n, m, dtype=torch.bool)
    t2i.scatter_(0, dual_scores.topk(min(k, n), dim=0).indices, True)
    return i2t, t2i


@torch.no_grad()
def rerank_split(model, cache: FeatureCache, captions: CaptionEncoder, split: str, device: torch.device,
                 dual: SplitEmbeddings, k: int, amp: bool = False, model_path=None,
                 dual_path=None) -> Reranked:
    """The pairwise ``model`` re-ranking the top ``k`` of the dual split ``dual`` (the same rows of
    ``split``; see the module's text). Each image is encoded once and scored against the captions
    of its pairs, in chunks of ``CAPTION_BLOCK``. ``model_path``, ``dual_path``: the checkpoints, named
    by an error about them (the cache otherwise)."""
    check_kinds(model, dual.pairwise, model_path or cache.path, dual_path or cache.path)
    image_rows, caption_rows, caption_image = cache.split_rows(split)
    if not (np.array_equal(dual.image_rows, image_rows) and np.array_equal(dual.caption_rows, caption_rows)):
        raise VseError(f"the shortlist's network was evaluated on other rows of split {split!r}: give both "
                       "the caches of one dataset", cache.path)
    dual_scores = image_caption_scores(torch.from_numpy(dual.images), torch.from_numpy(dual.captions),
                                       dual.similarity).double()
    to_captions, to_images = shortlists(dual_scores, k)
    needed = to_captions | to_images
    scores = torch.full(dual_scores.shape, float("nan"), dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for a in range(0, len(image_rows), IMAGE_BLOCK):
            feats = torch.from_numpy(read_image_features(cache, image_rows[a:a + IMAGE_BLOCK], split))
            for i in range(len(feats)):
                columns = torch.nonzero(needed[a + i])[:, 0]
                with precision(device, amp):
                    image = model.encode_images(at_least_float32(feats[i:i + 1].to(device)))
                for b in range(0, len(columns), CAPTION_BLOCK):
                    chunk = columns[b:b + CAPTION_BLOCK]
                    text = captions.batch(caption_rows[chunk.numpy()])
                    with precision(device, amp):
                        encoded = model.encode_captions(text[0].to(device), *text[1:])
                        scores[a + i, chunk] = model.score(image, encoded)[0].float().cpu().double()
    finally:
        model.train(was_training)
    if not torch.isfinite(scores[needed]).all():
        raise VseError(f"the network's scores of split {split!r} hold NaN or Inf", model_path or cache.path)
    return Reranked(*rerank(dual_scores, scores, to_captions, to_images), caption_image, int(needed.sum()), k)


def check_kinds(model, dual_is_pairwise: bool, model_path, dual_path) -> None:
    """VseError naming the checkpoint at fault unless ``model`` is a pairwise network and the
    shortlist's network a dual one (before the split is embedded)."""
    if network_kind(model) != "pairwise":
        raise VseError("re-ranking takes a pairwise network (sgr, saf, ...); this checkpoint is a dual one",
                       model_path)
    if dual_is_pairwise:
        raise VseError("the shortlist comes from a dual network's vectors; this checkpoint is a pairwise one",
                       dual_path)


def rerank(dual_scores: torch.Tensor, scores: torch.Tensor, to_captions: torch.Tensor,
           to_images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (i2t, t2i) ranking matrices: in each query's shortlist its pairwise ``scores``, lifted
    above every dual score, and elsewhere the dual scores (float64, where adding the lift keeps
    every float32 score distinct and in order). ``scores`` is read only inside the shortlists."""
    scores, dual_scores = scores.double(), dual_scores.double()
    lift = float(dual_scores.max() - scores[to_captions | to_images].min()) + 1.0
    lifted = scores + lift
    return torch.where(to_captions, lifted, dual_scores), torch.where(to_images, lifted, dual_scores)
