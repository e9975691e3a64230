"""Rebuilding a model from a checkpoint and encoding a split of a feature cache."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.core.runtime import precision
from pipeline.data.cache import FeatureCache
from pipeline.data.captions import CaptionEncoder, checkpoint_captions
from pipeline.models.vse_model import ModelConfig, VSEModel, model_of_checkpoint
from pipeline.text.vocabulary import Vocabulary


@dataclass
class SplitEmbeddings:
    images: np.ndarray         # (N, D) float32
    captions: np.ndarray       # (M, D) float32
    caption_image: np.ndarray  # (M,) local image index 0..N-1
    image_rows: np.ndarray     # (N,) rows of the cache
    caption_rows: np.ndarray   # (M,) caption indices of the cache
    similarity: str


@torch.no_grad()
def encode_split(model: VSEModel, cache: FeatureCache, captions: CaptionEncoder, split: str,
                 device: torch.device, max_images: int | None = None, batch_size: int = 512,
                 amp: bool = False) -> SplitEmbeddings:
    """Embeddings of ``split``'s images (the first ``max_images``) and their captions; in full
    fp32 unless ``amp`` (mixed precision on a GPU), so a checkpoint scores the same on any device
    up to float rounding."""
    was_training = model.training
    model.eval()
    try:
        image_rows, caption_rows, caption_image = cache.split_rows(split, max_images)
        image_chunks, caption_chunks = [], []
        for a in range(0, len(image_rows), batch_size):
            feats = cache.read(image_rows[a:a + batch_size])
            finite = np.isfinite(feats).reshape(len(feats), -1).all(axis=1)
            if not finite.all():
                raise VseError(f"the features of row {image_rows[a:a + batch_size][~finite][0]} "
                               f"(split {split!r}) hold NaN or Inf; `vse info` lists every such row",
                               cache.path)
            with precision(device, amp):
                image_chunks.append(model.image_encoder(torch.from_numpy(feats).to(device)).float().cpu())
        for a in range(0, len(caption_rows), batch_size):
            with precision(device, amp):
                emb = captions.embed(model.text_encoder, caption_rows[a:a + batch_size], device)
            caption_chunks.append(emb.float().cpu())
    finally:
        model.train(was_training)
    return SplitEmbeddings(torch.cat(image_chunks).numpy(), torch.cat(caption_chunks).numpy(),
                           caption_image, image_rows, caption_rows, model.config.similarity)


@dataclass
class LoadedModel:
    model: VSEModel
    vocab: Vocabulary | None  # None when the model embeds cached caption features
    state: dict

    @property
    def train_config(self) -> dict:
        return self.state["train_config"]

    def captions(self, cache: FeatureCache, text_features=None, checkpoint=None) -> CaptionEncoder:
        """The caption side of this model over ``cache``'s captions."""
        return checkpoint_captions(self.state, cache.captions, cache.path, text_features, checkpoint)


def load_model(checkpoint_path, device: torch.device) -> LoadedModel:
    """The model of a checkpoint file (of a cached-feature run), on ``device``, in eval mode."""
    return model_from_state(load_checkpoint(checkpoint_path), checkpoint_path, device)


def model_from_state(state: dict, checkpoint_path, device: torch.device) -> LoadedModel:
    """The model of a checkpoint already read (``load_checkpoint``): a caller that needs the
    state for more than the model reads the file once."""
    model = model_of_checkpoint(state, checkpoint_path)
    return LoadedModel(model.to(device).eval(), Vocabulary(state["vocab"]) if state["vocab"] else None, state)


def check_features_match(cache: FeatureCache, model_cfg: ModelConfig, feature_source: dict,
                         checkpoint_path) -> None:
    """A cache from another backbone than the one a model was trained on is refused clearly."""
    if cache.is_set != (model_cfg.image_pool is not None):
        held = f"sets ({cache.layout})" if cache.is_set else "one vector per image"
        wants = (f"sets pooled by {model_cfg.image_pool}" if model_cfg.image_pool is not None
                 else "one vector per image")
        raise VseError(f"the cache holds {held}, but the checkpoint {checkpoint_path} takes {wants}",
                       cache.path)
    if cache.feature_dim != model_cfg.feature_dim:
        raise VseError(f"features are {cache.feature_dim}-d but the checkpoint {checkpoint_path} expects "
                       f"{model_cfg.feature_dim}-d (different backbone?)", cache.path)
    expected = feature_source.get("backbone")
    actual = cache.attrs.get("backbone")
    if feature_source.get("finetuned"):
        raise VseError(f"the checkpoint {checkpoint_path} was fine-tuned end to end (RC): no feature cache "
                       f"holds its CNN's features; evaluate it on images with --root DATASET_DIR", cache.path)
    if expected and actual and expected != actual:
        raise VseError(f"features come from backbone {actual!r} but the checkpoint {checkpoint_path} was "
                       f"trained on {expected!r}", cache.path)


def embed_rc_checkpoint(checkpoint, dataset_kind: str, root, split: str, device: torch.device,
                        max_images: int | None = None, batch_size: int = 128,
                        amp: bool = False, dataset_options: dict | None = None) -> SplitEmbeddings:
    """Embeddings of a split of a dataset's images by an RC checkpoint (its own CNN weights,
    centre crops): how a fine-tuned model is evaluated, since no feature cache matches it."""
    from pipeline.data.image_source import ImageSource  # torchvision: only RC checkpoints pay for it

    state = load_checkpoint(checkpoint)
    if "backbone" not in state:
        raise VseError("not an RC checkpoint (no backbone weights): evaluate it on a feature cache",
                       checkpoint)
    config = state["train_config"]
    source = ImageSource(dataset_kind, root, state["backbone"]["name"],
                         weights=config.get("backbone_weights"), finetune=False, batch_size=batch_size,
                         dataset_options=dataset_options, grid=bool(state["backbone"].get("grid")))
    model = model_of_checkpoint(state, checkpoint, source.backbone).to(device)
    captions = checkpoint_captions(state, source.index.captions, root, checkpoint=checkpoint)
    return encode_split(model, source.index, captions, split, device, max_images=max_images,
                        batch_size=batch_size, amp=amp)
