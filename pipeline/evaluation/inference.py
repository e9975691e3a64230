"""Rebuilding a model from a checkpoint and encoding a split of a feature cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.core.runtime import precision
from pipeline.data.cache import FeatureCache
from pipeline.data.captions import CaptionEncoder, checkpoint_captions
from pipeline.networks.network import at_least_float32, network_kind
from pipeline.networks.vse_model import model_of_checkpoint
from pipeline.text.vocabulary import Vocabulary


@dataclass
class SplitEmbeddings:
    """What a split's metrics read: embeddings of its images and captions, scored by
    ``similarity``. A pairwise network has no embeddings: its split is given as its (N, M)
    score matrix S, factored exactly as ``images = I_N`` and ``captions = Sᵀ`` (every
    ``images @ captions.T`` of the metrics then reads S itself, bit for bit), with
    ``pairwise`` set; nothing that indexes or searches embeddings takes such a split."""

    images: np.ndarray         # (N, D) float32
    captions: np.ndarray       # (M, D) float32
    caption_image: np.ndarray  # (M,) local image index 0..N-1
    image_rows: np.ndarray     # (N,) rows of the cache
    caption_rows: np.ndarray   # (M,) caption indices of the cache
    similarity: str
    pairwise: bool = False     # images = I_N, captions = Sᵀ (a pairwise network's scores)
    ensemble: int = 1          # how many networks' scores they hold (``ensemble_size``; averages sum)


def read_image_features(cache: FeatureCache, rows: np.ndarray, split: str) -> np.ndarray:
    """The cache's ``rows``; a VseError naming the first row holding NaN or Inf."""
    feats = cache.read(rows)
    finite = np.isfinite(feats).reshape(len(feats), -1).all(axis=1)
    if not finite.all():
        raise VseError(f"the features of row {rows[~finite][0]} (split {split!r}) hold NaN or Inf; "
                       "`vse info` lists every such row", cache.path)
    return feats


@torch.no_grad()
def encode_split(model, cache: FeatureCache, captions: CaptionEncoder, split: str,
                 device: torch.device, max_images: int | None = None, batch_size: int = 512,
                 amp: bool = False, progress: bool = False) -> SplitEmbeddings:
    """Embeddings of ``split``'s images (the first ``max_images``) and their captions; in full
    fp32 unless ``amp`` (mixed precision on a GPU), so a checkpoint scores the same on any device
    up to float rounding. A pairwise network's split is its score matrix (``score_split``)."""
    if network_kind(model) == "pairwise":
        return score_split(model, cache, captions, split, device, max_images, amp=amp, progress=progress)
    was_training = model.training
    model.eval()
    try:
        image_rows, caption_rows, caption_image = cache.split_rows(split, max_images)
        image_chunks, caption_chunks = [], []
        for a in range(0, len(image_rows), batch_size):
            feats = read_image_features(cache, image_rows[a:a + batch_size], split)
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


IMAGE_BLOCK = 128     # images encoded and scored at once by a pairwise network
CAPTION_BLOCK = 256   # captions (the network bounds its own intermediates within a block)


@torch.no_grad()
def score_split(model, cache: FeatureCache, captions: CaptionEncoder, split: str, device: torch.device,
                max_images: int | None = None, amp: bool = False, progress: bool = False,
                image_block: int = IMAGE_BLOCK, caption_block: int = CAPTION_BLOCK) -> SplitEmbeddings:
    """A pairwise network's scores of every image × caption pair of ``split``, in blocks of
    ``image_block`` × ``caption_block`` (each side encoded once; the network chunks a block so
    its intermediates stay within its memory budget), as ``SplitEmbeddings`` (I_N, Sᵀ).

    Under torchrun every rank must call it: the image blocks are dealt round-robin to the ranks,
    each scores its blocks against every caption, and the rows are gathered, so every rank ends
    with the whole S (the same numbers one process computes: a block's scores do not depend on
    which process makes them)."""
    from pipeline.core import distributed as dist
    from pipeline.core.progress import progress_bar

    was_training = model.training
    model.eval()
    try:
        image_rows, caption_rows, caption_image = cache.split_rows(split, max_images)
        n, m = len(image_rows), len(caption_rows)
        starts = [i * image_block for i in dist.dealt(-(-n // image_block))]  # this rank's image blocks
        blocks = []
        for a in starts:
            feats = read_image_features(cache, image_rows[a:a + image_block], split)
            with precision(device, amp):
                blocks.append(model.encode_images(at_least_float32(torch.from_numpy(feats).to(device))))
        mine = {a: torch.empty(min(image_block, n - a), m, dtype=torch.float32) for a in starts}
        total = sum(len(rows) for rows in mine.values()) * m
        with progress_bar(total, desc=f"scoring {split}", unit="pair", disable=not progress) as bar:
            for b in range(0, m, caption_block):
                text = captions.batch(caption_rows[b:b + caption_block])
                with precision(device, amp):
                    encoded = model.encode_captions(text[0].to(device), *text[1:])
                    for a, block in zip(starts, blocks, strict=True):
                        part = model.score(block, encoded).float().cpu()
                        mine[a][:, b:b + part.shape[1]] = part
                        bar.update(part.numel())
    finally:
        model.train(was_training)
    scores = torch.empty(n, m, dtype=torch.float32)
    for a, rows in dist.gather_dealt(mine).items():
        scores[a:a + len(rows)] = rows
    if not torch.isfinite(scores).all():
        raise VseError(f"the network's scores of split {split!r} hold NaN or Inf", cache.path)
    return SplitEmbeddings(np.eye(n, dtype=np.float32), scores.T.contiguous().numpy(), caption_image,
                           image_rows, caption_rows, "cosine", pairwise=True)


@dataclass
class LoadedModel:
    model: torch.nn.Module      # a VSEModel (dual) or a pairwise network
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


def check_features_match(cache: FeatureCache, model, feature_source: dict, checkpoint_path) -> None:
    """A cache from another backbone than the one a model was trained on is refused clearly."""
    cfg = model.config
    kind = getattr(model, "member_kind", None) or network_kind(model)  # co-trained copies: the copy's
    takes_sets = kind == "pairwise" or cfg.image_pool is not None
    if cache.is_set != takes_sets:
        held = f"sets ({cache.layout})" if cache.is_set else "one vector per image"
        wants = ("one vector per image" if not takes_sets else f"sets pooled by {cfg.image_pool}"
                 if kind == "dual" else f"sets (network {cfg.network})")
        raise VseError(f"the cache holds {held}, but the checkpoint {checkpoint_path} takes {wants}",
                       cache.path)
    if cache.feature_dim != cfg.feature_dim:
        raise VseError(f"features are {cache.feature_dim}-d but the checkpoint {checkpoint_path} expects "
                       f"{cfg.feature_dim}-d (different backbone?)", cache.path)
    if kind == "pairwise" and cache.set_size != cfg.set_size:
        raise VseError(f"sets of {cache.set_size} members, but network {cfg.network} of {checkpoint_path} "
                       f"was trained on sets of {cfg.set_size} (its layers are per member slot)", cache.path)
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
    emb = encode_split(model, source.index, captions, split, device, max_images=max_images,
                       batch_size=batch_size, amp=amp)
    return dataclasses.replace(emb, ensemble=ensemble_size(state))


def ensemble_size(state: dict) -> int:
    """How many networks' scores a checkpoint's model averages at test time: the copies trained
    together (``networks.cotrain``: ncr's 2, any method built on that seam), else 1
    (docs/PROTOCOL.md, "Ensemble size")."""
    from pipeline.networks.cotrain import CO_TRAINED_KEY

    return int((state.get("model_config") or {}).get(CO_TRAINED_KEY) or 1)


def member_network(loaded: LoadedModel, member: int, checkpoint) -> torch.nn.Module:
    """Network ``member`` of a co-trained checkpoint's copies, to be evaluated alone (``--member``);
    a VseError when the checkpoint holds one network or fewer than ``member + 1``."""
    size = ensemble_size(loaded.state)
    if size < 2:
        raise VseError(f"--member {member}: the checkpoint holds one network (not trained together with "
                       "others): evaluate it whole", checkpoint)
    if not 0 <= member < size:
        raise VseError(f"--member {member}: the checkpoint holds networks 0 to {size - 1}", checkpoint)
    return loaded.model.members[member].eval()


def embed_member(checkpoint, cache: FeatureCache, split: str, device: torch.device, member: int,
                 amp: bool = False, text_features=None) -> SplitEmbeddings:
    """``split`` of ``cache`` as network ``member`` of a co-trained checkpoint alone scores it
    (``member_network``): its own embeddings (a dual copy) or its own scores (a pairwise one)."""
    loaded = load_model(checkpoint, device)
    network = member_network(loaded, member, checkpoint)
    check_features_match(cache, loaded.model, loaded.state.get("feature_source", {}), checkpoint)
    captions = loaded.captions(cache, text_features, checkpoint)
    return encode_split(network, cache, captions, split, device, amp=amp, progress=True)
