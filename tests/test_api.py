"""The Python API (pipeline.api, docs/api.md) against the commands it wires: a model's embeddings
equal `vse embed`'s file and `vse evaluate`'s split embeddings, `evaluate` gives what `vse
evaluate --json` prints, `train` from a dict writes the run `vse train` writes; bad inputs are one
line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import test_networks
import torch
from conftest import vse
from test_bad_inputs import flickr8k_layout

import pipeline
from pipeline.core.errors import VseError

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5  # test_embed's bound: the same features through the same head, in other batches
sets, sgr_run = test_networks.sets, test_networks.sgr_run  # fixtures: a tiny set cache, an SGR run on it
OPTIONS = {"loss": "sh", "epochs": 1, "embed_dim": 16, "word_dim": 8, "batch_size": 8, "min_word_count": 1,
           "val_every": 0, "workers": 0, "device": "cpu"}


def _flags(options: dict) -> list:
    return [part for name, value in options.items() for part in (f"--{name.replace('_', '-')}", value)]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """15 real images in the Flickr8k layout, their 1-crop cache of the test backbone (`vse extract`),
    and a GRU model trained on it by the API."""
    base = tmp_path_factory.mktemp("api")
    root = flickr8k_layout(base / "f8k", 15)
    cache = base / "c.h5"
    result = vse("extract", "--dataset", "flickr8k", "--root", root, "--backbone", "tiny", "--out", cache,
                 "--workers", 0, "--device", "cpu", "--engine", "torch", "--quiet")
    assert result.exit_code == 0, result.output
    run = pipeline.train({"features": str(cache), **OPTIONS}, base / "run", echo=lambda *a: None)
    return {"root": root, "cache": cache, "run": run, "checkpoint": run / "best.pt", "base": base}


@pytest.fixture(scope="module")
def model(made):
    return pipeline.load_model(made["checkpoint"], device="cpu")


def _split(made):
    """`vse evaluate`'s embeddings of the test split, with its images' names and its captions."""
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import encode_split, load_model

    loaded = load_model(made["checkpoint"], torch.device("cpu"))
    with FeatureCache(made["cache"]) as fc:
        split = encode_split(loaded.model, fc, loaded.captions(fc), "test", torch.device("cpu"))
        names = [fc.image_ids[r] for r in split.image_rows]
        captions = [fc.captions[r] for r in split.caption_rows]
    return split, names, captions


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_embeddings_equal_vse_embed_and_vse_evaluate(made, model, tmp_path):
    split, names, captions = _split(made)
    paths = [made["root"] / "images" / name for name in names]
    listing = tmp_path / "images.txt"
    listing.write_text("".join(f"{p}\n" for p in paths))
    texts = tmp_path / "captions.txt"
    texts.write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    out = tmp_path / "e.h5"
    result = vse("embed", made["checkpoint"], "--images", listing, "--captions", texts, "--out", out,
                 "--workers", 0, "--no-progress")
    assert result.exit_code == 0, result.output
    with h5py.File(out, "r") as f:
        file_images, file_captions = f["images/vectors"][()], f["captions/vectors"][()]

    images = model.embed_images([str(p) for p in paths], batch_size=2)
    assert images.shape == (len(names), model.dim) and images.dtype == np.float32
    assert np.abs(images - file_images).max() <= TOLERANCE
    assert np.abs(images - _unit(split.images)).max() <= TOLERANCE
    rows = model.embed_images(cache=made["cache"], split="test")
    assert np.abs(rows - _unit(split.images)).max() <= TOLERANCE
    reversed_rows = model.embed_images(cache=made["cache"], rows=split.image_rows[::-1])
    assert np.abs(reversed_rows - rows[::-1]).max() <= TOLERANCE
    caption_rows = model.embed_captions(captions)
    assert caption_rows.shape == (len(captions), model.dim)
    assert np.abs(caption_rows - file_captions).max() <= TOLERANCE
    assert np.abs(caption_rows - _unit(split.captions)).max() <= TOLERANCE


def test_pixels_and_pil_images_embed_as_their_files(made, model):
    from PIL import Image

    paths = sorted((made["root"] / "images").iterdir())[:3]
    pil = [Image.open(p).convert("RGB") for p in paths]
    pixels = np.stack([np.asarray(im) for im in pil])  # (3, H, W, 3) uint8: the demo images are 224 × 224
    files = model.embed_images(paths)
    for given in (pil, pixels, list(pixels)):
        assert np.abs(model.embed_images(given) - files).max() <= TOLERANCE
    assert np.abs(model.embed_images(pixels[0]) - files[:1]).max() <= TOLERANCE  # one image
    grey = np.asarray(pil[0].convert("L"))
    assert model.embed_images(grey).shape == (1, model.dim)


def test_score_is_the_models_similarity_of_the_embeddings(made, model):
    images = model.embed_images(cache=made["cache"], split="test")
    texts = ["a dog runs", "two people on a beach", "a child"]
    captions = model.embed_captions(texts)
    scores = model.score(images, captions)
    assert model.similarity == "cosine" and scores.shape == (len(images), 3)
    assert np.abs(scores - images @ captions.T).max() <= 1e-6
    assert np.abs(model.score(images, texts) - scores).max() <= 1e-6  # captions given as text
    assert model.embed_captions("a dog runs").shape == (1, model.dim)


def test_evaluate_gives_what_vse_evaluate_json_prints(made):
    result = vse("evaluate", "--checkpoint", made["checkpoint"], "--features", made["cache"], "--json",
                 "--device", "cpu")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output.strip().splitlines()[-1])
    # the same code on the same device: equal exactly; features default to the run's own cache
    assert pipeline.evaluate(made["checkpoint"], device="cpu") == printed
    dev = pipeline.evaluate(made["checkpoint"], split="dev", features=made["cache"], device="cpu")
    assert set(dev) == set(printed) and dev != printed


def test_train_from_a_dict_writes_the_config_the_cli_writes(made, tmp_path):
    result = vse("train", "--features", made["cache"], "--run-dir", tmp_path / "cli", *_flags(OPTIONS))
    assert result.exit_code == 0, result.output
    cli = json.loads((tmp_path / "cli" / "config.json").read_text())
    api = json.loads((made["run"] / "config.json").read_text())
    assert cli.pop("run_dir") == str(tmp_path / "cli") and api.pop("run_dir") == str(made["run"])
    assert api == cli
    assert made["run"] == made["base"] / "run" and (made["run"] / "best.pt").is_file()


def test_a_pairwise_checkpoint_is_refused_by_load_model_and_evaluated(sgr_run, sets):
    checkpoint = sgr_run / "best.pt"
    with pytest.raises(VseError, match="pair jointly: it has no embeddings") as caught:
        pipeline.load_model(checkpoint, device="cpu")
    assert "\n" not in str(caught.value)
    result = vse("evaluate", "--checkpoint", checkpoint, "--features", sets, "--json", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert pipeline.evaluate(checkpoint, device="cpu") == json.loads(result.output.strip().splitlines()[-1])


@pytest.mark.parametrize("call, message", [
    (lambda m, c: m.embed_images(), "give images .* or cache=, one of them"),
    (lambda m, c: m.embed_images(["x.jpg"], cache=c), "give images .* or cache=, one of them"),
    (lambda m, c: m.embed_images(cache=c, rows=[0], split="test"), "give rows= or split=, not both"),
    (lambda m, c: m.embed_images(cache=c, rows=[99]), r"rows= must be image rows 0\.\.14"),
    (lambda m, c: m.embed_images(np.zeros((8, 8, 3), np.float32)), "item 0 is a float32 array of shape"),
    (lambda m, c: m.embed_images(np.zeros((2, 60, 3), np.uint8)), "item 0 is 60x2 pixels, 30 times as long"),
    (lambda m, c: m.embed_images([3]), "item 0 is a int; give image files"),
    (lambda m, c: m.embed_images(["no_such.jpg"]), "no_such.jpg"),
    (lambda m, c: m.embed_captions(["a dog", 7]), "captions: item 1 is a int, not a string"),
    (lambda m, c: m.score(np.zeros((2, 3), np.float32), ["a dog"]), "images are 3-d rows; this model"),
])
def test_bad_inputs_are_one_line(made, model, call, message):
    with pytest.raises(VseError, match=message) as caught:
        call(model, made["cache"])
    assert "\n" not in str(caught.value)


def test_train_refuses_in_one_line_before_writing(made, tmp_path):
    base = {"features": str(made["cache"]), **OPTIONS}
    for config, message in [({**base, "no_such_option": 1}, "unknown training option.*no_such_option"),
                            ({**base, "epochs": "two"}, "epochs"),
                            ({**base, "run_dir": "elsewhere"}, "run_dir is given twice"),
                            ([("loss", "mh")], "config must be a mapping")]:
        with pytest.raises(VseError, match=message):
            pipeline.train(config, tmp_path / "run", echo=lambda *a: None)
        assert not (tmp_path / "run").exists()
    with pytest.raises(VseError, match="holds a run"):  # a finished run is not overwritten unasked
        pipeline.train(base, made["run"], echo=lambda *a: None)


def test_import_pipeline_stays_light_and_hands_the_api_on():
    code = ("import sys, pipeline\nnames = pipeline.API\nprint('torch' in sys.modules)\n"
            "from pipeline import load_model\nimport pipeline.api\n"
            "same = all(getattr(pipeline, n) is getattr(pipeline.api, n) for n in names)\n"
            "print(same, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", "True", "False"], result.stderr  # torch: at the first call
    assert set(pipeline.API) == set(pipeline.api.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        pipeline.no_such_name
