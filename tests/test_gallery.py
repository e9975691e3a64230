"""The HTML retrieval gallery: right entries, escaped text, working image links, real browser."""

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import DEMO_DATA, demo_captions, learnable_features, write_feature_cache
from PIL import Image, ImageOps

from cli.main import cli
from pipeline.core.config import TrainConfig
from pipeline.core.runtime import resolve_device
from pipeline.evaluation.evaluate import embed_checkpoint
from pipeline.reports.gallery import THUMB_SIZE, Mark, build_gallery
from pipeline.training.build import build_trainer

NASTY = ('<script>document.title="pwned"</script>'
         '<img src=x onerror="document.title=\'pwned\'"> & "q"')
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny mh run on real demo image ids; one test caption is hostile HTML."""
    root = tmp_path_factory.mktemp("gallery")
    ids, captions = demo_captions(40)
    captions[5 * 35 + 2] = NASTY
    caption_image = np.repeat(np.arange(40), 5)
    feats = learnable_features(captions, caption_image, 40)
    cache = write_feature_cache(root / "tiny.h5", feats, captions, caption_image,
                                {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)},
                                image_ids=ids, dataset_root=str(DEMO_DATA))
    config = TrainConfig(features=str(cache), run_dir=str(root / "mh"), loss="mh", epochs=2, embed_dim=16,
                         word_dim=8, batch_size=16, lr=5e-3, min_word_count=1, val_every=0)
    build_trainer(config, echo=lambda *a: None).fit()
    return root / "mh" / "best.pt", cache


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children, self.text = tag, dict(attrs), parent, [], ""

    @property
    def classes(self):
        return (self.attrs.get("class") or "").split()

    def find_all(self, cls=None, tag=None):
        for child in self.children:
            if (cls is None or cls in child.classes) and (tag is None or child.tag == tag):
                yield child
            yield from child.find_all(cls, tag)

    def all_text(self):
        return self.text + "".join(c.all_text() for c in self.children)


class Dom(HTMLParser):
    VOID = {"img", "meta", "br", "link", "input", "hr"}

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("document", {})
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.current)
        self.current.children.append(node)
        if tag not in self.VOID:
            self.current = node

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.text += data


def _check_entries(dom, checkpoint, cache, n_images, n_captions):
    """Every query's top-5 and ground-truth rank against an independent numpy ranking."""
    emb = embed_checkpoint(checkpoint, cache, "test", resolve_device("cpu"))
    ids, captions = demo_captions(40)
    captions[5 * 35 + 2] = NASTY
    image_ids = [ids[r] for r in emb.image_rows]
    texts = [captions[r] for r in emb.caption_rows]
    assert len(set(texts)) == len(texts)
    scores = emb.images @ emb.captions.T  # cosine: the embeddings are unit vectors
    image_queries = list(dom.find_all("image-query"))
    assert len(image_queries) == n_images
    for query in image_queries:
        q = image_ids.index(query.attrs["data-image"])
        items = list(query.find_all(tag="li"))
        expected = np.argsort(-scores[q], kind="stable")[:5]
        assert [li.all_text() for li in items] == [texts[c] for c in expected]
        assert [("gt" in li.classes) for li in items] == [emb.caption_image[c] == q for c in expected]
        own = emb.caption_image == q
        rank = int((scores[q, ~own] >= scores[q, own].max()).sum()) + 1
        assert next(query.find_all("rank")).all_text() == f"ground truth at rank [{rank}]"
    caption_queries = list(dom.find_all("caption-query"))
    assert len(caption_queries) == n_captions
    for query in caption_queries:
        c = texts.index(next(query.find_all("caption")).all_text())
        truth = emb.caption_image[c]
        assert query.attrs["data-image"] == image_ids[truth]
        expected = np.argsort(-scores[:, c], kind="stable")[:5]
        results = list(query.find_all("result"))
        assert [r.attrs["data-image"] for r in results] == [image_ids[i] for i in expected]
        assert [("gt" in r.classes) for r in results] == [i == truth for i in expected]
        rank = int((np.delete(scores[:, c], truth) >= scores[truth, c]).sum()) + 1
        assert next(query.find_all("rank")).all_text() == f"ground truth at rank [{rank}]"


def test_page_lists_the_right_results_with_text_escaped(run, tmp_path):
    checkpoint, cache = run
    out = tmp_path / "g.html"
    summary = build_gallery(checkpoint, cache, out, n=40)  # all 8 test images, all 40 captions
    assert (summary.image_queries, summary.caption_queries, summary.missing_images) == (8, 40, [])
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and "<img src=x" not in page
    dom = Dom(page).root
    assert not list(dom.find_all(tag="script"))
    assert NASTY in [p.all_text() for p in dom.find_all("caption")]  # shown as text, intact
    _check_entries(dom, checkpoint, cache, 8, 40)


def test_link_mode_links_images_relative_to_the_page(run, tmp_path):
    checkpoint, cache = run
    out = tmp_path / "site" / "deep" / "g.html"
    build_gallery(checkpoint, cache, out, n=3, embed=False)
    images = list(Dom(out.read_text()).root.find_all(tag="img"))
    assert len(images) == 3 + 3 * 5
    for img in images:
        assert not img.attrs["src"].startswith(("/", "file:"))
        target = (out.parent / unquote(img.attrs["src"])).resolve()
        assert target == (DEMO_DATA / "images" / img.attrs["alt"]).resolve() and target.is_file()


def _thumbnails(page: str) -> dict[str, Image.Image]:
    """alt (image id) → decoded picture of every <img>, which must all be embedded JPEGs."""
    prefix, pictures = "data:image/jpeg;base64,", {}
    for img in Dom(page).root.find_all(tag="img"):
        assert img.attrs["src"].startswith(prefix), img.attrs["src"][:80]
        picture = Image.open(io.BytesIO(base64.b64decode(img.attrs["src"][len(prefix):])))
        assert picture.format == "JPEG"
        pictures[img.attrs["alt"]] = picture.convert("RGB")
    return pictures


def test_default_page_is_self_contained_and_survives_a_move(run, tmp_path):
    """No absolute path anywhere in the page; images are embedded thumbnails of the right files,
    still there after the page is moved away from the dataset and the run."""
    checkpoint, cache = run
    out = tmp_path / "made" / "g.html"
    build_gallery(checkpoint, cache, out, n=3, k=4)
    page = out.read_text(encoding="utf-8")
    for absolute in {tmp_path, checkpoint, cache, DEMO_DATA, DEMO_DATA.resolve(), Path.cwd()}:
        assert str(absolute) not in page
    assert "file:" not in page and not re.search(r'(src|href)="/', page)
    assert "…/mh/best.pt" in page and f"…/{cache.parent.name}/tiny.h5" in page  # last two parts only
    moved = tmp_path / "elsewhere" / "shared.html"
    moved.parent.mkdir()
    shutil.move(out, moved)
    pictures = _thumbnails(moved.read_text(encoding="utf-8"))
    assert len(list(Dom(page).root.find_all(tag="img"))) == 3 + 3 * 4
    for image_id, picture in pictures.items():
        assert picture.size == (THUMB_SIZE, THUMB_SIZE)
        original = ImageOps.fit(Image.open(DEMO_DATA / "images" / image_id).convert("RGB"), picture.size)
        # JPEG at quality 80: the same picture within a few grey levels on average
        difference = np.abs(np.asarray(picture, np.float64) - np.asarray(original, np.float64)).mean()
        assert difference < 6, (image_id, difference)


def test_embedded_page_size_per_picture(run, tmp_path):
    """The size note of the README: each shown picture costs well under 16 kB of HTML."""
    checkpoint, cache = run
    linked, embedded = tmp_path / "linked.html", tmp_path / "embedded.html"
    build_gallery(checkpoint, cache, linked, n=8, k=5, embed=False)
    build_gallery(checkpoint, cache, embedded, n=8, k=5)
    shown = len(list(Dom(embedded.read_text()).root.find_all(tag="img")))
    assert shown == 8 + 8 * 5
    per_picture = (embedded.stat().st_size - linked.stat().st_size) / shown
    assert 2_000 < per_picture < 16_000


def test_highlights_add_a_mark_with_its_own_colour_and_legend(run, tmp_path):
    """The extension point for more kinds of marked results (e.g. captions judges accepted)."""
    checkpoint, cache = run
    accepted = Mark("accepted", "#1f5fbf", "accepted by judges", "\u2605")
    out = tmp_path / "g.html"
    build_gallery(checkpoint, cache, out, n=40, embed=False,
                  highlights=[(accepted, lambda image, caption: caption % 2 == 0)])
    page = out.read_text(encoding="utf-8")
    assert ".result.accepted { border-color: #1f5fbf; }" in page
    dom = Dom(page).root
    assert "accepted by judges \u2605" in next(dom.find_all("legend")).all_text()
    _, texts = demo_captions(40)
    texts[5 * 35 + 2] = NASTY
    test_texts = texts[5 * 32:]
    for li in dom.find_all(tag="li"):
        even = test_texts.index(li.all_text()) % 2 == 0
        assert li.classes == (["gt"] if "gt" in li.classes else ["accepted"] if even else ["other"])
    for query in dom.find_all("caption-query"):
        c = test_texts.index(next(query.find_all("caption")).all_text())
        for result in query.find_all("result"):
            assert ("accepted" in result.classes) == ("gt" not in result.classes and c % 2 == 0)


def test_missing_images_show_their_names(run, tmp_path):
    checkpoint, cache = run
    summary = build_gallery(checkpoint, cache, tmp_path / "g.html", images_root=tmp_path, n=2)
    dom = Dom((tmp_path / "g.html").read_text()).root
    placeholders = list(dom.find_all("noimg"))
    assert len(placeholders) == 2 + 2 * 5 and not list(dom.find_all(tag="img"))
    assert set(summary.missing_images) == {p.all_text() for p in placeholders}


def test_cli_gallery_defaults_to_the_training_cache_and_its_root(run, tmp_path):
    checkpoint, _ = run
    out = tmp_path / "g.html"
    result = CliRunner().invoke(cli, ["gallery", "--checkpoint", str(checkpoint), "--n", "4",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"gallery: {out} (4 image and 4 caption queries)" in result.output
    assert all(src.startswith("data:image/jpeg;base64,") for src in _srcs(out))  # embedded by default
    result = CliRunner().invoke(cli, ["gallery", "--checkpoint", str(checkpoint), "--n", "1", "--link",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert all(src.endswith(".jpg") and not src.startswith("/") for src in _srcs(out))
    result = CliRunner().invoke(cli, ["gallery", "--checkpoint", str(checkpoint), "--images", str(tmp_path),
                                      "--n", "1", "--out", str(out)])
    assert result.exit_code == 0 and "image(s) not found under" in result.output
    result = CliRunner().invoke(cli, ["gallery", "--checkpoint", str(tmp_path / "none.pt")])
    assert result.exit_code == 1 and "none.pt: checkpoint not found" in result.output


def _srcs(page: Path) -> list[str]:
    srcs = [img.attrs["src"] for img in Dom(page.read_text(encoding="utf-8")).root.find_all(tag="img")]
    assert srcs
    return srcs


@pytest.mark.skipif(CHROMIUM is None,
                    reason="needs a headless Chromium (Debian: apt-get install -y chromium)")
def test_page_renders_in_headless_chromium(run, tmp_path):
    checkpoint, cache = run
    out = tmp_path / "g.html"
    build_gallery(checkpoint, cache, out, n=40)
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.resolve().as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = Dom(done.stdout).root
    # the browser built the same document: no injected element ran or exists
    assert next(dom.find_all(tag="title")).all_text() == "Retrieval gallery: mh"
    assert not list(dom.find_all(tag="script"))
    assert not [n for n in dom.find_all() if "onerror" in n.attrs]
    assert NASTY in [p.all_text() for p in dom.find_all("caption")]
    _check_entries(dom, checkpoint, cache, 8, 40)
