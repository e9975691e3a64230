"""Judged pairs → rows of an evaluated split.

A split's rows are named by image ids and caption keys ``<image>#<n>``: a cache or dataset
rebuilds the keys from its caption order (``pipeline.data.caption_index.CaptionIndex.caption_keys``),
``check_caption_keys`` compares them with a Flickr8k token file when one is at hand, an npz
stores them. ``match_judgments`` is pure; ``check_caption_keys`` and ``token_file_near`` read
files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.core.errors import VseError
from pipeline.evaluation.judgments.formats import Judgments


@dataclass
class SplitIdentity:
    """Who the rows of an evaluated split are: image ids (N,), caption keys and texts (M,)."""

    image_ids: list[str]
    caption_keys: list[str]
    caption_texts: list[str] | None = None


def split_identity(index, image_rows, caption_rows) -> SplitIdentity:
    """Ids and keys of a split's rows of ``index`` (a ``CaptionIndex``, or what holds one:
    a FeatureCache, RC's image index)."""
    keys = getattr(index, "index", index).caption_keys
    return SplitIdentity([index.image_ids[r] for r in np.asarray(image_rows).tolist()],
                         [keys[r] for r in np.asarray(caption_rows).tolist()],
                         [index.captions[r] for r in np.asarray(caption_rows).tolist()])


def check_caption_keys(identity: SplitIdentity, token_file, keys=None) -> int:
    """Compare the reconstructed keys (all, or ``keys``) with a ``<image>#<n>\\t<caption>``
    token file: a key whose text differs means the captions are not in the file's order
    (a one-line ``VseError``). Returns how many keys were compared."""
    token_file = Path(token_file)
    wanted = set(identity.caption_keys if keys is None else keys)
    texts = dict(zip(identity.caption_keys, identity.caption_texts or []))
    found = {}
    try:
        with open(token_file, encoding="utf-8") as fh:
            for line in fh:
                key, tab, caption = line.rstrip("\r\n").partition("\t")
                if tab and key.strip() in wanted:
                    found[key.strip()] = caption.strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise VseError(f"cannot read the token file ({str(exc).splitlines()[0][:120]})", token_file) from None
    for key in sorted(wanted):
        if key in texts and found.get(key) != texts[key].strip():
            raise VseError(f"caption {key} is {found.get(key)!r} here but {texts[key]!r} in the "
                           "evaluated captions: they are not in this file's order, so caption keys "
                           "cannot be rebuilt (evaluate an npz that stores caption_keys)", token_file)
    return len(wanted & texts.keys())


@dataclass
class MatchedJudgments:
    """The judged pairs inside an evaluated split (split-local indices) and what was left out."""

    image: np.ndarray       # (P,) int64
    caption: np.ndarray     # (P,) int64
    grades: np.ndarray      # (P,) float64
    gains: np.ndarray       # (P,) float64
    accepted: np.ndarray    # (P,) bool
    total: int              # judged pairs in the file
    missing_image: int      # pairs whose image is not in the split
    missing_caption: int    # pairs whose caption is not in the split
    keys: list[str] = field(default_factory=list)  # caption keys of the matched pairs

    @property
    def unmatched(self) -> int:
        return self.total - len(self.image)

    def summary(self) -> str:
        text = f"{len(self.image)} of {self.total} judged pairs in the split"
        if self.unmatched:
            text += (f"; {self.unmatched} left out ({self.missing_image} with the image, "
                     f"{self.missing_caption} with the caption outside the split)")
        return text


def match_judgments(judgments: Judgments, identity: SplitIdentity) -> MatchedJudgments:
    """Judged pairs → split-local (image, caption) indices; pairs outside the split are counted.
    A file of which no pair is in the split is a one-line ``VseError``."""
    image_index = {image_id: i for i, image_id in enumerate(identity.image_ids)}
    caption_index = {key: j for j, key in enumerate(identity.caption_keys)}
    image = np.array([image_index.get(i, -1) for i in judgments.image_ids], dtype=np.int64)
    caption = np.array([caption_index.get(k, -1) for k in judgments.caption_keys], dtype=np.int64)
    keep = (image >= 0) & (caption >= 0)
    if not keep.any():
        example = identity.image_ids[0] if identity.image_ids else "-"
        raise VseError(f"none of its {len(judgments)} judged pairs is in the evaluated split "
                       f"({len(identity.image_ids)} images, e.g. {example}; "
                       f"first pair {judgments.image_ids[0]} / {judgments.caption_keys[0]})", judgments.path)
    rows = np.flatnonzero(keep)
    return MatchedJudgments(image[rows], caption[rows], judgments.grades[rows], judgments.gains[rows],
                            judgments.accepted[rows], len(judgments), int((image < 0).sum()),
                            int((caption < 0).sum()), [judgments.caption_keys[r] for r in rows])


def token_file_near(root) -> Path | None:
    """The Flickr8k token file of a dataset folder, when there is one (to check caption keys)."""
    from pipeline.data.readers.flickr8k import FLICKR8K_TOKEN_FILE

    if not root:
        return None
    candidate = Path(root) / FLICKR8K_TOKEN_FILE
    return candidate if candidate.is_file() else None


def match_split(emb, index, judgments: Judgments, token_file=None) -> MatchedJudgments:
    """``match_rows`` of split embeddings (``inference.SplitEmbeddings``): the one matching
    step of evaluate, --runs and gallery."""
    return match_rows(index, emb.image_rows, emb.caption_rows, judgments, token_file)


def match_rows(index, image_rows, caption_rows, judgments: Judgments, token_file=None) -> MatchedJudgments:
    """The judged pairs among rows of ``index`` (see ``split_identity``), the rebuilt caption
    keys of the judged captions checked against ``token_file`` when given."""
    identity = split_identity(index, image_rows, caption_rows)
    matched = match_judgments(judgments, identity)
    if token_file is not None:
        check_caption_keys(identity, token_file, matched.keys)
    return matched
