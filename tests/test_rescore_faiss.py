"""A dual network's bank as vectors (pipeline/evaluation/rescore_bank.py, ``VectorBank``): the bank's
k-NN through an exact FAISS index equals the torch path over the materialised score matrix.

On random unit vectors (continuous: no two scores tie) the k nearest reference queries of each
gallery item are the same set on both paths and their scores agree to 1e-5 (float32 inner products
summed in another order); each method's fit and corrected matrices agree to the same tolerance. Ties
(duplicated reference queries): which tied rows FAISS keeps is its own choice, so only the values and
their mean are compared. Float64 vectors stay on the torch path, equal to the matrix's to 1e-12.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from pipeline.core.errors import VseError
from pipeline.core.similarity import image_caption_scores
from pipeline.evaluation import rescore, rescore_bank
from pipeline.evaluation.rescore import RESCORE_NAMES, build_rescorer
from pipeline.evaluation.rescore_bank import VectorBank, reference_bank

TOL = 1e-5  # float32 scores of unit vectors (|s| <= 1): summation order only


def unit(rng, n, d=24, dtype=np.float32):
    x = rng.standard_normal((n, d))
    return torch.from_numpy((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(dtype))


def vectors(seed=0, bank=200, gallery=90, queries=40):
    rng = np.random.default_rng(seed)
    return unit(rng, bank), unit(rng, gallery), unit(rng, queries)


@pytest.mark.parametrize("k", [1, 7, 200])
def test_faiss_knn_is_the_torch_topk_of_the_score_matrix(k):
    bank, gallery, _ = vectors()
    values, rows = rescore_bank.faiss_topk(VectorBank(bank, gallery), k)
    expected = (bank @ gallery.T).T.topk(k, dim=1)
    assert values.shape == rows.shape == (90, k)
    for item in range(90):
        assert set(rows[item].tolist()) == set(expected.indices[item].tolist())
    torch.testing.assert_close(values.sort(dim=1).values, expected.values.sort(dim=1).values,
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("method", [m for m in RESCORE_NAMES if not build_rescorer(m).transductive])
def test_vector_bank_equals_the_score_matrix_bank(method, monkeypatch):
    bank, gallery, queries = vectors(seed=1)
    options = {"k": 5} if method in ("csls", "nnn", "qbnorm") else {}
    rescorer = build_rescorer(method, **options)
    scores = queries @ gallery.T
    searched = []
    faiss_topk = rescore_bank.faiss_topk  # patched where the methods look it up: rescore's own name
    monkeypatch.setattr(rescore, "faiss_topk", lambda b, k: searched.append(k) or faiss_topk(b, k))
    by_vectors = rescorer.fit(VectorBank(bank, gallery), len(gallery), block=64)
    assert searched == ([5] if method in ("csls", "nnn") else [])  # the k-NN through FAISS, nothing else
    by_matrix = rescorer.fit(bank @ gallery.T, len(gallery))
    assert by_vectors.bank_size == by_matrix.bank_size == len(bank)
    torch.testing.assert_close(by_vectors.bias, by_matrix.bias, rtol=0, atol=TOL)
    if method == "qbnorm":
        assert torch.equal(by_vectors.active, by_matrix.active)
    torch.testing.assert_close(rescorer(scores, VectorBank(bank, gallery)),
                               rescorer(scores, bank @ gallery.T), rtol=0, atol=2 * TOL)


@pytest.mark.parametrize("method", ["csls", "nnn"])
def test_float64_vectors_stay_on_the_torch_path(method, monkeypatch):
    bank, gallery, _ = (v.double() for v in vectors(seed=2))
    monkeypatch.setattr(rescore, "faiss_topk", lambda *a: pytest.fail("float64 went through FAISS"))
    fit = build_rescorer(method, k=4).fit(VectorBank(bank, gallery), block=50)
    assert fit.bias.dtype == torch.float64
    torch.testing.assert_close(fit.bias, build_rescorer(method, k=4).fit(bank @ gallery.T).bias,
                               rtol=1e-12, atol=1e-12)


def test_tied_reference_queries_give_the_same_mean():
    bank, gallery, _ = vectors(seed=3, bank=30)
    tied = torch.cat([bank, bank, bank[:5]])  # every score at least twice: ties at the k-th
    for k in (2, 3, 61):
        fit = build_rescorer("nnn", k=k, alpha=1.0).fit(VectorBank(tied, gallery))
        torch.testing.assert_close(fit.bias, (tied @ gallery.T).double().T.topk(k, dim=1).values.mean(dim=1),
                                   rtol=0, atol=TOL)


BAD = [(lambda b, g: VectorBank(b, g[:, :10]), "the bank's vectors must be reference queries × d"),
       (lambda b, g: VectorBank(b, g[:50]), "the bank must be reference queries × 90 gallery items, got 50"),
       (lambda b, g: VectorBank(b.index_fill(0, torch.tensor([7]), float("nan")), g),
        "the bank contains NaN")]
TOO_FEW = (lambda b, g: VectorBank(b[:3], g), "k=5 is larger than the bank (3 reference queries)")


@pytest.mark.parametrize("method, bad, words", [("nnn", *TOO_FEW), ("csls", *TOO_FEW),
                                                *[(m, *case) for m in ("csls", "qbnorm") for case in BAD]])
def test_bad_vector_banks_are_one_line(method, bad, words):
    """FAISS's path (csls, nnn) and the blocks' (qbnorm) refuse what a score matrix's would."""
    bank, gallery, _ = vectors()
    with pytest.raises(VseError, match=f"^--rescore {method}: .*{re.escape(words)}") as refused:
        build_rescorer(method, k=5).fit(bad(bank, gallery), 90)
    assert "\n" not in str(refused.value)


def test_reference_bank_chooses_vectors_only_for_an_inner_product():
    bank, gallery, _ = vectors()
    chosen = reference_bank(bank, gallery, "cosine", "i2t")
    assert isinstance(chosen, VectorBank) and chosen.shape == (200, 90)
    order = reference_bank(bank, gallery, "order", "i2t")
    assert isinstance(order, torch.Tensor)
    torch.testing.assert_close(order, image_caption_scores(bank, gallery, "order"), rtol=0, atol=0)
    torch.testing.assert_close(reference_bank(bank, gallery, "order", "t2i"),
                               image_caption_scores(gallery, bank, "order").T, rtol=0, atol=0)
    with pytest.raises(VseError, match="direction must be i2t or t2i"):
        reference_bank(bank, gallery, "cosine", "x")
