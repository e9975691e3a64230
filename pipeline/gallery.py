"""A static HTML gallery of retrieval results (VSE++ Fig. 3): query images with their top-k
captions, and query captions with their top-k images.

Ground truth is marked and the rank of the best ground truth is shown in brackets (1-based,
ties counted against the query, as in the metrics). The page is one self-standing file with
no script: images are linked by paths relative to the page, or embedded as base64 JPEG
thumbnails (``embed=True``) so the file can be mailed around. All text is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch

from .errors import VseError
from .fsutil import atomic_path
from .inference import SplitEmbeddings
from .metrics import caption_image_scores, image_caption_scores, similarity_ranks


@dataclass
class ImageQuery:
    image: int                # split-local image index
    captions: np.ndarray      # (k,) split-local caption indices, best first
    correct: np.ndarray       # (k,) bool: caption describes the query image
    rank: int                 # 1-based rank of the best ground-truth caption


@dataclass
class CaptionQuery:
    caption: int              # split-local caption index
    images: np.ndarray        # (k,) split-local image indices, best first
    correct: np.ndarray       # (k,) bool: the caption's own image
    rank: int                 # 1-based rank of the caption's image


@dataclass
class GalleryData:
    image_queries: list[ImageQuery]
    caption_queries: list[CaptionQuery]


def retrieve(emb: SplitEmbeddings, n: int, k: int = 5, seed: int = 0, device=None) -> GalleryData:
    """Top-``k`` results of ``n`` random query images and ``n`` random query captions."""
    device = torch.device("cpu") if device is None else device
    order = emb.similarity  # a name of metrics.SIMILARITIES
    rng = np.random.default_rng(seed)
    num_images, num_captions = len(emb.images), len(emb.captions)
    image_q = np.sort(rng.choice(num_images, min(n, num_images), replace=False))
    caption_q = np.sort(rng.choice(num_captions, min(n, num_captions), replace=False))
    i2t_ranks, t2i_ranks = similarity_ranks(emb.images, emb.captions, emb.caption_image,
                                            order=order, device=device)
    images = torch.from_numpy(emb.images).to(device)
    captions = torch.from_numpy(emb.captions).to(device)
    caption_image = torch.from_numpy(emb.caption_image).to(device)
    k_cap, k_img = min(k, num_captions), min(k, num_images)
    with torch.no_grad():
        top_captions = image_caption_scores(images[image_q], captions, order).topk(k_cap, dim=1).indices
        top_images = caption_image_scores(captions[caption_q], images, order).topk(k_img, dim=1).indices
        cap_correct = caption_image[top_captions] == torch.from_numpy(image_q).to(device)[:, None]
        img_correct = top_images == caption_image[torch.from_numpy(caption_q).to(device)][:, None]
    top_captions, top_images = top_captions.cpu().numpy(), top_images.cpu().numpy()
    cap_correct, img_correct = cap_correct.cpu().numpy(), img_correct.cpu().numpy()
    return GalleryData(
        [ImageQuery(int(q), top_captions[i], cap_correct[i], int(i2t_ranks[q]) + 1)
         for i, q in enumerate(image_q)],
        [CaptionQuery(int(q), top_images[i], img_correct[i], int(t2i_ranks[q]) + 1)
         for i, q in enumerate(caption_q)])


class ImageSources:
    """``src`` attribute values for image ids: a path relative to the page, or an embedded
    thumbnail. Files are looked up at ROOT/images/<id> (Flickr layout), then ROOT/<id>."""

    def __init__(self, root, page: Path, embed: bool = False, thumb_size: int = 192):
        self.root = Path(root) if root else None
        self.page_dir = Path(page).resolve().parent
        self.embed, self.thumb_size = embed, thumb_size
        self.missing: list[str] = []

    def path(self, image_id: str) -> Path | None:
        if self.root is None:
            return None
        for candidate in (self.root / "images" / image_id, self.root / image_id):
            if candidate.is_file():
                return candidate
        return None

    def src(self, image_id: str) -> str | None:
        path = self.path(image_id)
        if path is None:
            self.missing.append(image_id)
            return None
        if self.embed:
            return self._thumbnail(path)
        return quote(Path(os.path.relpath(path.resolve(), self.page_dir)).as_posix())

    def _thumbnail(self, path: Path) -> str | None:
        from .datasets import open_image

        try:
            image = open_image(path)
        except VseError:
            self.missing.append(path.name)
            return None
        image.thumbnail((self.thumb_size, self.thumb_size))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=85)
        return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.15em; margin-top: 2em; }
.meta { color: #555; font-size: 0.9em; }
.query { display: flex; gap: 1em; align-items: flex-start; border-top: 1px solid #ddd; padding: 0.8em 0; }
.query img, .result img { width: 160px; height: 160px; object-fit: cover; background: #eee; }
.noimg { width: 160px; height: 160px; background: #eee; display: flex; align-items: center;
         justify-content: center; font-size: 0.75em; color: #777; overflow-wrap: anywhere; text-align: center; }
ol { margin: 0; padding-left: 1.5em; } li { margin: 0.2em 0; }
.gt { color: #0a6b0a; font-weight: bold; } .gt::after { content: " \\2713"; }
.results { display: flex; gap: 0.6em; flex-wrap: wrap; }
.result { width: 160px; font-size: 0.8em; text-align: center; border: 3px solid transparent; }
.result.gt { border-color: #0a6b0a; font-weight: normal; } .result.gt::after { content: none; }
.rank { color: #555; font-weight: normal; }
"""


def render_gallery(data: GalleryData, image_ids, captions, caption_image, sources: ImageSources,
                   title: str, meta: dict) -> str:
    """The HTML page. ``image_ids`` / ``captions`` / ``caption_image`` are split-local."""
    esc = html.escape

    def image_tag(index: int) -> str:
        image_id = str(image_ids[index])
        src = sources.src(image_id)
        if src is None:
            return f'<div class="noimg" title="{esc(image_id)}">{esc(image_id)}</div>'
        return f'<img src="{esc(src)}" alt="{esc(image_id)}" title="{esc(image_id)}" loading="lazy">'

    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{esc(title)}</h1>",
             '<p class="meta">' + " · ".join(f"{esc(str(k))}: {esc(str(v))}" for k, v in meta.items()) + "</p>",
             '<p class="meta">Ground truth in green (✓); [n] = rank of the best ground truth.</p>',
             f'<h2 id="image-queries">Image → captions (top {_width(data, "captions")})</h2>']
    for q in data.image_queries:
        parts.append(f'<div class="query image-query" data-image="{esc(str(image_ids[q.image]))}">')
        parts.append(image_tag(q.image))
        parts.append(f'<div><div class="rank">ground truth at rank [{q.rank}]</div><ol>')
        for c, correct in zip(q.captions, q.correct):
            parts.append(f'<li class="{"gt" if correct else "other"}">{esc(captions[c])}</li>')
        parts.append("</ol></div></div>")
    parts.append(f'<h2 id="caption-queries">Caption → images (top {_width(data, "images")})</h2>')
    for q in data.caption_queries:
        parts.append(f'<div class="query caption-query" data-image="{esc(str(image_ids[caption_image[q.caption]]))}">')
        parts.append(f'<div><p class="caption">{esc(captions[q.caption])}</p>'
                     f'<div class="rank">ground truth at rank [{q.rank}]</div><div class="results">')
        for i, correct in zip(q.images, q.correct):
            parts.append(f'<div class="result{" gt" if correct else ""}" data-image="{esc(str(image_ids[i]))}">'
                         f"{image_tag(i)}</div>")
        parts.append("</div></div></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _width(data: GalleryData, what: str) -> int:
    queries = data.image_queries if what == "captions" else data.caption_queries
    return len(getattr(queries[0], what)) if queries else 0


@dataclass
class GallerySummary:
    path: Path
    image_queries: int
    caption_queries: int
    missing_images: list[str]


def build_gallery(checkpoint, features, out, *, images_root=None, split: str = "test", n: int = 20,
                  k: int = 5, embed: bool = False, seed: int = 0, device=None) -> GallerySummary:
    """Encode ``split`` with the checkpoint and write the gallery page to ``out``.
    ``images_root`` defaults to the root the cache was extracted from (attr dataset_root)."""
    from .cache import FeatureCache
    from .evaluation import embed_checkpoint

    if n < 1 or k < 1:
        raise VseError(f"--n and --k must be at least 1 (got {n} and {k})")
    device = torch.device("cpu") if device is None else device
    out = Path(out)
    with FeatureCache(features) as cache:
        emb = embed_checkpoint(checkpoint, cache, split, device)
        root = images_root or cache.attrs.get("dataset_root")
        image_ids = [cache.image_ids[r] for r in emb.image_rows]
        captions = [cache.captions[r] for r in emb.caption_rows]
    data = retrieve(emb, n, k, seed, device)
    sources = ImageSources(root, out, embed)
    meta = {"checkpoint": checkpoint, "features": features, "split": f"{split} ({len(image_ids)} images)",
            "images": root or "none"}
    page = render_gallery(data, image_ids, captions, emb.caption_image, sources,
                          f"Retrieval gallery: {Path(checkpoint).parent.name or checkpoint}", meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return GallerySummary(out, len(data.image_queries), len(data.caption_queries),
                          sorted(set(sources.missing)))
