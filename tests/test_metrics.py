"""Ranks, recall metrics, COCO protocols and CS@K against hand values and slow references."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import kendalltau

from pipeline.core.errors import VseError
from pipeline.evaluation.metrics import (
    METRIC_KEYS,
    coherent_score,
    coherent_scores,
    evaluate_embeddings,
    retrieval_metrics,
    similarity_ranks,
)

# ---------------------------------------------------------------------------- slow references


def slow_ranks(scores, caption_image):
    """PROTOCOL.md ranks with Python loops; scores[i][j] = s(image i, caption j)."""
    num_images, num_captions = scores.shape
    i2t = []
    for k in range(num_images):
        best = max(scores[k, j] for j in range(num_captions) if caption_image[j] == k)
        i2t.append(sum(1 for j in range(num_captions)
                       if caption_image[j] != k and scores[k, j] >= best))
    t2i = []
    for j in range(num_captions):
        k = caption_image[j]
        t2i.append(sum(1 for i in range(num_images) if i != k and scores[i, j] >= scores[k, j]))
    return np.array(i2t), np.array(t2i)


def order_scores(images, captions):
    return np.array([[-np.sum(np.maximum(0.0, c - i) ** 2) for c in captions] for i in images])


def vsepp_reference_ranks(images, captions):
    """The VSE++ reference ``i2t``/``t2i``: position of the best truth in a descending sort."""
    n = len(images)
    i2t = np.zeros(n, dtype=np.int64)
    for index in range(n):
        inds = np.argsort(images[index] @ captions.T)[::-1]
        i2t[index] = min(np.where(inds == i)[0][0] for i in range(5 * index, 5 * index + 5))
    t2i = np.zeros(5 * n, dtype=np.int64)
    for j in range(5 * n):
        inds = np.argsort(captions[j] @ images.T)[::-1]
        t2i[j] = np.where(inds == j // 5)[0][0]
    return i2t, t2i


def integer_embeddings(rng, num_images, num_captions, dim=3):
    """Small-integer embeddings: every score is exact, and exact ties are frequent."""
    return (rng.integers(-2, 3, (num_images, dim)).astype(np.float64),
            rng.integers(-2, 3, (num_captions, dim)).astype(np.float64))


# ---------------------------------------------------------------------------- ranks


@pytest.fixture(params=["one product", "blocked products"])
def score_paths(request, monkeypatch):
    """Run a rank test through both code paths: the score matrix held once for both
    directions, and recomputed in blocks per direction (what large test sets use)."""
    import pipeline.evaluation.metrics

    if request.param == "blocked products":
        monkeypatch.setattr(pipeline.evaluation.metrics, "FULL_MATRIX_ELEMENTS", 0)
    return request.param


@pytest.mark.usefixtures("score_paths")
def test_ranks_golden_with_ties():
    # images = identity, so S[i, j] = captions[j, i].
    scores = np.array([[0.1, 0.5, 0.3, 0.2, 0.0, 0.6, 0.5, 0.4, 0.1, 0.0],
                       [0.9, 0.1, 0.2, 0.3, 0.4, 0.8, 0.2, 0.1, 0.0, 0.05]])
    i2t, t2i = similarity_ranks(np.eye(2), scores.T)
    # Image 0: best truth 0.5, beaten or tied by 0.6 and 0.5 → 2.  Image 1: 0.8 < 0.9 → 1.
    assert i2t.tolist() == [2, 1]
    assert t2i.tolist() == [1, 0, 0, 1, 1, 0, 1, 1, 1, 0]
    metrics = retrieval_metrics(i2t, t2i)
    assert metrics == {
        "i2t_r1": 0.0, "i2t_r5": 100.0, "i2t_r10": 100.0, "i2t_medr": 2.0, "i2t_meanr": 2.5,
        "t2i_r1": 40.0, "t2i_r5": 100.0, "t2i_r10": 100.0, "t2i_medr": 2.0,
        "t2i_meanr": pytest.approx(1.6), "rsum": 440.0, "mrecall": pytest.approx(440 / 6)}


@pytest.mark.usefixtures("score_paths")
def test_constant_model_ranks_last():
    # Small integers and halves: every product is exact on any BLAS, so the identical rows
    # really tie (with random normal entries some CPUs' kernels round the tail of a row
    # differently and the "ties" differ in the last bit).
    images = np.tile([1.0, -2.0, 0.5, 3.0, 0.0, -1.5, 2.0, 1.0], (20, 1))
    captions = np.tile([0.5, 1.0, -1.0, 2.0, 4.0, 0.25, -3.0, 1.0], (100, 1))
    i2t, t2i = similarity_ranks(images, captions, block=7)
    assert (i2t == 95).all() and (t2i == 19).all()
    metrics = retrieval_metrics(i2t, t2i)
    assert metrics["rsum"] == 0.0 and metrics["i2t_medr"] == 96 and metrics["t2i_meanr"] == 20


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block", [1, 4, 1000])
@pytest.mark.usefixtures("score_paths")
def test_ranks_match_slow_loop_with_ties(seed, block):
    rng = np.random.default_rng(seed)
    images, captions = integer_embeddings(rng, 12, 60)
    got = similarity_ranks(images, captions, block=block)
    expected = slow_ranks(images @ captions.T, np.arange(60) // 5)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.usefixtures("score_paths")
def test_general_caption_index_matches_slow_loop(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 5, 15)
    caption_image = rng.permutation(np.repeat(np.arange(15), counts))
    images, captions = integer_embeddings(rng, 15, len(caption_image))
    got = similarity_ranks(images, captions, caption_image, block=4)
    expected = slow_ranks(images @ captions.T, caption_image)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.usefixtures("score_paths")
def test_without_ties_equals_the_vsepp_reference():
    rng = np.random.default_rng(3)
    images = rng.standard_normal((40, 16))
    captions = np.repeat(images, 5, axis=0) + rng.standard_normal((200, 16))
    # Continuous scores are safe here only because no two scores of one query are within
    # BLAS rounding of each other (GEMM and the reference's GEMV may differ in the last bit):
    scores = images @ captions.T
    assert min(np.diff(np.sort(scores, axis=1), axis=1).min(),
               np.diff(np.sort(scores, axis=0), axis=0).min()) > 1e-9
    got = similarity_ranks(images, captions, block=16)
    expected = vsepp_reference_ranks(images, captions)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert 0 < retrieval_metrics(*got)["rsum"] < 600  # neither trivial nor hopeless


@pytest.mark.usefixtures("score_paths")
def test_order_scores_golden_and_slow_loop():
    images = np.array([[1.0, 1.0], [0.0, 2.0]])
    captions = np.array([[0.5, 0.5], [1.0, 3.0]])
    # S = [[0, -4], [-0.25, -2]]: image 1's own caption (-2) loses to caption 0 (-0.25).
    i2t, t2i = similarity_ranks(images, captions, [0, 1], similarity="order")
    assert i2t.tolist() == [0, 1] and t2i.tolist() == [0, 0]
    rng = np.random.default_rng(4)
    images, captions = (np.abs(a) for a in integer_embeddings(rng, 9, 45, dim=4))
    got = similarity_ranks(images, captions, similarity="order", block=2)
    expected = slow_ranks(order_scores(images, captions), np.arange(45) // 5)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_tensor_and_low_precision_inputs():
    rng = np.random.default_rng(5)
    images, captions = integer_embeddings(rng, 10, 50)
    expected = similarity_ranks(images, captions)
    for convert in (torch.from_numpy, lambda a: torch.from_numpy(a).half(),
                    lambda a: a.astype(np.float32)):
        got = similarity_ranks(convert(images), convert(captions))
        assert got[0].dtype == np.int64
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("call, message", [
    (lambda: similarity_ranks(np.ones((3, 4)), np.ones((14, 4))), "there must be 5 per image"),
    (lambda: similarity_ranks(np.ones((3, 4)), np.ones((15, 5))), "dimension 5, expected 4"),
    (lambda: similarity_ranks(np.full((3, 4), np.nan), np.ones((15, 4))), "NaN or infinite"),
    (lambda: similarity_ranks(np.ones((3, 4)), np.ones((4, 4)), [0, 1, 1, 3]), "outside 0..2"),
    (lambda: similarity_ranks(np.ones((3, 4)), np.ones((4, 4)), [0, 1, 1, 1]),
     "without any caption"),
    (lambda: similarity_ranks(np.ones((3, 4)), np.ones((15, 4)), block=0), "block must be"),
    (lambda: retrieval_metrics([], [1]), "non-empty"),
])
def test_bad_inputs_raise_one_line_errors(call, message):
    with pytest.raises(VseError, match=message):
        call()


# ---------------------------------------------------------------------------- metrics, protocols


def test_retrieval_metrics_golden():
    metrics = retrieval_metrics([0, 1, 4, 9, 10], [0, 1, 2, 3])
    assert list(metrics) == list(METRIC_KEYS)
    assert all(type(v) is float for v in metrics.values())
    assert (metrics["i2t_r1"], metrics["i2t_r5"], metrics["i2t_r10"]) == (20.0, 60.0, 80.0)
    assert metrics["i2t_medr"] == 5.0 and metrics["i2t_meanr"] == pytest.approx(5.8)
    # Median 1.5 is floored: medr = 1 + 1.
    assert metrics["t2i_medr"] == 2.0 and metrics["t2i_meanr"] == 2.5
    assert metrics["rsum"] == pytest.approx(20 + 60 + 80 + 25 + 100 + 100)
    assert metrics["mrecall"] == pytest.approx(metrics["rsum"] / 6)


def test_single_protocol_is_the_metrics_of_the_ranks():
    rng = np.random.default_rng(6)
    images, captions = integer_embeddings(rng, 14, 70)
    expected = retrieval_metrics(*slow_ranks(images @ captions.T, np.arange(70) // 5))
    assert evaluate_embeddings(images, captions) == expected


@pytest.mark.parametrize("shuffled", [False, True])
def test_five_fold_protocol_averages_per_fold_metrics(shuffled):
    rng = np.random.default_rng(7)
    fold_size = 6
    images, captions = integer_embeddings(rng, 5 * fold_size, 25 * fold_size)
    caption_image = np.arange(25 * fold_size) // 5
    if shuffled:
        caption_image = rng.permutation(caption_image)
    got = evaluate_embeddings(images, captions, caption_image, "5fold", fold_size=fold_size)
    folds = []
    for fold in range(5):
        rows = slice(fold * fold_size, (fold + 1) * fold_size)
        mine = np.flatnonzero(caption_image // fold_size == fold)
        scores = images[rows] @ captions[mine].T
        folds.append(retrieval_metrics(*slow_ranks(scores, caption_image[mine] - fold * fold_size)))
    assert got["folds"] == folds
    for key in METRIC_KEYS:
        assert got[key] == pytest.approx(np.mean([f[key] for f in folds]))
    # Folds see only their own candidates: the 1K numbers differ from the single protocol.
    assert got["rsum"] != evaluate_embeddings(images, captions, caption_image)["rsum"]


def test_protocol_size_checks():
    images, captions = np.ones((30, 3)), np.ones((150, 3))
    with pytest.raises(VseError, match="exactly 5 × 1000 = 5000 images, got 30"):
        evaluate_embeddings(images, captions, protocol="5fold")
    with pytest.raises(VseError, match="at least 5000 images, got 30"):
        evaluate_embeddings(images, captions, protocol="5k")
    with pytest.raises(VseError, match="unknown evaluation protocol 'coco'"):
        evaluate_embeddings(images, captions, protocol="coco")


def test_five_k_protocol_is_all_images_at_once():
    # Integer embeddings: the two paths use different block shapes, and with continuous
    # float32 scores a last-bit difference between GEMM kernels could flip a near-tie.
    rng = np.random.default_rng(8)
    images = rng.integers(-3, 4, (5000, 4)).astype(np.float32)
    captions = np.repeat(images, 5, axis=0) + rng.integers(-2, 3, (25000, 4)).astype(np.float32)
    assert (evaluate_embeddings(images, captions, protocol="5k")
            == evaluate_embeddings(images, captions, block=700))


# ---------------------------------------------------------------------------- coherent score


def slow_coherent_taus(scores, relevance, k):
    taus = []
    for s, r in zip(scores, relevance):
        top = np.argsort(-s, kind="stable")[:k]
        taus.append(kendalltau(s[top], r[top]).statistic)
    return np.array(taus, dtype=np.float64)


def test_coherent_score_golden():
    # Top 3: scores .9 > .5 > .1 with relevance 1, .2, .5: 2 concordant, 1 discordant pair.
    scores = [[0.9, 0.5, 0.1, 0.0]]
    relevance = [[1.0, 0.2, 0.5, 0.9]]
    assert coherent_score(scores, relevance, 3) == pytest.approx(1 / 3)
    assert coherent_score(scores, relevance, 4) == pytest.approx(0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [2, 7, 60])
def test_coherent_score_matches_scipy_with_ties(seed, k):
    rng = np.random.default_rng(seed)
    scores = np.round(rng.standard_normal((25, 60)), 1).astype(np.float32)   # tied scores
    relevance = rng.random((25, 60)).astype(np.float16)                     # quantised
    relevance[:5] = np.round(relevance[:5] * 4) / 4                         # heavy ties
    expected = slow_coherent_taus(scores, relevance, k)
    assert coherent_score(scores, relevance, k) == pytest.approx(np.nanmean(expected),
                                                                 abs=1e-12)


def test_coherent_score_large_k_in_blocks():
    rng = np.random.default_rng(3)
    scores = rng.standard_normal((6, 2500))
    relevance = np.round(rng.random((6, 2500)), 2)
    expected = np.nanmean(slow_coherent_taus(scores, relevance, 2500))
    assert coherent_score(scores, relevance, 2500) == pytest.approx(expected, abs=1e-12)


def test_undefined_tau_queries_are_left_out():
    rng = np.random.default_rng(4)
    scores = rng.standard_normal((4, 10))
    relevance = rng.random((4, 10))
    relevance[1] = 0.5                      # all relevances tied → tau undefined
    scores[2] = 1.0                         # all scores tied → tau undefined
    taus = slow_coherent_taus(scores, relevance, 5)
    assert np.isnan(taus[1]) and np.isnan(taus[2])
    assert coherent_score(scores, relevance, 5) == pytest.approx(np.mean(taus[[0, 3]]))
    assert math.isnan(coherent_score(np.ones((2, 5)), rng.random((2, 5)), 3))


def test_coherent_scores_both_directions():
    rng = np.random.default_rng(5)
    images = rng.standard_normal((30, 8))
    captions = images + rng.standard_normal((30, 8))
    relevance = rng.random((30, 30))        # asymmetric on purpose: t2i must transpose
    got = coherent_scores(images, captions, relevance, ks=(5, 30), block=7)
    scores = images @ captions.T
    assert set(got) == {"i2t_cs@5", "i2t_cs@30", "t2i_cs@5", "t2i_cs@30"}
    for k in (5, 30):
        assert got[f"i2t_cs@{k}"] == pytest.approx(
            np.nanmean(slow_coherent_taus(scores, relevance, k)), abs=1e-12)
        assert got[f"t2i_cs@{k}"] == pytest.approx(
            np.nanmean(slow_coherent_taus(scores.T, relevance.T, k)), abs=1e-12)


def test_coherent_score_input_checks():
    with pytest.raises(VseError, match="2 <= K <= 4"):
        coherent_score(np.ones((2, 4)), np.ones((2, 4)), 5)
    with pytest.raises(VseError, match="does not match scores"):
        coherent_score(np.ones((2, 4)), np.ones((2, 3)), 2)
    with pytest.raises(VseError, match="one caption per image"):
        coherent_scores(np.ones((3, 2)), np.ones((15, 2)), np.ones((3, 3)), ks=(2,))
    with pytest.raises(VseError, match="relevance must be 3 × 3"):
        coherent_scores(np.ones((3, 2)), np.ones((3, 2)), np.ones((15, 15)), ks=(2,))


# ---------------------------------------------------------------------------- CS@K, the authors' code


def reference_cs(scores, relevance, k):
    """The ladder-loss code (cdluminate/ladderloss, doTau): ``np.argsort(s)[::-1][:K]`` and a
    plain mean.  Its default sort is stable on rows this short (and ascending reversed puts
    the higher index first among ties); written with kind="stable" to make that explicit."""
    taus = [kendalltau(s[idx], r[idx]).statistic
            for s, r in zip(scores, relevance)
            for idx in [np.argsort(s, kind="stable")[::-1][:k]]]
    return float(np.mean(taus))


def test_coherent_score_tie_at_place_k_both_ways():
    # Candidates 1 and 2 tie for place 2.  Ours keeps the lower index (1): scores 1 > .5 with
    # relevance .5 < 1, discordant → -1.  The reference keeps 2: relevance .5 > 0 → +1.
    scores = np.array([[1.0, 0.5, 0.5, 0.0]])
    relevance = np.array([[0.5, 1.0, 0.0, 0.25]])
    assert coherent_score(scores, relevance, 2) == -1.0
    assert coherent_score(scores, relevance, 2, tie_break="high") == 1.0
    assert reference_cs(scores, relevance, 2) == 1.0
    images, captions = np.eye(4), scores.repeat(4, axis=0).T  # i2t row 0 is the row above
    got = coherent_scores(images, captions, relevance.repeat(4, axis=0), ks=(2,), tie_break="high")
    assert got["i2t_cs@2"] == pytest.approx(reference_cs(images @ captions.T,
                                                         relevance.repeat(4, axis=0), 2))
    with pytest.raises(VseError, match="tie_break must be one of low, high"):
        coherent_score(scores, relevance, 2, tie_break="first")


def test_coherent_score_undefined_tau_left_out_where_the_reference_gives_nan():
    # Query 1's relevances all tie: its tau is undefined.
    scores = np.array([[1.0, 0.5, 0.0], [1.0, 0.5, 0.0]])
    relevance = np.array([[1.0, 0.5, 0.0], [0.5, 0.5, 0.5]])
    assert coherent_score(scores, relevance, 3) == 1.0
    assert math.isnan(reference_cs(scores, relevance, 3))


@pytest.mark.parametrize("seed", [0, 1])
def test_coherent_score_equals_the_reference_without_ties(seed):
    rng = np.random.default_rng(seed)
    scores, relevance = rng.standard_normal((20, 50)), rng.random((20, 50))
    for k in (5, 50):
        for tie_break in ("low", "high"):
            assert coherent_score(scores, relevance, k, tie_break=tie_break) == pytest.approx(
                reference_cs(scores, relevance, k), abs=1e-12)


def test_old_order_keyword_still_works_with_a_note():
    """order= was the old spelling of similarity=: kept for one version, and it says so."""
    torch.manual_seed(0)
    images, captions = torch.randn(4, 3).abs(), torch.randn(20, 3).abs()
    new = similarity_ranks(images, captions, similarity="order")
    with pytest.warns(DeprecationWarning, match="similarity="):
        old = similarity_ranks(images, captions, order=True)
    assert all(np.array_equal(a, b) for a, b in zip(new, old))
    with pytest.warns(DeprecationWarning):
        assert evaluate_embeddings(images, captions, order="order-norm") == \
            evaluate_embeddings(images, captions, similarity="order-norm")
