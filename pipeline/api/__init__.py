"""The Python API (docs/api.md): what the commands do, called from a notebook or a script, with
the same code (open_clip's style: a model loaded once, then plain calls).

- ``load_model(checkpoint)`` → a ``Model``: ``embed_images`` (image files, PIL images or pixel
  arrays through the pipeline the model's cache was made with, as `vse embed` does; or rows of a
  feature cache, as `vse evaluate` reads them), ``embed_captions`` (texts through the model's
  caption side), ``score`` (images × captions by the model's similarity);
- ``evaluate(checkpoint, split)`` → the metrics `vse evaluate --checkpoint … --json` prints;
- ``train(config, run_dir)`` → the run folder `vse train` makes of the same options.

``pipeline.load_model``, ``pipeline.Model``, ``pipeline.evaluate`` and ``pipeline.train`` are these
names, imported when first read (``import pipeline`` stays light).

May import: every other package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError

__all__ = ["Model", "evaluate", "load_model", "train"]

BATCH_SIZE = 128  # images or cache rows embedded at once


class Model:
    """A checkpoint's model with its own image and caption inputs, loaded once (``load_model``).

    Every embedding is a float32 (n, D) array of unit rows, the rows `vse embed` writes. A
    pairwise network (SGR, SAF, NCR's co-trained pair) has no embeddings: ``load_model`` refuses
    its checkpoint in one line, and ``evaluate`` scores its splits."""

    def __init__(self, embedder):
        self.embedder = embedder  # the Embedder of `vse embed` (pipeline.search.embed)

    @property
    def network(self):
        """The torch module (in eval mode, on ``device``)."""
        return self.embedder.model

    @property
    def checkpoint(self) -> Path:
        return self.embedder.checkpoint

    @property
    def device(self):
        return self.embedder.device

    @property
    def dim(self) -> int:
        """D, the joint space's dimension."""
        return self.embedder.dim

    @property
    def width(self) -> int:
        """The columns of an embedding row: D, or 2·D for a probabilistic model (PCME, PCME++:
        the unit mean, then its log-variance, as `vse embed` writes them)."""
        return self.embedder.width

    @property
    def similarity(self) -> str:
        """How ``score`` compares an image with a caption (``core.similarity``)."""
        return self.embedder.similarity

    def __repr__(self) -> str:
        return f"Model({str(self.checkpoint)!r}, dim={self.dim}, similarity={self.similarity!r})"

    # ---------------------------------------------------------------- captions
    def embed_captions(self, captions) -> np.ndarray:
        """(m, D) rows of ``captions`` (a list of strings, or one string) by the model's caption
        side: its vocabulary and GRU, or the frozen encoder its caption features were made by."""
        texts = [captions] if isinstance(captions, str) else list(captions)
        wrong = next((k for k, text in enumerate(texts) if not isinstance(text, str)), None)
        if wrong is not None:
            raise VseError(f"captions: item {wrong} is a {type(texts[wrong]).__name__}, not a string")
        return self.embedder.embed_texts(texts)

    # ---------------------------------------------------------------- images
    def embed_images(self, images=None, *, cache=None, rows=None, split: str | None = None,
                     batch_size: int = BATCH_SIZE) -> np.ndarray:
        """(n, D) rows of ``images`` or of a feature cache's rows.

        ``images``: a list of image files (paths), PIL images or uint8 pixel arrays (H, W, 3)
        RGB or (H, W) grey, or one of them, or an (n, H, W, 3) array; each goes through the
        backbone, crops and engine the model's features were made with (the checkpoint's
        ``image_pipeline``), then the model's image head, as `vse embed` does.
        ``cache``: instead, a feature cache (`vse extract`'s file) whose features the model was
        trained on: its ``rows`` (image rows, any order), or the images of ``split``, or all of
        them, through the image head only, as `vse evaluate` reads them."""
        if (images is None) == (cache is None):
            raise VseError("embed_images: give images (files, PIL images or pixel arrays) or cache=, "
                           "one of them")
        if cache is None:
            if rows is not None or split is not None:
                raise VseError("embed_images: rows= and split= choose rows of cache=")
            items = _image_list(images)
            out = [self.embedder.embed_images(items[a:a + batch_size])
                   for a in range(0, len(items), batch_size)]
            return np.concatenate(out) if out else np.zeros((0, self.width), np.float32)
        return self._embed_cache_rows(cache, rows, split, batch_size)

    def _embed_cache_rows(self, cache, rows, split, batch_size: int) -> np.ndarray:
        import torch

        from pipeline.core.runtime import precision
        from pipeline.data.cache import FeatureCache
        from pipeline.evaluation.inference import check_features_match, read_image_features

        if rows is not None and split is not None:
            raise VseError("embed_images: give rows= or split=, not both")
        with FeatureCache(cache) as features:
            check_features_match(features, self.network, self.embedder.state.get("feature_source", {}),
                                 self.checkpoint)
            if split is not None:
                rows = features.split_rows(split)[0]
            rows = np.arange(features.num_images) if rows is None else np.asarray(rows).reshape(-1)
            last = features.num_images - 1
            if rows.size and (rows.dtype.kind not in "iu" or rows.min() < 0 or rows.max() > last):
                raise VseError(f"rows= must be image rows 0..{last}", cache)
            out = []
            with torch.no_grad():
                for a in range(0, len(rows), batch_size):
                    x = read_image_features(features, rows[a:a + batch_size], split or "any")
                    with precision(self.device, False):  # full fp32, as `vse evaluate`
                        emb = self.network.image_encoder(torch.from_numpy(x).to(self.device))
                    out.append(self.embedder.unit(emb))  # unit rows (a probabilistic model's: unit means)
        return np.concatenate(out) if out else np.zeros((0, self.width), np.float32)

    # ---------------------------------------------------------------- scores
    def score(self, images, captions) -> np.ndarray:
        """(n, m) scores of every image × caption pair by the model's similarity (``core.similarity``:
        the inner product of unit rows for ``cosine``, the order score for ``order``), so that
        ``score(...)[i].argsort()[::-1]`` ranks captions for image i.

        ``images``: what ``embed_images`` takes, or its (n, D) float rows; ``captions``: strings,
        or ``embed_captions``' (m, D) float rows."""
        import torch

        from pipeline.core.similarity import image_caption_scores

        image_rows = images if _embedded(images) else self.embed_images(images)
        caption_rows = captions if _embedded(captions) else self.embed_captions(captions)
        for name, given in (("images", image_rows), ("captions", caption_rows)):
            if given.shape[1] != self.width:
                raise VseError(f"score: {name} are {given.shape[1]}-d rows; this model's are {self.width}-d")
        with torch.no_grad():
            scores = image_caption_scores(torch.from_numpy(np.asarray(image_rows, np.float32)),
                                          torch.from_numpy(np.asarray(caption_rows, np.float32)),
                                          self.similarity)
        return scores.numpy()


def _embedded(value) -> bool:
    """Rows already embedded: a 2-D float array."""
    return isinstance(value, np.ndarray) and value.ndim == 2 and value.dtype.kind == "f"


def _image_list(images) -> list:
    """Each image of ``images`` as a path or an RGB PIL image (pixel arrays converted, and checked
    by the rule every decoded image passes: ``image_shape_problem``)."""
    from PIL import Image

    from pipeline.data.readers.base import image_shape_problem

    if isinstance(images, np.ndarray):
        images = list(images) if images.ndim == 4 else [images]
    elif isinstance(images, (str, Path, Image.Image)):
        images = [images]
    out = []
    for k, image in enumerate(images):
        if isinstance(image, (str, Path)):
            out.append(image)  # opened (and checked) by the embedder: open_image
            continue
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or not (image.ndim == 2 or image.ndim == 3 and image.shape[2] == 3):
                raise VseError(f"images: item {k} is a {image.dtype} array of shape {image.shape}; a pixel "
                               "array is uint8 (H, W, 3) RGB or (H, W) grey")
            image = Image.fromarray(image)
        elif not isinstance(image, Image.Image):
            raise VseError(f"images: item {k} is a {type(image).__name__}; give image files, PIL images or "
                           "uint8 pixel arrays")
        problem = image_shape_problem(*image.size)
        if problem:
            raise VseError(f"images: item {k} {problem}")
        out.append(image.convert("RGB"))
    return out


def load_model(checkpoint, device: str = "auto", features=None) -> Model:
    """The model of ``checkpoint`` (a run's ``best.pt`` or ``last.pt``), loaded once, on ``device``
    ("auto", "cpu", "cuda", ...). ``features``: the feature cache whose pipeline embeds image
    files, when the checkpoint does not record it (`vse embed --features`)."""
    from pipeline.search.searcher import load_embedder

    if features is None:
        return Model(load_embedder(checkpoint, device))
    from pipeline.search.embed import Embedder

    return Model(Embedder.from_checkpoint(checkpoint, device, features))


def evaluate(checkpoint, split: str = "test", features=None, *, protocol: str = "single", root=None,
             dataset: str = "flickr8k", device: str = "auto", echo: Callable[[str], None] = print) -> dict:
    """The metrics of ``checkpoint`` on ``split``: the dict `vse evaluate --checkpoint … --json`
    prints (R@K both ways, median and mean ranks, rsum, ...; ``pipeline.evaluation.metric_table``).

    ``features``: the feature cache (default: the one the run trained on, as its checkpoint names
    it); ``root``: instead, the dataset folder whose images an RC checkpoint embeds with its own
    CNN (``dataset``: its layout). ``protocol``: "single", "5fold" (COCO 1K) or "5k". ``echo``
    says the evaluation's notes."""
    from pipeline.core.runtime import resolve_device
    from pipeline.evaluation.command import evaluate_checkpoint

    if features is None and root is None:
        from pipeline.core.checkpoint import load_checkpoint

        features = load_checkpoint(checkpoint)["train_config"].get("features")
        if not features:
            raise VseError("the checkpoint names no feature cache: give features=CACHE.h5 (or "
                           "root=DATASET_DIR for an RC run)", checkpoint)
    evaluation = evaluate_checkpoint(str(checkpoint), resolve_device(device), features=features, root=root,
                                     dataset_kind=dataset, split=split, protocol=protocol, echo=echo)
    return evaluation.as_dict()


def train(config: Mapping, run_dir, *, overwrite: bool = False, resume: bool = False,
          echo: Callable[[str], None] = print) -> Path:
    """Train a run into ``run_dir`` from ``config``, a dict of `vse train`'s options by name (as a
    ``--config`` file holds them: ``{"features": "cache/x.h5", "loss": "mh", "epochs": 2}``;
    ``loss_options`` and ``network_options`` as dicts; every option and its default:
    docs/OPTIONS.md), and return the folder. The same run as `vse train --config`: the same
    checks, the same folder rules (``overwrite``, ``resume``), the same files and ``config.json``."""
    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer
    from pipeline.training.run_folder import RunFolder

    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise VseError("train: config must be a mapping of option names to values")
    values = {k.replace("-", "_"): v for k, v in config.items()}
    if values.get("run_dir") not in (None, str(run_dir)):
        raise VseError(f"train: run_dir is given twice ({values['run_dir']} in the config, {run_dir} as an "
                       "argument): give it once")
    values["run_dir"] = str(run_dir)
    TrainConfig.from_dict(values)  # an unknown option, first, in one line
    settings = TrainConfig.from_dict(TrainConfig.checked(values))  # then types and ranges
    if not resume:  # the options first, then the folder (a resumed run takes the run's options)
        settings.check()
    run = RunFolder(settings.run_dir, resume=resume, overwrite=overwrite)
    with run.claim():
        build_trainer(settings, echo=echo, given=set(values), run=run).fit()
    return Path(settings.run_dir)
