"""`vse embed`: a checkpoint's own pipelines on new files, checked against `vse evaluate`'s
embeddings of the same images and captions (real demo images, the test backbone `tiny`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import extract_tiny, train_tiny, vse
from test_bad_inputs import assert_one_error_line, flickr8k_layout

TOLERANCE = 1e-5  # the bound: the same features through the same head, other batches


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A Flickr8k-layout folder of 15 real images, its 1-crop cache and grid cache, a GRU model
    on the first and a GPO set model on the second."""
    base = tmp_path_factory.mktemp("embed")
    root = flickr8k_layout(base / "f8k", 15)
    vectors = extract_tiny(root, base / "c.h5")
    grid = extract_tiny(root, base / "g.h5", "--grid")
    return {"root": root, "cache": vectors, "grid": grid, "base": base,
            "gru": train_tiny(vectors, base / "gru"),
            "gpo": train_tiny(grid, base / "gpo", "--image-pool", "gpo", "--text-pool", "gpo")}


def _evaluate_embeddings(checkpoint: Path, cache: Path):
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import encode_split, load_model

    loaded = load_model(checkpoint, torch.device("cpu"))
    with FeatureCache(cache) as fc:
        split = encode_split(loaded.model, fc, loaded.captions(fc), "test", torch.device("cpu"))
        names = [fc.image_ids[r] for r in split.image_rows]
        captions = [fc.captions[r] for r in split.caption_rows]
    return split, names, captions


def _read(path: Path, group: str):
    with h5py.File(path, "r") as f:
        return (f[group]["vectors"][()], f[group]["ids"].asstr()[()].tolist(),
                {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()})


@pytest.mark.parametrize("model, cache", [("gru", "cache"), ("gpo", "grid")])
def test_embedded_files_equal_evaluate_embeddings(made, tmp_path, model, cache):
    split, names, captions = _evaluate_embeddings(made[model], made[cache])
    listing = tmp_path / "test_images.txt"
    listing.write_text("".join(f"{made['root']}/images/{n}\n" for n in names))
    texts = tmp_path / "captions.txt"
    texts.write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    out = tmp_path / "e.h5"
    result = vse("embed", made[model], "--images", listing, "--captions", texts, "--out", out,
                 "--workers", 0, "--batch-size", 2, "--no-progress")
    assert result.exit_code == 0, result.output
    images, ids, attrs = _read(out, "images")
    assert ids == [f"{made['root']}/images/{n}" for n in names]
    expected = split.images / np.linalg.norm(split.images, axis=1, keepdims=True)
    assert np.abs(images - expected).max() <= TOLERANCE
    vectors, caption_ids, _ = _read(out, "captions")
    assert caption_ids[0] == "captions.txt:1" and len(vectors) == len(captions)
    assert np.abs(vectors - split.captions).max() <= TOLERANCE
    from pipeline.core.fsutil import file_sha256
    assert attrs["checkpoint_sha256"] == file_sha256(made[model]) and attrs["complete"]
    assert np.allclose(np.linalg.norm(images, axis=1), 1, atol=1e-6)


def test_a_broken_image_is_skipped_counted_and_listed_and_strict_refuses(made, tmp_path):
    folder = tmp_path / "imgs"
    shutil.copytree(made["root"] / "images", folder)
    (folder / "broken.jpg").write_bytes(b"not a jpeg at all")
    out = tmp_path / "e.h5"
    result = vse("embed", made["gru"], "--images", folder, "--out", out, "--workers", 0, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "15 embedded, 1 skipped" in result.output
    with h5py.File(out, "r") as f:
        failed = f["images/failed"].asstr()[()].tolist()
        assert "broken.jpg" not in f["images/ids"].asstr()[()].tolist()
    assert len(failed) == 1 and failed[0].startswith("broken.jpg\t")
    strict = vse("embed", made["gru"], "--images", folder, "--out", tmp_path / "s.h5", "--workers", 0,
                 "--strict", "--no-progress")
    assert_one_error_line(strict, tmp_path / "s.h5", "1 of 16 images could not be read")
    assert not (tmp_path / "s.h5").exists()


def test_a_file_name_that_is_not_utf8_or_holds_a_newline_is_skipped_and_listed(made, tmp_path):
    """One such name used to fail the whole embed at its very end (h5py cannot store it), every
    rerun the same way; now it is skipped and listed, as an unreadable image is."""
    import os

    folder = tmp_path / "imgs"
    shutil.copytree(made["root"] / "images", folder)
    first = sorted(folder.iterdir())[0]
    os.rename(first, os.path.join(os.fsencode(folder), b"caf\xe9.jpg"))  # Latin-1, not UTF-8
    second = sorted(p for p in folder.iterdir() if p.name.isascii())[0]
    second.rename(folder / "two\nlines.jpg")
    out = tmp_path / "e.h5"
    result = vse("embed", made["gru"], "--images", folder, "--out", out, "--workers", 0, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "13 embedded, 2 skipped" in result.output
    with h5py.File(out, "r") as f:
        failed = sorted(f["images/failed"].asstr()[()].tolist())
        assert len(f["images/ids"]) == 13
    assert failed == ["caf\\xe9.jpg\tits name is not UTF-8 (rename the file)",
                      "two\\x0alines.jpg\tits name holds a control character such as a line break "
                      "(rename the file)"]


def test_a_list_file_keeps_its_paths_inside_its_folder_as_a_csv_does(made, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text("../elsewhere/a.jpg\n")
    result = vse("embed", made["gru"], "--images", listing, "--out", tmp_path / "e.h5", "--no-progress")
    assert result.exit_code == 1
    assert result.output.strip() == (f"error: {listing}: line 1: image path '../elsewhere/a.jpg' leaves the "
                                     f"list's folder {tmp_path}")


def test_an_interrupted_embed_goes_on_from_its_parts(made, tmp_path, monkeypatch):
    import pipeline.search.embed as embed

    out = tmp_path / "e.h5"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(embed, "_combine", killed)
    with pytest.raises(KeyboardInterrupt):
        embed.embed_files(made["gru"], out, made["root"] / "images", workers=0, part_size=4)
    assert not out.exists() and len(list((tmp_path / "e.h5.parts").iterdir())) == 4
    monkeypatch.undo()
    again = embed.embed_files(made["gru"], out, made["root"] / "images", workers=0, part_size=4)
    assert again.parts_reused == 4 and again.images == 15 and not (tmp_path / "e.h5.parts").exists()
    fresh = embed.embed_files(made["gru"], tmp_path / "f.h5", made["root"] / "images", workers=0, part_size=4)
    assert fresh.parts_reused == 0  # same batches as the resumed run: the same bits
    assert np.array_equal(_read(out, "images")[0], _read(tmp_path / "f.h5", "images")[0])


def test_csv_inputs_take_the_named_columns(made, tmp_path):
    table = made["root"] / "own.csv"
    names = sorted(p.name for p in (made["root"] / "images").iterdir())[:3]
    table.write_text("path\ttext\n" + "".join(f"images/{n}\ta caption of {n}\n" for n in names)
                     + f"images/{names[0]}\tanother caption\n", encoding="utf-8")
    out = tmp_path / "e.h5"
    result = vse("embed", made["gru"], "--images", table, "--captions", table, "--csv-img-key", "path",
                 "--csv-caption-key", "text", "--csv-separator", "\\t", "--out", out, "--workers", 0,
                 "--no-progress")
    assert result.exit_code == 0, result.output
    assert _read(out, "images")[1] == [f"images/{n}" for n in names]  # one row per image
    assert _read(out, "captions")[1] == ["own.csv:2", "own.csv:3", "own.csv:4", "own.csv:5"]


def test_the_service_side_embeds_a_query_like_the_file(made, tmp_path):
    from PIL import Image

    from pipeline.search.embed import Embedder

    embedder = Embedder.from_checkpoint(made["gpo"], "cpu")
    name = sorted((made["root"] / "images").iterdir())[0]
    listing = tmp_path / "one.txt"
    listing.write_text(f"{name}\n")
    for source in (name, listing):  # one image file, or a list of one
        out = tmp_path / f"{source.suffix[1:]}.h5"
        assert vse("embed", made["gpo"], "--images", source, "--out", out, "--workers", 0,
                   "--no-progress").exit_code == 0
        query = embedder.embed_images([Image.open(name).convert("RGB")])
        assert np.abs(query - _read(out, "images")[0]).max() <= TOLERANCE
    assert embedder.dim == 16 and embedder.similarity == "cosine"


def test_the_service_reads_the_checkpoint_once(made, monkeypatch):
    """search and serve build their model from one read of the checkpoint (it was two)."""
    import pipeline.core.checkpoint as checkpoint_module
    from pipeline.search import embed as embed_module

    reads = []
    real = checkpoint_module.load_checkpoint

    def counting(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(embed_module, "load_checkpoint", counting)
    monkeypatch.setattr("pipeline.evaluation.inference.load_checkpoint", counting)
    embedder = embed_module.Embedder.from_checkpoint(made["gpo"], "cpu")
    assert reads == [str(made["gpo"])] and embedder.dim == 16


@pytest.mark.parametrize("write, option, problem", [
    (lambda p: p.write_text(""), "--captions", "empty caption file"),
    (lambda p: p.write_text("\n\n"), "--captions", "empty caption file"),
    (lambda p: p.write_text("filepath,title\nimages/x.jpg,a dog\n"), "--images", "no column 'path'"),
    (lambda p: p.write_text("path,title\n../outside.jpg,a dog\n"), "--images", "leaves the CSV's folder"),
])
def test_bad_inputs_are_one_line_and_write_nothing(made, tmp_path, write, option, problem):
    source = tmp_path / ("in.csv" if "column" in problem or "folder" in problem else "in.txt")
    write(source)
    extra = ("--csv-img-key", "path") if source.suffix == ".csv" else ()
    out = tmp_path / "e.h5"
    result = vse("embed", made["gru"], option, source, "--out", out, *extra, "--no-progress")
    assert_one_error_line(result, source, problem)
    assert not out.exists() and not (tmp_path / "e.h5.parts").exists()


def test_missing_inputs_and_foreign_outputs_are_refused(made, tmp_path):
    result = vse("embed", made["gru"], "--images", tmp_path / "nowhere", "--out", tmp_path / "e.h5")
    assert_one_error_line(result, tmp_path / "nowhere", "not found")
    mine = tmp_path / "notes.h5"
    mine.write_text("a file vse did not write")
    result = vse("embed", made["gru"], "--captions", made["root"] / "Flickr8k.token.txt", "--out", mine)
    assert_one_error_line(result, mine, "vse did not write")
    assert mine.read_text() == "a file vse did not write"
    none = vse("embed", made["gru"], "--out", tmp_path / "e.h5")
    assert none.exit_code == 1 and "nothing to embed" in none.stderr


def test_index_and_search_with_the_real_model(made, tmp_path):
    """embed → index → search: an indexed image queried by its own file is the top hit, and a
    text query is embedded by the checkpoint's caption side (the index refuses another model)."""
    import json

    out, index = tmp_path / "e.h5", tmp_path / "idx"
    made_file = vse("embed", made["gru"], "--images", made["root"] / "images", "--captions",
                    made["root"] / "Flickr8k.token.txt", "--out", out, "--workers", 0, "--no-progress")
    assert made_file.exit_code == 0, made_file.output
    built = vse("index", out, "--out", index)
    assert built.exit_code == 0 and "note:" not in built.output, built.output
    # the folder of the images goes from the embeddings file to the index, so serve can show them
    recorded = json.loads((index / "meta.json").read_text())["image_root"]
    assert recorded == str((made["root"] / "images").resolve())
    image = sorted((made["root"] / "images").iterdir())[3]
    hits = vse("search", index, "--image", image, "-k", 2, "--json")
    assert hits.exit_code == 0, hits.output
    top = json.loads(hits.stdout)["results"][0]
    assert top["id"] == image.name and top["score"] == pytest.approx(1.0, abs=1e-5)
    text = vse("search", index, "--text", "a dog runs on the beach", "-k", 3, "--json")
    assert text.exit_code == 0 and len(json.loads(text.stdout)["results"]) == 3
    other = vse("search", index, "--checkpoint", made["gpo"], "--text", "a dog")
    assert_one_error_line(other, made["gpo"], "is another model")


def test_an_image_index_from_a_csv_labels_its_hits_with_their_captions(made, tmp_path):
    """Images and captions embedded from one CSV: the image index keeps each image's first caption,
    and a hit carries it (the page shows it instead of the file name)."""
    import json

    images = sorted((made["root"] / "images").iterdir())[:6]
    table = made["root"] / "pairs.csv"
    table.write_text("filepath,title\n" + "".join(f"images/{p.name},photo number {k} of a dog\n"
                                                  f"images/{p.name},second caption {k}\n"
                                                  for k, p in enumerate(images)))
    out, index = tmp_path / "e.h5", tmp_path / "idx"
    made_file = vse("embed", made["gru"], "--images", table, "--captions", table, "--out", out,
                    "--workers", 0, "--no-progress")
    assert made_file.exit_code == 0, made_file.output
    assert vse("index", out, "--out", index).exit_code == 0
    hits = vse("search", index, "--image", images[2], "-k", 2, "--json")
    assert hits.exit_code == 0, hits.output
    top = json.loads(hits.stdout)["results"][0]
    assert top["id"] == f"images/{images[2].name}" and top["caption"] == "photo number 2 of a dog"
