"""The bank's approximate k-NN index (``--rescore-index``, pipeline/evaluation/rescore_bank.py:
``BANK_INDEXES``, ``_bank_index``): hnsw and ivf for csls and nnn, refused for the methods that read
every bank score.

What is checked: every value an approximate index returns is a true bank score (it may miss a
neighbour, never invent one); an ivf index probing all its cells is the exact k-NN (same sets);
hnsw on a small bank finds nearly every exact set; the fit takes the bank's index; the choice is
recorded (bank ``index``, the row's label) only when approximate; one-line refusals naming the option.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import vse

from pipeline.core.errors import VseError
from pipeline.evaluation import rescore_bank
from pipeline.evaluation.rescore import build_rescorer, plan_rescore
from pipeline.evaluation.rescore_bank import VectorBank, reference_bank

TOL = 1e-5  # float32 inner products of unit vectors, summed in another order


def unit(rng, n, d=24):
    x = rng.standard_normal((n, d))
    return torch.from_numpy((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32))


def banks(seed=0, bank=200, gallery=90):
    rng = np.random.default_rng(seed)
    return unit(rng, bank), unit(rng, gallery)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_an_approximate_index_returns_true_scores_of_the_rows_it_found(kind):
    bank, gallery = banks()
    values, rows = rescore_bank.faiss_topk(VectorBank(bank, gallery, kind), 7)
    true = (bank @ gallery.T).T  # (G, Nb)
    assert rows.shape == (90, 7) and bool((rows >= 0).all())
    torch.testing.assert_close(values, torch.gather(true, 1, rows), rtol=0, atol=TOL)
    for item in range(90):  # k distinct reference queries
        assert len(set(rows[item].tolist())) == 7


def test_ivf_probing_every_cell_is_the_exact_knn():
    bank, gallery = banks(seed=1)
    assert rescore_bank.ivf_lists(len(bank)) <= rescore_bank.IVF_NPROBE  # 200 -> 14 cells, all probed
    _, exact = rescore_bank.faiss_topk(VectorBank(bank, gallery), 10)
    _, found = rescore_bank.faiss_topk(VectorBank(bank, gallery, "ivf"), 10)
    assert all(set(a.tolist()) == set(b.tolist()) for a, b in zip(exact, found))


def test_hnsw_on_a_small_bank_finds_nearly_every_exact_set():
    bank, gallery = banks(seed=2)
    _, exact = rescore_bank.faiss_topk(VectorBank(bank, gallery), 10)
    _, found = rescore_bank.faiss_topk(VectorBank(bank, gallery, "hnsw"), 10)
    same = np.mean([set(a.tolist()) == set(b.tolist()) for a, b in zip(exact, found)])
    assert same >= 0.95  # efSearch 64 over 200 nodes: nearly exhaustive


def test_ivf_that_finds_fewer_than_k_is_one_line_naming_the_option():
    bank, gallery = banks(seed=3, bank=900)  # 30 cells, 16 probed: about half the bank reachable
    with pytest.raises(VseError, match=r"^--rescore-index ivf: \d+ gallery items found fewer than k=800"):
        rescore_bank.faiss_topk(VectorBank(bank, gallery, "ivf"), 800)


@pytest.mark.parametrize("name", ["csls", "nnn"])
@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_knn_fit_searches_the_banks_index(name, kind, monkeypatch):
    bank, gallery = banks(seed=4)
    built = []
    index = rescore_bank._bank_index
    monkeypatch.setattr(rescore_bank, "_bank_index", lambda q, k_, k: built.append(k_) or index(q, k_, k))
    method = build_rescorer(name, k=5)
    fit = method.fit(VectorBank(bank, gallery, kind), len(gallery))
    exact = method.fit(bank @ gallery.T, len(gallery))
    assert built == [kind]
    if kind != "hnsw":  # flat exact, ivf probing all 14 cells exact
        torch.testing.assert_close(fit.bias, exact.bias, rtol=0, atol=TOL)


def test_float64_vectors_with_an_approximate_index_are_searched_not_streamed(monkeypatch):
    bank, gallery = banks(seed=5)
    built = []
    index = rescore_bank._bank_index
    monkeypatch.setattr(rescore_bank, "_bank_index", lambda q, k_, k: built.append(k_) or index(q, k_, k))
    build_rescorer("nnn", k=5).fit(VectorBank(bank.double(), gallery.double(), "hnsw"), len(gallery))
    build_rescorer("nnn", k=5).fit(VectorBank(bank.double(), gallery.double()), len(gallery))
    assert built == ["hnsw"]  # float64 flat stays on the torch path (the golden tests' precision)


@pytest.mark.parametrize("name", ["isf", "qbnorm"])
def test_a_method_reading_every_bank_score_refuses_an_approximate_index(name):
    bank, gallery = banks()
    says = rf"^--rescore-index hnsw: --rescore {name} needs every bank score .* only csls, nnn take"
    with pytest.raises(VseError, match=says):
        plan_rescore([name], index="hnsw")
    with pytest.raises(VseError, match=says):
        build_rescorer(name).fit(VectorBank(bank, gallery, "hnsw"), len(gallery))
    assert plan_rescore([name]).index == "flat"


@pytest.mark.parametrize(("call", "says"), [
    (lambda: plan_rescore(["nnn"], index="lsh"),
     "--rescore-index: unknown index 'lsh' (known: flat, hnsw, ivf)"),
    (lambda: VectorBank(torch.ones(2, 3), torch.ones(2, 3), "pq"), "--rescore-index: unknown index 'pq'"),
    (lambda: plan_rescore(["dsl"], index="ivf", transductive=True),
     "--rescore-index ivf: no method here searches the bank (csls, nnn)"),
    (lambda: reference_bank(torch.ones(2, 3), torch.ones(2, 3), "order", "i2t", "hnsw"),
     "--rescore-index hnsw: the order similarity is not an inner product"),
])
def test_bad_indexes_are_one_line_naming_the_option(call, says):
    with pytest.raises(VseError) as error:
        call()
    assert says in str(error.value) and "\n" not in str(error.value)


def test_the_index_is_recorded_only_when_approximate():
    flat, hnsw = plan_rescore(["nnn"]), plan_rescore(["nnn"], index="hnsw")
    assert flat.record(flat.methods[0], 10)["bank"] == {"split": "train", "images": 10}
    assert hnsw.record(hnsw.methods[0], 10)["bank"] == {"split": "train", "images": 10, "index": "hnsw"}
    assert hnsw.label(hnsw.methods[0], 10).endswith("bank train:10 hnsw index")
    assert "index" not in flat.label(flat.methods[0], 10)


# ---------------------------------------------------------------------------- vse evaluate --rescore-index

def _json(result) -> dict:
    import json

    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_evaluate_records_the_index_and_ivf_on_a_tiny_bank_is_the_exact_row(sh_run, tiny_cache):
    base = ["evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json",
            "--rescore", "nnn", "--rescore-option", "k=3"]
    exact = _json(vse(*base))["rescore"][0]
    ivf = _json(vse(*base, "--rescore-index", "ivf"))["rescore"][0]
    assert exact["bank"] == {"split": "train", "images": 24}
    assert ivf["bank"] == {"split": "train", "images": 24, "index": "ivf"}
    # 24 images (5 cells) and 120 captions (11 cells), every cell probed: the exact k-NN
    assert ivf["metrics"] == pytest.approx(exact["metrics"], abs=1e-9)


@pytest.mark.parametrize(("args", "code", "says"), [
    (("--rescore", "isf", "--rescore-index", "hnsw"), 1, "--rescore-index hnsw: --rescore isf needs every"),
    (("--rescore", "nnn", "--rescore-index", "annoy"), 1, "--rescore-index: unknown index 'annoy'"),
    (("--rescore-index", "hnsw"), 2, "go with --rescore NAME"),
])
def test_evaluate_refuses_a_bad_index_in_one_line(sh_run, tiny_cache, args, code, says):
    result = vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, *args)
    assert result.exit_code == code, result.output
    assert says in result.output
    if code == 1:
        assert len(result.output.strip().splitlines()) == 1


def test_averaged_checkpoints_refuse_an_approximate_index(sh_run, tiny_cache):
    result = vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache,
                 "--average-with", sh_run / "best.pt", "--rescore", "nnn", "--rescore-option", "k=3",
                 "--rescore-index", "hnsw")
    assert result.exit_code == 1, result.output
    assert "--rescore-index hnsw: averaged checkpoints' bank is the mean" in result.output
