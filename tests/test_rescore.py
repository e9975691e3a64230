"""Test-time re-scoring (pipeline/evaluation/rescore.py) against its authors' code, made by
scripts/golden_rescore.py:

- tests/golden/rescore_muse.npz: MUSE's inverted softmax (beta 30, 10) and CSLS (k 1, 3, 10);
- tests/golden/rescore_qbnorm.npz: qb-norm's ``qb_norm`` (beta, k) = (20, 1), (20, 3), (5, 2);
- tests/golden/rescore_dsl.npz: CAMoE's dual softmax (temperature, logit_scale) = (1000, 100),
  (1, 100), (0.05, 1);
- tests/golden/rescore_nnn.npz: nnn-retrieval 1.0.1 (k, alpha) = (256, 0.5), (8, 0.75), (1, 0.5).

Each method equals theirs in float64 to ``RTOL`` (only the order of operations differs; isf and
qbnorm are compared as the log of theirs, which they are by definition), and a deliberate slip in
each (k off by one, the softmax over the wrong axis, the activation set ignored, ...) makes the
comparison fail. Then the checks' refusals, the blocks, the per-item corrections and the hubness
measure against a brute-force count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from pipeline.core.errors import VseError
from pipeline.evaluation import rescore
from pipeline.evaluation.rescore import RESCORE_NAMES, RESCORERS, build_rescorer, hubness, k_occurrence

GOLDEN = Path(__file__).resolve().parent / "golden"
RTOL, ATOL = 1e-10, 1e-12  # float64 against float64: the order of operations only
COMMITS = {"muse": "3159355b93f5c3c4883808ba785ba9d18d7f5e81",
           "qbnorm": "76d4d90783c1085fe88c52d34acaa3d4d89eea8a",
           "dsl": "390e5ab47db13cba9e9b37934d42665f47e155cf",
           "nnn": "1.0.1"}  # the package's version


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"rescore_{name}.npz") as data:
        return {k: data[k] for k in data.files}


def golden_cases(method: str, dtype=np.float64):
    """(what, ours: a function of no argument, expected) for each golden case of ``method``, our
    method given the case's scores and bank in ``dtype`` (float64: as the authors' code had them)."""
    if method in ("isf", "csls"):
        data = golden("muse")
        scores = (data["queries"] @ data["gallery"].T).astype(dtype)
        source = np.concatenate([data["bank"], data["queries"]])  # MUSE's source words
        bank = (source @ data["gallery"].T).astype(dtype)
        if method == "isf":
            for beta in (30, 10):
                yield (f"beta {beta}", lambda b=beta: build_rescorer("isf", beta=b)(scores, bank),
                       np.log(data[f"invsm_beta_{beta}"]))
        else:
            for k in (1, 3, 10):
                yield f"k {k}", lambda k=k: build_rescorer("csls", k=k)(scores, bank), data[f"csls_knn_{k}"]
    elif method == "qbnorm":
        data = golden("qbnorm")
        for beta, k in ((20, 1), (20, 3), (5, 2)):
            theirs, normalised = data[f"beta{beta}_k{k}"], data[f"beta{beta}_k{k}:normalised"][:, None]
            expected = np.where(normalised, np.log(np.where(normalised, theirs, 1.0)), theirs)
            method = build_rescorer("qbnorm", beta=beta, k=k)
            yield (f"beta {beta}, k {k}",
                   lambda m=method: m(data["scores"].astype(dtype), data["bank"].astype(dtype)), expected)
    elif method == "dsl":
        data = golden("dsl")
        for temperature, scale in ((1000, 100), (1, 100), (0.05, 1)):
            method = build_rescorer("dsl", temperature=temperature, logit_scale=scale)
            yield (f"temperature {temperature}, logit_scale {scale}",
                   lambda m=method: m(data["scores"].astype(dtype)),
                   data[f"temp{temperature:g}_scale{scale:g}"])
    elif method == "nnn":
        data = golden("nnn")
        scores = (data["queries"] @ data["gallery"].T).astype(dtype)
        bank = (data["bank"] @ data["gallery"].T).astype(dtype)
        for k, alpha in ((256, 0.5), (8, 0.75), (1, 0.5)):
            method = build_rescorer("nnn", k=k, alpha=alpha)
            yield f"k {k}, alpha {alpha}", lambda m=method: m(scores, bank), data[f"k{k}_alpha{alpha:g}"]


def mismatches(method: str, dtype=np.float64) -> list[str]:
    """The golden cases of ``method`` that ours misses: in float64 to RTOL, in float32 to F32_RTOL of
    the scale (test_float32_equals_the_authors_code_to_1e_5_and_ranks_alike)."""
    missed = []
    for what, ours, expected in golden_cases(method, dtype):
        result, scale = ours(), float(np.abs(expected).max())
        rtol, atol = (RTOL, ATOL) if dtype == np.float64 else (F32_RTOL, F32_RTOL * scale)
        if not np.allclose(result, expected, rtol=rtol, atol=atol):
            missed.append(what)
    return missed


# ---------------------------------------------------------------------------- golden

@pytest.mark.parametrize("method", RESCORE_NAMES)
def test_equals_the_authors_code(method):
    cases = list(golden_cases(method))
    assert len(cases) == (2 if method == "isf" else 3)
    for what, ours, expected in cases:
        result = ours()
        assert result.dtype == np.float64 and result.shape == expected.shape
        np.testing.assert_allclose(result, expected, rtol=RTOL, atol=ATOL, err_msg=f"{method}, {what}")


# float32 scores compute in float32 (rescore.py's fast path), compared with the float64 goldens to
# 1e-5 of the matrix's largest |value| (a relative bound on each value is meaningless where a
# corrected score is near 0: csls and nnn subtract two close numbers). Why 1e-5: float32's unit
# roundoff is 6e-8, and rounding the inputs and a handful of operations per value leave some 1e-7 of
# the scale (measured: 1e-7 for isf, csls, qbnorm, nnn); dsl at temperature 1 multiplies by
# exp(100 S), which turns S's rounding into a relative 100 |S| * 6e-8 (measured 3.7e-6). A slip
# changes values by far more (a k off by one, a missing term: 1e-2 of the scale and up). Ranking:
# every query's whole gallery order equals the float64 golden order (stable sorts of both).
F32_RTOL = 1e-5


@pytest.mark.parametrize("method", RESCORE_NAMES)
def test_float32_equals_the_authors_code_to_1e_5_and_ranks_alike(method):
    for what, ours, expected in golden_cases(method, np.float32):
        result = ours()
        assert result.dtype == np.float32 and result.shape == expected.shape
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(result, expected, rtol=F32_RTOL, atol=F32_RTOL * scale,
                                   err_msg=f"{method}, {what}")
        np.testing.assert_array_equal(np.argsort(-result, axis=1, kind="stable"),
                                      np.argsort(-expected, axis=1, kind="stable"),
                                      err_msg=f"{method}, {what}")


@pytest.mark.parametrize("bundle", sorted(COMMITS))
def test_golden_provenance(bundle):
    """Each bundle comes from the source docs/PROTOCOL.md names (the module's docstring points there),
    with the files' hashes."""
    data = golden(bundle)
    assert str(data["commit"]) == COMMITS[bundle]
    protocol = (Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md").read_text()
    assert COMMITS[bundle] in protocol.partition("## Re-scoring at test time")[2]
    assert "Re-scoring at test time" in rescore.__doc__
    hashes = [k for k in data if k.startswith("sha256:")]
    assert hashes and all(len(str(data[k])) == 64 for k in hashes)


def _wrong_axis_dsl(self, scores, out, block):
    """The prior softmax over the gallery (each query's row), not over the test queries."""
    logits = self.logit_scale * torch.as_tensor(scores)
    return (logits * torch.softmax(logits / self.temperature, dim=1) * len(scores)).numpy()


TOPK_MEAN, TOP_MASK = rescore._column_topk_mean, rescore._top_mask


def _isf_without_beta(self, bank, gallery=None, **_):
    lse = rescore._column_logsumexp(self._bank_blocks(bank, gallery, 64), 1.0)[0]
    return rescore.ItemCorrection(self.beta, lse)


def _nnn_without_alpha(self, bank, gallery=None, **_):
    return rescore.ItemCorrection(1.0, TOPK_MEAN(self._bank_blocks(bank, gallery, 64, self.k), self.k)[0])


SLIPS = {  # name: (method, owner, attribute, the slipped replacement)
    "isf: the bank's softmax without beta": ("isf", rescore.InvertedSoftmax, "fit", _isf_without_beta),
    "csls: k + 1 reference neighbours": ("csls", rescore, "_column_topk_mean",
                                         lambda blocks, k: TOPK_MEAN(blocks, k + 1)),
    "csls: no query-side term": ("csls", rescore.CSLS, "_corrected",
                                 lambda self, rows, c, into: 2 * rows - c.bias),
    "qbnorm: every query normalised": ("qbnorm", rescore.QBNorm, "_corrected", rescore.Rescorer._corrected),
    "qbnorm: activation set of k + 1": ("qbnorm", rescore, "_top_mask",
                                        lambda rows, k: TOP_MASK(rows, k + 1)),
    "dsl: softmax over the gallery": ("dsl", rescore.DualSoftmax, "_transductive", _wrong_axis_dsl),
    "nnn: k + 1 reference neighbours": ("nnn", rescore, "_column_topk_mean",
                                        lambda blocks, k: TOPK_MEAN(blocks, k + 1)),
    "nnn: alpha ignored": ("nnn", rescore.NNN, "fit", _nnn_without_alpha),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_a_slip_fails_the_golden_comparison(slip, monkeypatch):
    """The golden comparison can fail: with each deliberate slip, some case of its method differs, in
    float64 and in float32 at its looser tolerance."""
    method, owner, attribute, replacement = SLIPS[slip]
    assert not mismatches(method) and not mismatches(method, np.float32)
    monkeypatch.setattr(owner, attribute, replacement)
    assert mismatches(method), f"{slip}: the golden values did not notice"
    assert mismatches(method, np.float32), f"{slip}: the float32 comparison did not notice"


# ---------------------------------------------------------------------------- options and refusals

def test_options_are_declared_with_the_authors_defaults():
    defaults = {name: {k: v for k, v in vars(cls().options).items()} for name, cls in RESCORERS.items()}
    assert defaults == {"isf": {"beta": 30.0}, "csls": {"k": 10}, "qbnorm": {"beta": 20.0, "k": 1},
                        "dsl": {"temperature": 1000.0, "logit_scale": 100.0}, "nnn": {"k": 256, "alpha": 0.5}}
    assert [name for name, cls in RESCORERS.items() if cls.transductive] == ["dsl"]
    assert build_rescorer("csls", k=3).k == 3
    assert build_rescorer("dsl", temperature=5).record() == {
        "method": "dsl", "options": {"temperature": 5.0, "logit_scale": 100.0}, "transductive": True}


def _data(queries=12, gallery=9, bank=20, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(queries, gallery)), rng.normal(size=(bank, gallery))


BANK20 = "is larger than the bank (20 reference queries)"
MATRIX = "scores must be a non-empty queries × gallery matrix, got shape"


@pytest.mark.parametrize(("call", "words"), [
    (lambda s, b: build_rescorer("zca"),
     "--rescore: unknown method 'zca' (known: isf, csls, qbnorm, dsl, nnn)"),
    (lambda s, b: build_rescorer("nnn", kk=3), "--rescore nnn has no option kk (its options: k, alpha)"),
    (lambda s, b: build_rescorer("isf", beta=0), "--rescore isf: beta must be > 0, got 0"),
    (lambda s, b: build_rescorer("csls", k=2.5), "--rescore csls: k must be an integer >= 1, got 2.5"),
    (lambda s, b: build_rescorer("csls", k=21)(s, b), f"--rescore csls: k=21 {BANK20}"),
    (lambda s, b: build_rescorer("nnn")(s, b), f"--rescore nnn: k=256 {BANK20}"),
    (lambda s, b: build_rescorer("nnn", k=21)(s, iter([b[:7], b[7:]])), f"--rescore nnn: k=21 {BANK20}"),
    (lambda s, b: build_rescorer("csls", k=10)(s, b),
     "--rescore csls: k=10 is larger than the gallery (9 items)"),
    (lambda s, b: build_rescorer("qbnorm", k=10)(s, b),
     "--rescore qbnorm: k=10 is larger than the gallery (9 items)"),
    (lambda s, b: build_rescorer("isf")(s, b[:, :8]),
     "--rescore isf: the bank must be reference queries × 9 gallery items, got a block of shape (20, 8)"),
    (lambda s, b: build_rescorer("isf")(s[0], b), f"--rescore isf: {MATRIX} (9,)"),
    (lambda s, b: build_rescorer("dsl")(s[:0]), f"--rescore dsl: {MATRIX} (0, 9)"),
    (lambda s, b: build_rescorer("nnn", k=3)(np.where(s > 2, np.nan, s), b),
     "--rescore nnn: scores contain NaN or infinite values"),
    (lambda s, b: build_rescorer("nnn", k=3)(s, np.where(b > 2, np.inf, b)),
     "--rescore nnn: the bank contains NaN or infinite values"),
    (lambda s, b: build_rescorer("nnn", k=3)(s, b[:0]), "--rescore nnn: the bank is empty"),
    (lambda s, b: build_rescorer("csls")(s), "--rescore csls needs a reference bank"),
    (lambda s, b: build_rescorer("dsl")(s, b), "--rescore dsl is transductive"),
    (lambda s, b: hubness(s, 10), "hubness: k must be an integer in [1, 9] (the gallery), got 10"),
])
def test_bad_input_is_one_line_naming_the_option(call, words):
    scores, bank = _data()
    with pytest.raises(VseError) as caught:
        call(scores, bank)
    assert str(caught.value).startswith(words) and "\n" not in str(caught.value)


# ---------------------------------------------------------------------------- blocks, kinds, per-item parts

@pytest.mark.parametrize("method", RESCORE_NAMES)
def test_blocks_streams_and_in_place_give_the_same_matrix(method, monkeypatch):
    scores, bank = _data(queries=37, gallery=11, bank=45, seed=1)
    options = {"k": 3} if method in ("csls", "nnn", "qbnorm") else {}
    rescorer = build_rescorer(method, **options)
    bank = None if rescorer.transductive else bank
    whole = rescorer(scores, bank, block=10_000)
    streamed = None if bank is None else (bank[i:i + 4] for i in range(0, len(bank), 4))
    np.testing.assert_allclose(rescorer(scores, streamed, block=5), whole, rtol=1e-12, atol=1e-12)
    inplace = scores.copy()
    assert rescorer(inplace, bank, out=inplace, block=6) is inplace
    np.testing.assert_allclose(inplace, whole, rtol=1e-12, atol=1e-12)
    as_tensor = rescorer(torch.tensor(scores, dtype=torch.float32), bank)
    assert isinstance(as_tensor, torch.Tensor) and as_tensor.dtype == torch.float32
    np.testing.assert_allclose(as_tensor.numpy(), whole, rtol=1e-5, atol=1e-4)
    assert rescorer(scores.astype(np.float32), bank).dtype == np.float32
    monkeypatch.setattr(rescore, "TILE", 3)  # a transposed matrix (S.T) is copied tile by tile
    transposed = np.asfortranarray(scores)  # the layout of a row-major matrix's .T
    bank_t = None if bank is None else np.asfortranarray(bank)
    np.testing.assert_allclose(rescorer(transposed, bank_t, block=5), whole, rtol=1e-12, atol=1e-12)
    as_t = rescorer(torch.tensor(scores.T.copy()).T, None if bank is None else torch.tensor(bank.T.copy()).T,
                    block=5)
    np.testing.assert_allclose(as_t.numpy(), whole, rtol=1e-12, atol=1e-12)
    inplace = torch.tensor(scores.T.copy()).T
    assert rescorer(inplace, bank, out=inplace, block=6) is inplace
    np.testing.assert_allclose(inplace.numpy(), whole, rtol=1e-12, atol=1e-12)


def test_per_item_corrections_by_brute_force():
    """fit gives what a search index stores: S' = scale * S - bias[j] (qbnorm: on active queries)."""
    scores, bank = _data(queries=15, gallery=10, bank=30, seed=2)
    top = lambda k: np.sort(bank, axis=0)[::-1][:k].mean(axis=0)  # noqa: E731 - each item's k best
    nnn = build_rescorer("nnn", k=4, alpha=0.3).fit(bank)
    assert nnn.scale == 1.0 and nnn.bank_size == 30
    np.testing.assert_allclose(nnn.bias.numpy(), 0.3 * top(4), rtol=1e-12)
    np.testing.assert_allclose(build_rescorer("csls", k=5).fit(bank).bias.numpy(), top(5), rtol=1e-12)
    isf = build_rescorer("isf", beta=2.0).fit(bank)
    np.testing.assert_allclose(isf.bias.numpy(), np.log(np.exp(2.0 * bank).sum(axis=0)), rtol=1e-12)
    small = bank[:3]  # so that some queries' top-1 item is outside the activation set
    qb = build_rescorer("qbnorm", beta=2.0, k=2).fit(small)
    active = np.zeros(10, dtype=bool)
    active[np.argsort(-small, axis=1, kind="stable")[:, :2].ravel()] = True
    np.testing.assert_array_equal(qb.active.numpy(), active)
    np.testing.assert_allclose(qb.bias.numpy(), np.log(np.exp(2.0 * small).sum(axis=0)), rtol=1e-12)
    corrected = build_rescorer("qbnorm", beta=2.0, k=2).apply(scores, qb)
    hit = active[scores.argmax(axis=1)]
    assert 0 < hit.sum() < len(scores)
    np.testing.assert_allclose(corrected[hit], 2.0 * scores[hit] - qb.bias.numpy(), rtol=1e-12)
    np.testing.assert_array_equal(corrected[~hit], scores[~hit])
    with pytest.raises(VseError, match="--rescore dsl is transductive: it has no per-item correction"):
        build_rescorer("dsl").fit(bank)


# ---------------------------------------------------------------------------- hubness

def brute_force_k_occurrence(scores: np.ndarray, k: int) -> np.ndarray:
    counts = np.zeros(scores.shape[1], dtype=int)
    for row in scores:
        for j in sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]:
            counts[j] += 1
    return counts


@pytest.mark.parametrize("k", [1, 3, 10])
def test_hubness_is_the_skewness_of_the_k_occurrence(k):
    data = golden("nnn")  # four hub items
    scores = data["queries"] @ data["gallery"].T
    counts = brute_force_k_occurrence(scores, k)
    np.testing.assert_array_equal(k_occurrence(scores, k, block=7), counts)
    assert counts.sum() == k * len(scores)
    assert hubness(scores, k) == pytest.approx(float(scipy.stats.skew(counts, bias=True)), rel=1e-12)


def test_hubness_ties_and_no_hub():
    ties = np.zeros((6, 5))
    np.testing.assert_array_equal(k_occurrence(ties, 2), [6, 6, 0, 0, 0])  # ties to the lowest index
    assert hubness(np.eye(5), 1) == 0.0  # every item the nearest of one query: no hub
    assert hubness(ties, 2) == pytest.approx(float(scipy.stats.skew([6, 6, 0, 0, 0], bias=True)), rel=1e-12)
    assert rescore.HUBNESS_K == 10
