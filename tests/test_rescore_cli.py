"""`vse evaluate --rescore` (issue 61) on the tiny fixtures: each re-scored row equals the method applied
to the split's scores with a bank of the training split's, ranked by brute force; what it saw is
recorded; transductive corrections only by name; one-line refusals naming the option; hubness; the
re-scored rows of --runs, report and claims. The methods themselves: tests/test_rescore.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import vse
from test_networks import sets, sgr_run  # noqa: F401 (fixtures: a pairwise network's run)

from pipeline.data.cache import FeatureCache
from pipeline.evaluation.evaluate import embed_checkpoint
from pipeline.evaluation.rescore import RESCORERS, hubness

OPTIONS = {"qbnorm": {"k": 2}, "nnn": {"k": 5}, "csls": {"k": 3}, "isf": {}}


def _brute_recalls(i2t: np.ndarray, t2i: np.ndarray, caption_image: np.ndarray) -> dict:
    """R@1/5/10 of both directions from the corrected matrices, one query at a time (ties against)."""
    out = {}
    ranks = []
    for i, row in enumerate(i2t):
        best = row[caption_image == i].max()
        ranks.append(int(np.sum(row[caption_image != i] >= best)))
    out["i2t"] = np.array(ranks)
    out["t2i"] = np.array([int(np.sum(np.delete(row, caption_image[j]) >= row[caption_image[j]]))
                           for j, row in enumerate(t2i)])
    return {f"{d}_r{k}": 100.0 * np.mean(out[d] < k) for d in ("i2t", "t2i") for k in (1, 5, 10)}


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def _split_and_banks(checkpoint, cache, bank_size=None):
    test = embed_checkpoint(checkpoint, cache, "test", torch.device("cpu"))
    train = embed_checkpoint(checkpoint, cache, "train", torch.device("cpu"), max_images=bank_size)
    images, captions = torch.from_numpy(test.images), torch.from_numpy(test.captions)
    scores = (images @ captions.T).double()
    banks = {"i2t": torch.from_numpy(train.images).double() @ captions.T.double(),
             "t2i": torch.from_numpy(train.captions).double() @ images.T.double()}
    return test, scores, banks


def test_each_rescored_row_is_its_method_on_the_split_scores_with_a_training_bank(sh_run, tiny_cache):
    args = ["evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json"]
    for name, options in OPTIONS.items():
        args += ["--rescore", name, *(f"--rescore-option={name}.{k}={v}" for k, v in options.items())]
    out = _json(vse(*args))
    test, scores, banks = _split_and_banks(sh_run / "best.pt", tiny_cache)
    assert [entry["row"] for entry in out["rescore"]] == [f"+ {name}" for name in OPTIONS]
    for entry in out["rescore"]:
        method = RESCORERS[entry["method"]](**OPTIONS[entry["method"]])
        i2t, t2i = method(scores, banks["i2t"]).numpy(), method(scores.T, banks["t2i"]).numpy()
        expected = _brute_recalls(i2t, t2i, test.caption_image)
        assert {k: entry["metrics"][k] for k in expected} == pytest.approx(expected, abs=1e-9)
        assert entry["metrics"]["i2t_hubness"] == pytest.approx(hubness(i2t), abs=1e-6)
        assert "t2i_hubness" not in entry["metrics"]  # 8 test images: N_10 is undefined
        assert entry["bank"] == {"split": "train", "images": 24} and entry["transductive"] is False
        assert entry["options"] == {**vars(RESCORERS[entry["method"]]().options), **OPTIONS[entry["method"]]}
        assert 0 < entry["against_raw"]["p"] <= 1
    assert out["rsum"] == pytest.approx(sum(_brute_recalls(scores.numpy(), scores.T.numpy(),
                                                           test.caption_image).values()), abs=1e-9)


def test_the_bank_size_is_the_first_images_of_the_bank_split_and_recorded(sh_run, tiny_cache):
    out = _json(vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json",
                    "--rescore", "nnn", "--rescore-option", "k=3", "--rescore-bank-size", 6))
    entry = out["rescore"][0]
    assert entry["bank"] == {"split": "train", "images": 6} and entry["options"]["k"] == 3
    test, scores, banks = _split_and_banks(sh_run / "best.pt", tiny_cache, bank_size=6)
    method = RESCORERS["nnn"](k=3)
    expected = _brute_recalls(method(scores, banks["i2t"]).numpy(), method(scores.T, banks["t2i"]).numpy(),
                              test.caption_image)
    assert {k: entry["metrics"][k] for k in expected} == pytest.approx(expected, abs=1e-9)


def test_hubness_is_the_skewness_of_n10_of_the_raw_scores(sh_run, tiny_cache):
    from scipy.stats import skew

    out = _json(vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json"))
    _, scores, _ = _split_and_banks(sh_run / "best.pt", tiny_cache)
    counts = np.zeros(scores.shape[1])
    for row in scores.numpy():
        counts[np.argsort(-row, kind="stable")[:10]] += 1
    assert out["i2t_hubness"] == pytest.approx(skew(counts), abs=1e-9)
    assert "t2i_hubness" not in out  # 8 test images: no N_10


def test_a_transductive_correction_runs_only_by_name_and_says_so(sh_run, tiny_cache):
    base = ["evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json"]
    refused = vse(*base, "--rescore", "dsl")
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "--rescore dsl is transductive" in refused.output and "--transductive" in refused.output
    out = _json(vse(*base, "--rescore", "dsl", "--rescore", "qbnorm", "--rescore-bank-split", "test",
                    "--transductive"))
    dsl, qbnorm = out["rescore"]
    assert [dsl["row"], qbnorm["row"]] == ["+ dsl (transductive)", "+ qbnorm (transductive)"]
    assert dsl["transductive"] is True and dsl["bank"] is None
    assert qbnorm["transductive"] is True and qbnorm["bank"] == {"split": "test", "images": 8}
    test, scores, _ = _split_and_banks(sh_run / "best.pt", tiny_cache)
    method = RESCORERS["dsl"]()
    expected = _brute_recalls(method(scores).numpy(), method(scores.T).numpy(), test.caption_image)
    assert {k: dsl["metrics"][k] for k in expected} == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("args, says", [
    (("--rescore", "hubs"), "--rescore: unknown method 'hubs'"),
    (("--rescore", "qbnorm", "--rescore-bank-split", "test"),
     "--rescore-bank-split test is the evaluated split"),
    (("--rescore", "nnn", "--rescore-bank-size", 25), "--rescore-bank-size 25 is larger than the train split "
                                                      "(24 images)"),
    (("--rescore", "nnn", "--rescore-bank-size", 3, "--rescore-option", "nnn.k=5"),
     "--rescore-option nnn.k=5 is larger than the bank (3 train images)"),
    (("--rescore", "csls"), "--rescore csls: k=10 is larger than the gallery (8 items)"),
    (("--rescore", "qbnorm", "--rescore-option", "qbnorm.gamma=1"), "--rescore qbnorm"),
    (("--rescore", "qbnorm", "--rescore-option", "nnn.k=5"),
     "--rescore-option nnn.k: 'nnn' is not a --rescore"),
    (("--rescore", "qbnorm", "--rescore", "nnn", "--rescore-option", "k=5"), "name the method, as METHOD.k"),
    (("--rescore", "qbnorm", "--rescore", "qbnorm"), "--rescore: qbnorm given twice"),
])
def test_bad_rescoring_is_one_line_naming_the_option(sh_run, tiny_cache, args, says):
    result = vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, *args)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and says in result.output


def test_rescore_options_without_rescore_are_a_usage_error(sh_run, tiny_cache):
    result = vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--transductive")
    assert result.exit_code == 2 and "go with --rescore NAME" in result.output


def test_averaged_checkpoints_rescore_their_mean_scores_and_mean_banks(sh_run, tiny_cache):
    base = ["evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json",
            "--rescore", "isf", "--rescore", "nnn", "--rescore-option", "nnn.k=4"]
    alone, averaged = _json(vse(*base)), _json(vse(*base, "--average-with", sh_run / "best.pt"))
    for a, b in zip(alone["rescore"], averaged["rescore"]):  # the mean of a model with itself is itself
        assert a["metrics"] == pytest.approx(b["metrics"], abs=1e-9)


def test_a_pairwise_network_scores_its_bank_pairs(sgr_run, sets):  # noqa: F811 (fixtures)
    from pipeline.evaluation.command import pair_scores
    from pipeline.evaluation.inference import load_model, score_split

    cpu = torch.device("cpu")
    loaded = load_model(sgr_run / "best.pt", cpu)
    with FeatureCache(sets) as cache:
        captions = loaded.captions(cache)
        test = score_split(loaded.model, cache, captions, "test", cpu)
        same = pair_scores(loaded.model, cache, captions, test.image_rows, test.caption_rows, cpu)
        assert torch.equal(same, torch.from_numpy(test.captions.T.copy()))
        train_rows, train_captions, _ = cache.split_rows("train")
        bank = pair_scores(loaded.model, cache, captions, train_rows, test.caption_rows, cpu)
        whole = pair_scores(loaded.model, cache, captions, np.r_[train_rows, test.image_rows],
                            test.caption_rows, cpu)
        assert torch.allclose(bank, whole[:len(train_rows)], atol=1e-6)  # a row's scores: its own pairs
        bank_t2i = pair_scores(loaded.model, cache, captions, test.image_rows, train_captions, cpu).T
    out = _json(vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--json",
                    "--rescore", "nnn", "--rescore-option", "k=4"))
    assert out["rescore"][0]["bank"] == {"split": "train", "images": 24}
    method, raw = RESCORERS["nnn"](k=4), test.captions.T.astype(np.float64)
    expected = _brute_recalls(method(raw, bank.double().numpy()), method(raw.T, bank_t2i.double().numpy()),
                              test.caption_image)
    assert {k: out["rescore"][0]["metrics"][k] for k in expected} == pytest.approx(expected, abs=1e-9)


def test_runs_get_a_rescored_row_each_grouped_apart_by_report(sh_and_mh_runs, sh_run, tiny_cache, tmp_path):
    from pipeline.reports.report import config_key, read_results, seed_groups

    out = tmp_path / "results.csv"
    result = vse("evaluate", "--runs", f"{sh_and_mh_runs}/*", "--out", out, "--rescore", "qbnorm")
    assert result.exit_code == 0, result.output
    rows = read_results(out)
    assert [row["run"] for row in rows] == ["mh", "mh + qbnorm", "sh", "sh + qbnorm"]
    assert [row.get("rescore") for row in rows][::2] == [None, None]
    assert rows[1]["rescore"] == "qbnorm beta=20 k=1, bank train:24"
    assert rows[1]["config_id"] == rows[0]["config_id"] and config_key(rows[1]) != config_key(rows[0])
    assert [g.label for g in seed_groups(rows)] == ["mh", "mh + qbnorm", "sh", "sh + qbnorm"]
    alone = _json(vse("evaluate", "--checkpoint", sh_and_mh_runs / "sh" / "best.pt", "--features", tiny_cache,
                      "--json", "--rescore", "qbnorm"))
    rescored = alone["rescore"][0]["metrics"]
    assert {k: rows[3][k] for k in rescored} == pytest.approx(rescored, abs=1e-9)
    assert rows[2]["i2t_hubness"] == pytest.approx(alone["i2t_hubness"], abs=1e-9)


def test_a_claims_file_tests_that_the_correction_helps(tmp_path):
    from pipeline.reports.claims import load_claims, run_claims
    from pipeline.reports.report import write_results

    rows = []
    for seed, (raw, corrected) in enumerate([(300.0, 310.0), (302.0, 313.0), (299.0, 311.0)], 1):
        common = {"loss": "mh", "seed": seed, "config_id": "abc", "precision": "fp32/fp32/fp32",
                  "ensemble": 1}  # a re-scored row is one network: vse writes the column
        rows += [{"run": f"loss=mh,seed={seed}", **common, "rsum": raw},
                 {"run": f"loss=mh,seed={seed} + qbnorm", **common, "rsum": corrected,
                  "rescore": "qbnorm beta=20 k=1, bank train:24"}]
    write_results(rows, tmp_path / "results.csv")
    (tmp_path / "claims.yaml").write_text(
        "results: results.csv\nclaims:\n  - claim: QB-Norm helps mh\n    paper: QB-Norm\n"
        "    better: loss=mh + qbnorm\n    worse: loss=mh\n    metric: rsum\n")
    verdicts = run_claims(load_claims(tmp_path / "claims.yaml"))["claims"]
    assert [v["verdict"] for v in verdicts] == ["holds"]


# ---------------------------------------------------------------------------- vse index --rescore

SEARCHED = {"isf": {}, "csls": {"k": 5}, "qbnorm": {}, "nnn": {"k": 10}}


@pytest.fixture()
def hub_file(tmp_path):
    """An embeddings file of 300 clustered image vectors and 200 caption vectors (the bank), made for a
    stand-in checkpoint, and 40 other query vectors."""
    from search_fakes import clustered_unit_vectors, write_embeddings

    from pipeline.core.fsutil import file_sha256

    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"a stand-in checkpoint")
    gallery, bank = clustered_unit_vectors(300, 16, seed=0), clustered_unit_vectors(200, 16, seed=1)
    path = write_embeddings(tmp_path / "emb.h5", checkpoint_sha256=file_sha256(checkpoint),
                            checkpoint=checkpoint,
                            images=(gallery, _names("i", 300), _names("", 300, ".jpg")),
                            captions=(bank, _names("c", 200), _names("caption ", 200)))
    return path, gallery, bank, clustered_unit_vectors(40, 16, seed=2)


def _names(prefix: str, n: int, suffix: str = "") -> list[str]:
    return [f"{prefix}{i}{suffix}" for i in range(n)]


def _corrected(name, gallery, bank, queries):
    """The corrected exhaustive scores (float64) of ``queries`` over ``gallery``, and the raw ones."""
    method, items = RESCORERS[name](**SEARCHED[name]), torch.from_numpy(gallery).double().T
    raw = torch.from_numpy(queries).double() @ items
    return method(raw, torch.from_numpy(bank).double() @ items).numpy(), raw.numpy()


@pytest.mark.parametrize("name", sorted(SEARCHED))
def test_a_corrected_index_ranks_as_the_corrected_exhaustive_search(hub_file, tmp_path, name):
    from pipeline.search.index_reader import SearchIndex

    path, gallery, bank, queries = hub_file
    options = [f"--rescore-option={k}={v}" for k, v in SEARCHED[name].items()]
    result = vse("index", path, "--out", tmp_path / "idx", "--kind", "flat", "--rescore", name, *options)
    assert result.exit_code == 0, result.output
    index = SearchIndex(tmp_path / "idx")
    assert index.meta["rescore"]["bank"]["count"] == 200 and index.meta["rescore"]["method"] == name
    scores, rows = index.search(queries, 300)
    expected, raw = _corrected(name, gallery, bank, queries)
    order = np.argsort(-expected, axis=1, kind="stable")
    assert np.array_equal(rows, order)  # the whole ranking of every query, exactly
    np.testing.assert_allclose(scores, np.take_along_axis(expected, order, axis=1), rtol=1e-5, atol=1e-4)
    assert not np.array_equal(order, np.argsort(-raw, axis=1, kind="stable"))  # the correction moves items
    if name == "qbnorm":  # both branches: some queries' raw top-1 in the activation set, some not
        active = np.load(tmp_path / "idx" / "rescore.npz")["active"]
        hits = active[np.argmax(raw, axis=1)]
        assert hits.any() and not hits.all()


def test_vse_search_answers_with_the_corrected_ranking(hub_file, tmp_path, monkeypatch):
    from search_fakes import StandInEmbedder

    from pipeline.search import searcher as search_module

    path, gallery, bank, _ = hub_file
    embedder = StandInEmbedder.for_checkpoint(tmp_path / "model.pt", dim=16)
    monkeypatch.setattr(search_module, "load_embedder", lambda *a, **k: embedder)
    assert vse("index", path, "--out", tmp_path / "idx", "--kind", "flat", "--rescore", "nnn",
               "--rescore-option", "k=10").exit_code == 0
    answer = _json(vse("search", tmp_path / "idx", "--text", "a dog on the grass", "-k", 5, "--json"))
    expected, _ = _corrected("nnn", gallery, bank, embedder.embed_texts(["a dog on the grass"]))
    assert [hit["id"] for hit in answer["results"]] == [f"i{n}" for n in np.argsort(-expected[0])[:5]]
    assert answer["results"][0]["score"] == pytest.approx(float(expected[0].max()), abs=1e-5)


def test_a_corrected_hnsw_index_measures_its_recall_against_the_corrected_search(hub_file, tmp_path):
    from pipeline.search.index_reader import SearchIndex

    path, gallery, bank, queries = hub_file
    result = vse("index", path, "--out", tmp_path / "idx", "--kind", "hnsw", "--rescore", "isf",
                 "--recall-target", 0.99)
    assert result.exit_code == 0, result.output
    index = SearchIndex(tmp_path / "idx")
    expected, _ = _corrected("isf", gallery, bank, queries)
    found = index.search(queries, 10)[1]
    exact = np.argsort(-expected, axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(found, exact)])
    assert index.meta["recall"]["value"] >= 0.99 and recall >= 0.95


@pytest.mark.parametrize("args, says", [
    (("--rescore", "dsl"), "--rescore dsl is transductive"),
    (("--rescore", "hubs"), "--rescore: unknown method 'hubs'"),
    (("--rescore", "nnn", "--kind", "ivfpq"), "--rescore nnn goes with --kind flat or hnsw"),
    (("--rescore", "nnn"), "--rescore nnn: k=256 is larger than the bank (200 reference queries)"),
    (("--rescore-option", "k=3"), "--rescore-option and --rescore-bank go with --rescore NAME"),
])
def test_bad_index_rescoring_is_one_line(hub_file, tmp_path, args, says):
    result = vse("index", hub_file[0], "--out", tmp_path / "idx", "--image-root", tmp_path, *args)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.strip().splitlines()[-1] == errors[0] and says in errors[0]
    assert not (tmp_path / "idx").exists()


def test_an_index_bank_needs_the_queries_modality_and_the_same_model(hub_file, tmp_path):
    from search_fakes import write_embeddings

    path, gallery, _, _ = hub_file
    alone = write_embeddings(tmp_path / "alone.h5", checkpoint_sha256="0" * 64,
                             images=(gallery, _names("i", 300), _names("", 300, ".jpg")))
    result = vse("index", alone, "--out", tmp_path / "idx", "--rescore", "isf")
    assert result.exit_code == 1 and "the bank is the queries' modality, captions" in result.output
    result = vse("index", path, "--out", tmp_path / "idx", "--rescore", "isf", "--rescore-bank", alone)
    assert result.exit_code == 1 and "--rescore-bank" in result.output


def test_a_qbnorm_index_that_ignored_its_activation_set_would_fail_the_comparison(hub_file, tmp_path):
    from pipeline.search.index_reader import SearchIndex

    path, gallery, bank, queries = hub_file
    result = vse("index", path, "--out", tmp_path / "idx", "--kind", "flat", "--rescore", "qbnorm")
    assert result.exit_code == 0, result.output
    index = SearchIndex(tmp_path / "idx")
    expected = np.argsort(-_corrected("qbnorm", gallery, bank, queries)[0], axis=1, kind="stable")
    assert np.array_equal(index.search(queries, 300)[1], expected)
    index.correction.active = None  # the slip: every query corrected
    assert not np.array_equal(index.search(queries, 300)[1], expected)


def test_a_transductive_row_says_so_in_its_name_and_its_rescore_column(sh_and_mh_runs, tmp_path):
    from pipeline.reports.report import read_results, seed_groups

    out = tmp_path / "results.csv"
    result = vse("evaluate", "--runs", f"{sh_and_mh_runs}/sh", "--out", out, "--rescore", "dsl",
                 "--transductive")
    assert result.exit_code == 0, result.output
    rows = read_results(out)
    assert [row["run"] for row in rows] == ["sh", "sh + dsl (transductive)"]
    assert rows[1]["rescore"] == "dsl temperature=1000 logit_scale=100, test queries, transductive"
    assert [g.label for g in seed_groups(rows)] == ["sh", "sh + dsl (transductive)"]
