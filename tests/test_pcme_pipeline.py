"""``pcme`` and ``pcmepp`` through the command line: a tiny run of each trains (pcmepp on one vector
per image with VSE++'s linear heads, pcme on grids with VSE∞'s GPO), carries a variance head,
evaluates by the declared similarity ``csd`` (the metrics equal those of the closed-form sampled
distance computed here from the split's means and variances), and ``vse embed`` writes each
item's unit mean and its log-variance, equal to evaluation's; ``vse index`` refuses such a file in
one line. ``core.similarity.csd_scores`` equals the distance written out, and its augmented vectors
give the same scores by an inner product."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from conftest import extract_tiny, train_tiny, vse
from test_bad_inputs import assert_one_error_line, flickr8k_layout

TOLERANCE = 1e-5  # the same features through the same heads, other batches (as test_embed)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    base = tmp_path_factory.mktemp("pcme")
    root = flickr8k_layout(base / "f8k", 15)
    vectors, grid = extract_tiny(root, base / "c.h5"), extract_tiny(root, base / "g.h5", "--grid")
    return {"root": root, "vectors": vectors, "grid": grid,
            "pcmepp": train_tiny(vectors, base / "pcmepp", loss="pcmepp", epochs=2),
            "pcme": train_tiny(grid, base / "pcme", "--network", "vse-infty", loss="pcme", epochs=2)}


def _split(checkpoint, cache):
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import encode_split, load_model

    loaded = load_model(checkpoint, torch.device("cpu"))
    with FeatureCache(cache) as fc:
        split = encode_split(loaded.model, fc, loaded.captions(fc), "test", torch.device("cpu"))
        names = [fc.image_ids[r] for r in split.image_rows]
        captions = [fc.captions[r] for r in split.caption_rows]
    return loaded, split, names, captions


def _csd(images, captions) -> np.ndarray:
    """The closed-form sampled distance's score written out, float64: -(||μ_i - μ_c||² + Σσ²_i + Σσ²_c)."""
    images, captions = images.astype(np.float64), captions.astype(np.float64)
    half = images.shape[1] // 2
    mi, vi, mc, vc = images[:, :half], images[:, half:], captions[:, :half], captions[:, half:]
    distance = ((mi[:, None] - mc[None]) ** 2).sum(-1)
    return -(distance + np.exp(vi).sum(1)[:, None] + np.exp(vc).sum(1)[None])


def test_csd_is_the_distance_written_out_and_an_inner_product_of_augmented_vectors():
    from pipeline.core.similarity import csd_augmented, csd_scores, image_caption_scores

    gen = torch.Generator().manual_seed(0)
    def normal(rows):
        return torch.randn(rows, 5, generator=gen, dtype=torch.float64)

    images = torch.cat([torch.nn.functional.normalize(normal(7), dim=1), normal(7) - 2], dim=1)
    captions = torch.cat([normal(9), normal(9) - 1], dim=1)  # means need not be unit
    expected = _csd(images.numpy(), captions.numpy())
    assert np.abs(csd_scores(images, captions).numpy() - expected).max() <= 1e-12 * np.abs(expected).max()
    assert torch.equal(image_caption_scores(images, captions, "csd"), csd_scores(images, captions))
    # either side may be the query: the score is symmetric
    swapped = csd_augmented(captions, "query") @ csd_augmented(images, "gallery").T
    assert np.abs(swapped.T.numpy() - expected).max() <= 1e-12 * np.abs(expected).max()
    with pytest.raises(ValueError, match="even width"):
        csd_scores(images[:, :9], captions[:, :9])


@pytest.mark.parametrize("loss, cache, pool", [("pcmepp", "vectors", None), ("pcme", "grid", "gpo")])
def test_a_tiny_run_trains_evaluates_by_csd_and_embeds_the_variance(made, tmp_path, loss, cache, pool):
    from pipeline.evaluation.metrics import retrieval_metrics, similarity_ranks

    loaded, split, names, captions = _split(made[loss], made[cache])
    # it trained: the learned shift and scale of the match logit left their start (5, 5)
    learned = loaded.state["loss"]
    assert learned["shift"].item() != 5.0 and learned["negative_scale"].item() != 5.0
    model = loaded.model
    assert model.config.similarity == "csd" and model.config.image_pool == pool
    assert model.image_encoder.log_variance is not None and hasattr(model.text_encoder, "log_variance")
    # [unit mean, log-variance] of width 2 × 16; the variances are the model's own, not all alike
    assert split.images.shape[1] == split.captions.shape[1] == 32
    assert np.allclose(np.linalg.norm(split.images[:, :16], axis=1), 1, atol=1e-5)
    assert split.images[:, 16:].std() > 0 and split.captions[:, 16:].std() > 0
    # vse evaluate ranks by the closed-form sampled distance
    result = vse("evaluate", "--checkpoint", made[loss], "--features", made[cache], "--split", "test",
                 "--json")
    assert result.exit_code == 0, result.output
    reported = json.loads(result.stdout)
    scores = _csd(split.images, split.captions)
    eye = np.eye(len(scores), dtype=np.float32)
    expected = retrieval_metrics(*similarity_ranks(eye, scores.T.astype(np.float32).copy(),
                                                   split.caption_image))
    for key in ("i2t_r1", "i2t_r5", "i2t_meanr", "t2i_r1", "t2i_r5", "t2i_meanr", "rsum"):
        assert reported[key] == pytest.approx(expected[key], abs=1e-6), key
    # vse embed: each item's unit mean and its log-variance, as evaluation embeds them
    listing, texts, out = tmp_path / "images.txt", tmp_path / "captions.txt", tmp_path / "e.h5"
    listing.write_text("".join(f"{made['root']}/images/{n}\n" for n in names))
    texts.write_text("".join(f"{c}\n" for c in captions), encoding="utf-8")
    result = vse("embed", made[loss], "--images", listing, "--captions", texts, "--out", out, "--workers", 0,
                 "--no-progress")
    assert result.exit_code == 0, result.output
    with h5py.File(out, "r") as f:
        assert f.attrs["similarity"] == "csd" and int(f.attrs["dim"]) == 16
        for group, embedded in (("images", split.images), ("captions", split.captions)):
            assert np.abs(f[group]["vectors"][()] - embedded[:, :16]).max() <= TOLERANCE
            assert np.abs(f[group]["log_variance"][()] - embedded[:, 16:]).max() <= TOLERANCE
    from pipeline.search.embeddings_file import EmbeddingsFile

    assert np.abs(EmbeddingsFile(out).log_variances("captions") - split.captions[:, 16:]).max() <= TOLERANCE
    refused = vse("index", out, "--out", tmp_path / "index")
    assert_one_error_line(refused, out, "similarity is 'csd'")
    # the Python API gives the same rows ([unit mean, log-variance]) and scores by csd
    import pipeline

    api = pipeline.load_model(made[loss], device="cpu")
    assert api.width == 32
    rows = api.embed_images(cache=made[cache], split="test")
    assert np.abs(rows - split.images).max() <= TOLERANCE
    assert np.abs(api.score(rows, split.captions) - scores).max() <= 1e-4  # float32 against float64


def test_an_embeddings_file_without_its_variances_is_refused(made, tmp_path):
    from pipeline.search.embeddings_file import EmbeddingsFile

    out = tmp_path / "e.h5"
    texts = tmp_path / "captions.txt"
    texts.write_text("a dog runs\na child plays\n", encoding="utf-8")
    assert vse("embed", made["pcmepp"], "--captions", texts, "--out", out, "--no-progress").exit_code == 0
    with h5py.File(out, "a") as f:
        del f["captions"]["log_variance"]
    with pytest.raises(Exception, match="log_variance has shape None"):
        EmbeddingsFile(out)


def test_a_pairwise_or_plug_in_network_is_refused_for_a_probabilistic_loss(made, tmp_path):
    result = vse("train", "--features", made["grid"], "--run-dir", tmp_path / "r", "--loss", "pcmepp",
                 "--network", "sgr", "--epochs", 1, "--workers", 0, "--device", "cpu", "--min-word-count", 1)
    assert result.exit_code == 1 and "reads the embeddings themselves" in result.stderr
