"""A static HTML gallery of retrieval results (VSE++ Fig. 3): query images with their top-k
captions, and query captions with their top-k images.

Ground truth is marked and the rank of the best ground truth is shown in brackets (1-based,
ties counted against the query, as in the metrics). The page is one file with no script and
no absolute path: images are embedded as base64 JPEG thumbnails (default, so the file can be
moved or mailed around; about 9 kB per picture shown, ≈1 MB for the default 20 image and 20
caption queries with their top 5, measured on Flickr8k), or linked by paths relative to the
page (``embed=False``). All text is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch

from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path, guard_output
from pipeline.core.similarity import caption_image_scores, image_caption_scores
from pipeline.evaluation.inference import SplitEmbeddings
from pipeline.evaluation.metrics import similarity_ranks

FORMAT = "vse-gallery"  # the page's <meta name="generator">, read by fsutil.output_format


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
    similarity = emb.similarity  # a name of similarity.SIMILARITIES
    rng = np.random.default_rng(seed)
    num_images, num_captions = len(emb.images), len(emb.captions)
    image_q = np.sort(rng.choice(num_images, min(n, num_images), replace=False))
    caption_q = np.sort(rng.choice(num_captions, min(n, num_captions), replace=False))
    i2t_ranks, t2i_ranks = similarity_ranks(emb.images, emb.captions, emb.caption_image,
                                            similarity=similarity, device=device)
    images = torch.from_numpy(emb.images).to(device)
    captions = torch.from_numpy(emb.captions).to(device)
    caption_image = torch.from_numpy(emb.caption_image).to(device)
    k_cap, k_img = min(k, num_captions), min(k, num_images)
    with torch.no_grad():
        top_captions = image_caption_scores(images[image_q], captions, similarity).topk(k_cap, dim=1).indices
        top_images = caption_image_scores(captions[caption_q], images, similarity).topk(k_img, dim=1).indices
        cap_correct = caption_image[top_captions] == torch.from_numpy(image_q).to(device)[:, None]
        img_correct = top_images == caption_image[torch.from_numpy(caption_q).to(device)][:, None]
    top_captions, top_images = top_captions.cpu().numpy(), top_images.cpu().numpy()
    cap_correct, img_correct = cap_correct.cpu().numpy(), img_correct.cpu().numpy()
    return GalleryData(
        [ImageQuery(int(q), top_captions[i], cap_correct[i], int(i2t_ranks[q]) + 1)
         for i, q in enumerate(image_q)],
        [CaptionQuery(int(q), top_images[i], img_correct[i], int(t2i_ranks[q]) + 1)
         for i, q in enumerate(caption_q)])


THUMB_SIZE = 160        # px, the side of every picture on the page (CSS below uses it too)
THUMB_QUALITY = 80      # JPEG quality of embedded thumbnails


class ImageSources:
    """``src`` attribute values for image ids: an embedded thumbnail (default: the page stands
    alone, however it is moved or mailed), or with ``embed=False`` a path relative to the page.

    Thumbnails are the centre ``THUMB_SIZE``² square the page shows (the pictures are cropped
    to squares anyway), JPEG, encoded once per image. Files are looked up where the dataset
    readers look: ROOT/<id>, then ROOT/<image folder>/<id> (``datasets.image_folders``)."""

    def __init__(self, root, page: Path, embed: bool = True, thumb_size: int = THUMB_SIZE):
        self.root = Path(root) if root else None
        self.page_dir = Path(page).resolve().parent
        self.embed, self.thumb_size = embed, thumb_size
        self.missing: list[str] = []
        self._src: dict[str, str | None] = {}

    def path(self, image_id: str) -> Path | None:
        from pipeline.data.readers import image_folders

        if self.root is None:
            return None
        for folder in image_folders(self.root):
            if (folder / image_id).is_file():
                return folder / image_id
        return None

    def src(self, image_id: str) -> str | None:
        if image_id not in self._src:
            self._src[image_id] = self._make_src(image_id)
        return self._src[image_id]

    def _make_src(self, image_id: str) -> str | None:
        path = self.path(image_id)
        if path is None:
            self.missing.append(image_id)
            return None
        if self.embed:
            return self._thumbnail(path, image_id)
        return quote(Path(os.path.relpath(path.resolve(), self.page_dir)).as_posix())

    def _thumbnail(self, path: Path, image_id: str) -> str | None:
        from PIL import ImageOps

        from pipeline.data.readers import open_image

        try:
            image = open_image(path)
        except VseError:
            self.missing.append(image_id)
            return None
        image = ImageOps.fit(image, (self.thumb_size, self.thumb_size))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=THUMB_QUALITY, optimize=True)
        return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass(frozen=True)
class Mark:
    """A kind of highlighted result: CSS class, colour, legend text and the sign after a caption.

    Ground truth is always marked. More kinds (e.g. captions human judges accepted) are passed
    to ``render_gallery`` as ``highlights``: (mark, applies(image, caption)) pairs over
    split-local indices, tried in order for results that are not ground truth."""

    css: str
    colour: str
    legend: str
    sign: str = ""


GROUND_TRUTH = Mark("gt", "#0a6b0a", "ground truth", "\u2713")
HUMAN = Mark("human", "#1f4fbf", "accepted by people (human judgments)", "\u263a")
Highlight = tuple[Mark, Callable[[int, int], bool]]

STYLE = f"""
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.3em; }} h2 {{ font-size: 1.15em; margin-top: 2em; }}
.meta {{ color: #555; font-size: 0.9em; }}
.query {{ display: flex; gap: 1em; align-items: flex-start; border-top: 1px solid #ddd;
          padding: 0.8em 0; }}
.query img, .result img {{ width: {THUMB_SIZE}px; height: {THUMB_SIZE}px; object-fit: cover;
                           background: #eee; }}
.noimg {{ width: {THUMB_SIZE}px; height: {THUMB_SIZE}px; background: #eee; display: flex;
         align-items: center; justify-content: center; font-size: 0.75em; color: #777;
         overflow-wrap: anywhere; text-align: center; }}
ol {{ margin: 0; padding-left: 1.5em; }} li {{ margin: 0.2em 0; }}
.results {{ display: flex; gap: 0.6em; flex-wrap: wrap; }}
.result {{ width: {THUMB_SIZE}px; font-size: 0.8em; text-align: center; border: 3px solid transparent; }}
.rank {{ color: #555; font-weight: normal; }}
"""


def _mark_style(mark: Mark) -> str:
    sign = f'li.{mark.css}::after {{ content: " {mark.sign}"; }} ' if mark.sign else ""
    return (f"li.{mark.css}, span.{mark.css} {{ color: {mark.colour}; font-weight: bold; }} {sign}"
            f".result.{mark.css} {{ border-color: {mark.colour}; }}")


def _legend(marks: list[Mark]) -> str:
    shown = " · ".join(f'<span class="{m.css}">{html.escape(m.legend)}'
                       f'{" " + m.sign if m.sign else ""}</span>' for m in marks)
    return f'<p class="meta legend">{shown}; [n] = rank of the best ground truth.</p>'


def render_gallery(data: GalleryData, image_ids, captions, caption_image, sources: ImageSources,
                   title: str, meta: dict, highlights: Sequence[Highlight] = ()) -> str:
    """The HTML page. ``image_ids`` / ``captions`` / ``caption_image`` are split-local."""
    esc = html.escape
    marks = [GROUND_TRUTH] + [mark for mark, _ in highlights]

    def mark_of(image: int, caption: int, truth: bool) -> str:
        if truth:
            return GROUND_TRUTH.css
        return next((mark.css for mark, applies in highlights if applies(image, caption)), "other")

    def image_tag(index: int) -> str:
        image_id = str(image_ids[index])
        src = sources.src(image_id)
        if src is None:
            return f'<div class="noimg" title="{esc(image_id)}">{esc(image_id)}</div>'
        return f'<img src="{esc(src)}" alt="{esc(image_id)}" title="{esc(image_id)}" loading="lazy">'

    style = STYLE + "\n".join(_mark_style(m) for m in marks)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f'<meta name="generator" content="{FORMAT}">',
             f"<title>{esc(title)}</title><style>{style}</style></head><body>",
             f"<h1>{esc(title)}</h1>",
             '<p class="meta">' + " · ".join(f"{esc(str(k))}: {esc(str(v))}" for k, v in meta.items())
             + "</p>",
             _legend(marks),
             f'<h2 id="image-queries">Image → captions (top {_width(data, "captions")})</h2>']
    for q in data.image_queries:
        parts.append(f'<div class="query image-query" data-image="{esc(str(image_ids[q.image]))}">')
        parts.append(image_tag(q.image))
        parts.append(f'<div><div class="rank">ground truth at rank [{q.rank}]</div><ol>')
        for c, correct in zip(q.captions, q.correct):
            parts.append(f'<li class="{mark_of(q.image, int(c), bool(correct))}">{esc(captions[c])}</li>')
        parts.append("</ol></div></div>")
    parts.append(f'<h2 id="caption-queries">Caption → images (top {_width(data, "images")})</h2>')
    for q in data.caption_queries:
        own = esc(str(image_ids[caption_image[q.caption]]))
        parts.append(f'<div class="query caption-query" data-image="{own}">')
        parts.append(f'<div><p class="caption">{esc(captions[q.caption])}</p>'
                     f'<div class="rank">ground truth at rank [{q.rank}]</div><div class="results">')
        for i, correct in zip(q.images, q.correct):
            css = mark_of(int(i), q.caption, bool(correct))
            parts.append(f'<div class="result{"" if css == "other" else " " + css}" '
                         f'data-image="{esc(str(image_ids[i]))}">{image_tag(i)}</div>')
        parts.append("</div></div></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def shown_path(path) -> str:
    """A path as the page shows it: as given when relative; an absolute one by its last two
    parts only, so the page names no folder of the machine that made it."""
    path = Path(str(path))
    return path.as_posix() if not path.is_absolute() else "…/" + "/".join(path.parts[-2:])


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
                  k: int = 5, embed: bool = True, seed: int = 0, device=None,
                  highlights: Sequence[Highlight] = (), judgments=None,
                  overwrite: bool = False) -> GallerySummary:
    """Encode ``split`` with the checkpoint and write the gallery page to ``out``.
    ``images_root`` defaults to the root the cache was extracted from (attr dataset_root).
    ``embed`` (default) puts JPEG thumbnails in the page; ``embed=False`` links the image files
    by paths relative to the page (smaller, but the page then only works where it was written).
    ``judgments`` (``pipeline.evaluation.judgments.Judgments``): mark the pairs people accepted (HUMAN)."""
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import embed_checkpoint

    if n < 1 or k < 1:
        raise VseError(f"--n and --k must be at least 1 (got {n} and {k})")
    device = torch.device("cpu") if device is None else device
    out = Path(out)
    guard_output(out, FORMAT, "a vse gallery page", overwrite)
    with FeatureCache(features) as cache:
        emb = embed_checkpoint(checkpoint, cache, split, device)
        root = images_root or cache.attrs.get("dataset_root")
        image_ids = [cache.image_ids[r] for r in emb.image_rows]
        captions = [cache.captions[r] for r in emb.caption_rows]
        accepted = _accepted_pairs(judgments, cache, emb) if judgments is not None else frozenset()
    if accepted:
        highlights = [*highlights, (HUMAN, lambda image, caption: (image, caption) in accepted)]
    data = retrieve(emb, n, k, seed, device)
    sources = ImageSources(root, out, embed)
    how = f"embedded {THUMB_SIZE} px thumbnails" if embed else "linked relative to this page"
    meta = {"checkpoint": shown_path(checkpoint), "features": shown_path(features),
            "split": f"{split} ({len(image_ids)} images)",
            "images": f"{shown_path(root)}, {how}" if root else "none"}
    page = render_gallery(data, image_ids, captions, emb.caption_image, sources,
                          f"Retrieval gallery: {Path(checkpoint).parent.name or checkpoint}", meta,
                          highlights)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return GallerySummary(out, len(data.image_queries), len(data.caption_queries),
                          sorted(set(sources.missing)))


def _accepted_pairs(judgments, cache, emb) -> frozenset:
    """Split-local (image, caption) pairs people accepted (keys checked like `vse evaluate`)."""
    from pipeline.evaluation.judgments import match_split, token_file_near

    matched = match_split(emb, cache, judgments, token_file_near(cache.attrs.get("dataset_root")))
    yes = matched.accepted
    return frozenset(zip(matched.image[yes].tolist(), matched.caption[yes].tolist()))
