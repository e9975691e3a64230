"""Relevance stage: vectorisers against independent computations, the file, the batch object."""

from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
import torch

from pipeline.core.errors import VseError
from pipeline.relevance import (
    BatchRelevance,
    RelevanceFn,
    SvdModel,
    build_relevance,
    compute_relevance_vectors,
    project_captions,
    read_relevance,
    svd_terms,
)
from pipeline.relevance.neighbours import top_neighbours
from pipeline.relevance.svd import STOP_WORDS
from tests.conftest import demo_captions, write_feature_cache

CORPUS = [
    "A dog runs across the green grass .",
    "Two dogs are running on the grass in a park",
    "A brown dog jumps over a fence",
    "A man rides a bicycle down the street",
    "A cyclist riding his bike on a city street .",
    "Children play football on the beach",
    "Kids playing soccer near the ocean",
    "A woman in a red dress walks her dog on the beach",
    "The man is climbing a large rock wall",
    "A climber scales the rock face",
]


def unit(x):
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


def same_vs_different(vectors, caption_image):
    """Mean relevance of same-image pairs (self excluded) and of different-image pairs."""
    rel = vectors @ vectors.T
    same = caption_image[:, None] == caption_image[None, :]
    np.fill_diagonal(same, False)
    different = caption_image[:, None] != caption_image[None, :]
    return rel[same].mean(), rel[different].mean()


# ------------------------------------------------------------------------------ svd


def test_svd_terms_follow_lseh_preprocessing():
    # letters only ("dog's" → dog, s; "2" gone), stop words (the, through, an) and words
    # under 3 letters (s, on) dropped, then Porter stems.
    assert svd_terms("The dog's running through an OLD field, on 2 grassy hills!") == \
        ["dog", "run", "old", "field", "grassi", "hill"]
    assert {"the", "through", "an", "and"} <= STOP_WORDS


def _independent_lseh(train, captions, k):
    """TF-IDF by hand (smooth idf, raw counts, l2 rows) and an exact dense SVD: the
    projections A·V_k of all captions, and the singular values."""
    docs = [svd_terms(c) for c in captions]
    vocab = sorted({t for i in train for t in docs[i]})
    col = {t: j for j, t in enumerate(vocab)}
    counts = np.zeros((len(captions), len(vocab)))
    for i, doc in enumerate(docs):
        for t in doc:
            if t in col:
                counts[i, col[t]] += 1
    df = (counts[train] > 0).sum(axis=0)
    idf = np.log((1 + len(train)) / (1 + df)) + 1
    tfidf = unit(counts * idf)
    _, s, vt = np.linalg.svd(tfidf[train], full_matrices=False)
    return tfidf @ vt[:k].T, s, len(vocab)


@pytest.fixture(scope="module")
def lseh_reference():
    """40 real images: 30 to fit on, 10 held out; the independent k=20 computation."""
    _, captions = demo_captions(40)
    train = np.arange(150)
    return (captions, train, *_independent_lseh(train, captions, 20))


def test_svd_vectors_match_independent_tfidf_and_exact_svd(lseh_reference):
    captions, train, projection, singular, num_terms = lseh_reference
    k = 20
    assert singular[k + 9] < 0.9 * singular[k - 1]  # the randomized SVD's 10 extra vectors converge
    rv, model = compute_relevance_vectors(captions, train, "svd", k=k, svd_iterations=30)
    assert rv.vectors.shape == (200, k) and rv.vectors.dtype == np.float32
    assert model.num_terms == num_terms  # vocabulary from the training captions only
    # vectors are defined up to a rotation of the subspace: compare cosines of the captions
    # the subspace sees (a caption of only rare words can lie outside it: a zero row)
    norms = np.linalg.norm(projection, axis=1)
    seen, outside = norms > 0.05, norms < 1e-6
    assert seen.sum() > 180 and outside.any()
    expected = unit(projection[seen])
    np.testing.assert_allclose(rv.vectors[seen] @ rv.vectors[seen].T, expected @ expected.T, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(rv.vectors[seen], axis=1), 1, atol=1e-5)
    assert not rv.vectors[outside].any()


def test_default_svd_iterations_capture_the_top_k_energy(lseh_reference):
    captions, train, _, singular, _ = lseh_reference
    _, model = compute_relevance_vectors(captions, train, "svd", k=20)
    tfidf = model.tfidf.transform([captions[i] for i in train])
    captured = np.square(model.svd.transform(tfidf)).sum()
    assert captured > 0.99 * np.square(singular[:20]).sum()


def test_svd_k_is_lowered_to_what_the_training_captions_allow():
    rv, model = compute_relevance_vectors(CORPUS, np.arange(6), "svd", k=400)
    assert model.k == 6 and rv.params["k_requested"] == 400 and rv.vectors.shape == (10, 6)


def test_project_captions_reproduces_the_stored_vectors(tmp_path):
    rv, model = compute_relevance_vectors(CORPUS, np.arange(8), "svd", k=5)
    path = model.save(tmp_path / "m.svd.joblib")
    np.testing.assert_allclose(project_captions(CORPUS, path), rv.vectors, atol=1e-6)
    assert SvdModel.load(path).k == 5
    (tmp_path / "bad.joblib").write_bytes(b"not a pickle")
    with pytest.raises(VseError, match="cannot read SVD relevance model"):
        project_captions(CORPUS, tmp_path / "bad.joblib")


# ------------------------------------------------------------------------------ cbow / bert


def test_cbow_is_the_normalised_mean_of_glove_vectors():
    from pipeline.text.glove import load_glove

    index, table = load_glove()
    captions = ["A dog runs", "qzxv wwqk", "dog dog cat"]
    rv, _ = compute_relevance_vectors(captions, np.arange(3), "cbow")
    expected = unit(np.stack([
        (table[index["a"]] + table[index["dog"]] + table[index["runs"]]) / 3,
        np.zeros(50),
        (2 * table[index["dog"]] + table[index["cat"]]) / 3]).astype(np.float64))
    np.testing.assert_allclose(rv.vectors, expected, atol=1e-6)
    assert rv.counts == {"captions_without_known_words": 1}


def test_cbow_blocks_give_the_same_vectors(monkeypatch):
    import pipeline.text.cbow as cbow

    _, captions = demo_captions(4)
    captions = captions + ["qzxv"]
    whole, empty = cbow.cbow_vectors(captions)
    monkeypatch.setattr(cbow, "_BLOCK", 3)
    blocked, blocked_empty = cbow.cbow_vectors(captions)
    np.testing.assert_allclose(blocked, whole, atol=1e-6)
    assert empty == blocked_empty == 1


@pytest.mark.parametrize("method", ["cbow", "bert"])
def test_same_image_captions_are_more_relevant_on_real_captions(method):
    _, captions = demo_captions(8)
    caption_image = np.repeat(np.arange(8), 5)
    rv, _ = compute_relevance_vectors(captions, np.arange(40), method, device="cpu")
    same, different = same_vs_different(rv.vectors, caption_image)
    assert same > different + (0.02 if method == "cbow" else 0.2)


def test_cbow_plus_bert_gates_bert_by_the_cbow_threshold():
    _, captions = demo_captions(6)
    rv, _ = compute_relevance_vectors(captions, np.arange(30), "cbow+bert", device="cpu",
                                      cbow_threshold=0.9)
    fine, _ = compute_relevance_vectors(captions, np.arange(30), "bert", device="cpu")
    coarse, _ = compute_relevance_vectors(captions, np.arange(30), "cbow")
    np.testing.assert_allclose(rv.vectors, fine.vectors, atol=1e-6)
    np.testing.assert_allclose(rv.coarse_vectors, coarse.vectors, atol=1e-6)
    cb = coarse.vectors @ coarse.vectors.T
    assert 0 < (cb < 0.9).mean() < 1  # the gate bites on some pairs, not all
    expected = np.where(cb < 0.9, 0.0, fine.vectors @ fine.vectors.T)
    got = BatchRelevance(rv.vectors, coarse_vectors=rv.coarse_vectors, cbow_threshold=0.9)(
        torch.arange(30))
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)


# ------------------------------------------------------------------------------ neighbours


def test_neighbours_match_brute_force_in_several_blocks():
    rng = np.random.default_rng(0)
    vectors = unit(rng.standard_normal((23, 6))).astype(np.float32)
    coarse = unit(rng.standard_normal((23, 3))).astype(np.float32)
    pool = np.array([0, 2, 3, 5, 7, 8, 11, 13, 17, 19, 20])
    for coarse_vectors, threshold in [(None, None), (coarse, 0.1)]:
        idx, scores = top_neighbours(vectors, pool, 4, coarse_vectors=coarse_vectors,
                                     threshold=threshold, device="cpu", block_bytes=4 * 11 * 5)
        for q in range(23):
            rel = {int(p): float(vectors[q] @ vectors[p]) for p in pool if p != q}
            if coarse_vectors is not None:
                rel = {p: (0.0 if coarse[q] @ coarse[p] < threshold else r) for p, r in rel.items()}
            best = sorted(rel.items(), key=lambda kv: -kv[1])[:4]
            np.testing.assert_allclose(scores[q], [r for _, r in best], atol=1e-6)
            nonzero = [p for p, r in best if r != 0.0]  # ties at 0 may come in any order
            assert list(idx[q][:len(nonzero)]) == nonzero
            assert q not in idx[q] and set(idx[q]) <= set(pool.tolist())


def test_neighbours_count_is_checked():
    with pytest.raises(VseError, match="--neighbours must be between 1 and 2"):
        top_neighbours(np.eye(4, dtype=np.float32), np.arange(3), 3, device="cpu")


# ------------------------------------------------------------------------------ file + batch


@pytest.fixture(scope="module")
def svd_file(tmp_path_factory, tiny_cache):
    out = tmp_path_factory.mktemp("rel") / "tiny_svd.h5"
    summary = build_relevance(tiny_cache, "svd", out, k=30, neighbours=5, dtype="float16", device="cpu")
    return out, summary


def test_build_writes_every_caption_fitted_on_train(svd_file, tiny_cache):
    from pipeline.data.cache import FeatureCache

    out, summary = svd_file
    with FeatureCache(tiny_cache) as cache:
        captions, train = cache.captions, cache.split_captions("train")
    stored = read_relevance(out, neighbours=True)
    assert stored.method == "svd" and stored.vectors.shape == (200, 30)
    assert stored.vectors.dtype == np.float16 and summary.num_fit_captions == len(train) == 120
    assert stored.attrs["format"] == "vse-relevance" and stored.attrs["features_file"] == str(tiny_cache)
    assert stored.identity["scikit-learn"] and json.loads(stored.attrs["params"])["k"] == 30
    train_terms = {t for i in train for t in svd_terms(captions[i])}
    assert stored.params["num_terms"] == len(train_terms)
    assert summary.svd_model == out.with_name("tiny_svd.h5.svd.joblib")
    np.testing.assert_allclose(project_captions(captions, summary.svd_model), stored.vectors, atol=2e-3)
    # neighbours: training captions only, never the caption itself, scores = stored cosines
    idx, scores = stored.neighbour_indices, stored.neighbour_scores
    assert idx.shape == (200, 5) and np.isin(idx, train).all()
    assert not (idx == np.arange(200)[:, None]).any()
    v = stored.vectors.astype(np.float32)
    np.testing.assert_allclose(scores, np.einsum("qd,qnd->qn", v, v[idx]), atol=2e-3)
    assert (np.diff(scores, axis=1) <= 1e-6).all()


def test_batch_relevance_is_the_submatrix_of_all_cosines(svd_file):
    out, _ = svd_file
    batch = BatchRelevance(out)
    assert isinstance(batch, RelevanceFn) and batch.method == "svd" and len(batch) == 200
    v = read_relevance(out).vectors.astype(np.float32)
    full = v @ v.T
    idx = torch.tensor([17, 3, 199, 3, 0, 120])  # any order, repeats allowed
    got = batch(idx)
    assert got.dtype == torch.float32 and got.shape == (6, 6) and got.device == idx.device
    np.testing.assert_allclose(got.numpy(), full[np.ix_(idx.numpy(), idx.numpy())], atol=1e-6)
    with pytest.raises(IndexError):
        batch(torch.tensor([0, 200]))
    with pytest.raises(VseError, match="relevance file has 200 captions but the feature cache has 5000"):
        BatchRelevance(out, num_captions=5000)


def test_any_function_of_caption_indices_serves_as_the_batch_relevance():
    """A plain function (B,) → (B, B) stands where a BatchRelevance does: a loss that uses
    relevance computes the same value from either."""
    from pipeline.losses.base import build_loss

    def constant(indices):
        return torch.ones(len(indices), len(indices))

    assert isinstance(constant, RelevanceFn)
    stored = BatchRelevance(np.full((6, 4), 0.5, dtype=np.float32))  # unit rows, every cosine 1
    idx = torch.tensor([0, 3, 5, 2])
    torch.testing.assert_close(stored(idx), constant(idx))
    g = torch.Generator().manual_seed(0)
    img, cap = (torch.nn.functional.normalize(torch.randn(4, 8, generator=g), dim=1) for _ in range(2))
    loss = build_loss("lseh")
    assert loss(img, cap, relevance=constant(idx)).item() == pytest.approx(
        loss(img, cap, relevance=stored(idx)).item(), abs=1e-6)
    assert loss(img, cap, relevance=constant(idx)).item() != pytest.approx(
        loss(img, cap, relevance=torch.zeros(4, 4)).item())  # the relevance is read


def test_relevance_file_round_trips_cbow_plus_bert(tmp_path, tiny_cache):
    out = tmp_path / "cb.h5"
    build_relevance(tiny_cache, "cbow+bert", out, cbow_threshold=0.95, device="cpu")
    stored = read_relevance(out)
    assert stored.cbow_threshold == 0.95 and stored.coarse_vectors.shape == (200, 50)
    assert stored.identity["fine"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    idx = torch.arange(0, 200, 7)
    fine, coarse = stored.vectors[idx.numpy()], stored.coarse_vectors[idx.numpy()]
    expected = np.where(coarse @ coarse.T < 0.95, 0.0, fine @ fine.T)
    np.testing.assert_allclose(BatchRelevance(out)(idx).numpy(), expected, atol=1e-5)


# ------------------------------------------------------------------------------ bad input


def test_bad_inputs_are_one_line_errors(tmp_path, tiny_cache):
    with pytest.raises(VseError, match="feature cache not found"):
        build_relevance(tmp_path / "missing.h5", "svd", tmp_path / "o.h5")
    with pytest.raises(VseError, match="unknown relevance method 'tfidf'"):
        build_relevance(tiny_cache, "tfidf", tmp_path / "o.h5")
    with pytest.raises(VseError, match="--neighbours must be at most 119"):
        build_relevance(tiny_cache, "svd", tmp_path / "o.h5", neighbours=120)
    with pytest.raises(VseError, match="no split 'restval'"):
        build_relevance(tiny_cache, "cbow", tmp_path / "o.h5", fit_splits=("restval",))
    with pytest.raises(VseError, match="relevance file not found"):
        BatchRelevance(tmp_path / "nothing.h5")
    with pytest.raises(VseError, match="not a vse relevance file"):
        BatchRelevance(tiny_cache)
    no_captions = write_feature_cache(tmp_path / "empty.h5", np.zeros((2, 4)), [], np.zeros(0, np.int64),
                                      {"train": np.arange(2)})
    with pytest.raises(VseError, match="feature cache has no captions"):
        build_relevance(no_captions, "svd", tmp_path / "o.h5")
    stripped = tmp_path / "stripped.h5"
    stripped.write_bytes(tiny_cache.read_bytes())
    with h5py.File(stripped, "a") as f:
        del f["captions"]
    with pytest.raises(VseError, match="captions"):
        build_relevance(stripped, "svd", tmp_path / "o.h5")
    assert not (tmp_path / "o.h5").exists()


def test_cli_writes_the_file_and_reports_errors_in_one_line(tmp_path, tiny_cache):
    from click.testing import CliRunner

    main = pytest.importorskip("cli.main")
    out = tmp_path / "c.h5"
    result = CliRunner().invoke(main.cli, ["relevance", "--features", str(tiny_cache), "--method",
                                           "cbow", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert re.search(r"200 captions x 50 \(cbow, 120 train captions\)", result.output)
    assert read_relevance(out).method == "cbow"
    result = CliRunner().invoke(main.cli, ["relevance", "--features", str(tmp_path / "nope.h5"),
                                           "--method", "svd", "--out", str(out)])
    assert result.exit_code == 1 and result.output.strip().count("\n") == 0
    assert "feature cache not found" in result.output
