"""Human-judgment metrics of re-scored rows (issue 61): a `RUN + METHOD` row's human_* columns are
those of its corrected score matrices, each direction's from its own, by the one function the plain
row's come from (``judgments.metrics.human_metrics_of_scores``); in `vse evaluate --checkpoint
--rescore --json`, its table and `vse evaluate --runs --rescore`'s results.csv. The corrected
matrices here are built with rescore.py's own functions; mAP@R is also counted by brute force."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.core.runtime import resolve_device
from pipeline.data.cache import FeatureCache
from pipeline.evaluation.command import checkpoint_banks
from pipeline.evaluation.evaluate import embed_checkpoint
from pipeline.evaluation.judgments import match_split, read_judgments, token_file_near
from pipeline.evaluation.judgments.metrics import human_metrics, human_metrics_of_scores
from pipeline.evaluation.rescore import plan_rescore, split_scores
from pipeline.reports.report import read_results
from tests.conftest import vse
from tests.test_judgments import brute_force, judged_run  # noqa: F401 (judged_run: a fixture)

TOLERANCE = 1e-5  # percentages (0-100) of float32 per-query values: float32's 6e-8 relative, times 100
METHODS = ("isf", "nnn")  # nnn.k=5: the tiny cache's training split has 24 images
OPTIONS = ["--rescore-option", "nnn.k=5"]


def _human(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k.startswith("human_")}


@pytest.fixture(scope="module")
def corrected(judged_run):  # noqa: F811 (the imported fixture)
    """The judged run's test split: its matched judgments, raw scores, and each method's corrected
    (i2t, t2i) matrices, fitted on the training split's bank with rescore.py's fit and apply."""
    checkpoint, cache, judgments = judged_run
    device = resolve_device("cpu")
    emb = embed_checkpoint(checkpoint, cache, "test", device)
    plan = plan_rescore(METHODS, {"nnn.k": 5})
    with FeatureCache(cache) as c:
        token_file = token_file_near(c.attrs["dataset_root"])
        matched = match_split(emb, c, read_judgments(judgments, "csv"), token_file)
        banks = checkpoint_banks(checkpoint, c, emb, plan, device)
    scores = split_scores(emb)
    methods = {}
    for method in plan.methods:
        i2t = method.apply(scores, method.fit(banks["i2t"], scores.shape[1]))
        t2i = method.apply(scores.T, method.fit(banks["t2i"], scores.shape[0]))
        methods[method.name] = (i2t, t2i)
    return emb, matched, scores, methods


def test_the_plain_row_is_human_metrics_of_its_score_matrix(corrected):
    """The embeddings' path and the score-matrix path are one function: equal on the raw scores."""
    emb, matched, scores, _ = corrected
    plain = human_metrics(emb.images, emb.captions, emb.caption_image, matched)
    assert human_metrics_of_scores(scores, scores.T, emb.caption_image, matched) == \
        pytest.approx(plain, abs=TOLERANCE, nan_ok=True)


def test_rescored_map_at_r_by_brute_force(corrected):
    """mAP@R of each corrected matrix, counted query by query (test_judgments' brute force), with
    the people's accepted pairs as matches as for the plain row."""
    emb, matched, _, methods = corrected
    accepted = set(zip(matched.image[matched.accepted].tolist(), matched.caption[matched.accepted].tolist()))
    for i2t, t2i in methods.values():
        got = human_metrics_of_scores(i2t, t2i, emb.caption_image, matched)
        for direction, queries, table in (("i2t", matched.image, i2t), ("t2i", matched.caption, t2i)):
            maps = []
            for q in np.unique(queries):
                if direction == "i2t":
                    gt = {c for c in range(len(emb.caption_image)) if emb.caption_image[c] == q} | \
                        {c for i, c in accepted if i == q}
                else:
                    gt = {int(emb.caption_image[q])} | {i for i, c in accepted if c == q}
                maps.append(brute_force(table[q].double().tolist(), gt)[2])
            assert got[f"human_{direction}_map@r"] == pytest.approx(100 * np.mean(maps), abs=TOLERANCE)


def test_rescored_rows_carry_the_human_metrics_of_the_corrected_scores(judged_run, corrected,  # noqa: F811
                                                                       tmp_path):
    checkpoint, cache, judgments = judged_run
    emb, matched, scores, methods = corrected
    expected = {name: human_metrics_of_scores(i2t, t2i, emb.caption_image, matched)
                for name, (i2t, t2i) in methods.items()}
    common = ["--judgments", judgments, "--judgments-format", "csv", "--device", "cpu", *OPTIONS,
              *[a for name in METHODS for a in ("--rescore", name)]]
    single = vse("evaluate", "--checkpoint", checkpoint, "--features", cache, "--json", *common)
    assert single.exit_code == 0, single.output
    got = json.loads(single.stdout)
    plain = _human(got)
    assert plain["human_pairs"] > 0
    for entry, name in zip(got["rescore"], METHODS):
        assert entry["method"] == name
        assert _human(entry["metrics"]) == pytest.approx(expected[name], abs=TOLERANCE, nan_ok=True)
    # isf moves the judged queries' rankings here, and with them the human metrics
    isf = _human(got["rescore"][0]["metrics"])
    i2t, t2i = methods["isf"]
    assert not torch.equal(i2t.argsort(dim=1), scores.argsort(dim=1))
    assert any(abs(isf[k] - plain[k]) > 1e-3 for k in plain if k.endswith(("map@r", "tau", "rprec")))
    table = vse("evaluate", "--checkpoint", checkpoint, "--features", cache, *common)
    assert table.exit_code == 0, table.output
    assert table.stdout.count("human judgments:") == 1 + len(METHODS)
    # --runs: each RUN + METHOD row's human_* columns, the same numbers
    out = tmp_path / "results.csv"
    batch = vse("evaluate", "--runs", checkpoint.parent, "--out", out, *common)
    assert batch.exit_code == 0, batch.output
    rows = {row["run"]: row for row in read_results(out)}
    assert _human(rows["mh"]) == pytest.approx(plain, abs=TOLERANCE, nan_ok=True)
    for name in METHODS:
        assert _human(rows[f"mh + {name}"]) == pytest.approx(expected[name], abs=TOLERANCE, nan_ok=True)
    # vse compare RUN --rescore isf --judgments: the seed-group comparison (one seed here) has the
    # human columns of both sides, A - B from the corrected and the raw scores
    compared = vse("compare", checkpoint.parent, "--rescore", "isf", "--judgments", judgments,
                   "--judgments-format", "csv", "--device", "cpu", "--json")
    assert compared.exit_code == 0, compared.output
    [comparison] = json.loads(compared.stdout)["comparisons"]
    assert (comparison["a"], comparison["b"]) == (f"{checkpoint.parent} + isf", str(checkpoint.parent))
    for direction in ("i2t", "t2i"):
        entry = comparison["metrics"][f"human_{direction}_map@r"]
        assert entry["diff"] == pytest.approx(expected["isf"][f"human_{direction}_map@r"]
                                              - plain[f"human_{direction}_map@r"], abs=2 * TOLERANCE)


def test_a_correction_that_keeps_every_ranking_keeps_the_human_metrics(corrected):
    """nnn with alpha = 0 (its bias times 0: the scores themselves) and a monotone transform of the
    whole matrix (2 S + 1) rank as the raw scores do: the same human metrics."""
    emb, matched, scores, _ = corrected
    plain = human_metrics_of_scores(scores, scores.T, emb.caption_image, matched)
    [nnn] = plan_rescore(["nnn"], {"k": 5, "alpha": 0.0}).methods
    bank = torch.randn(24, scores.shape[1])
    identity = (nnn.apply(scores, nnn.fit(bank, scores.shape[1])),
                nnn.apply(scores.T, nnn.fit(torch.randn(24, scores.shape[0]), scores.shape[0])))
    monotone = (2 * scores + 1, (2 * scores + 1).T)
    for i2t, t2i in (identity, monotone):
        assert human_metrics_of_scores(i2t, t2i, emb.caption_image, matched) == \
            pytest.approx(plain, abs=TOLERANCE, nan_ok=True)
