"""`vse compare` of a run or a seed group with its own re-scored scores (issue 61): one run is the
paired permutation test over the test queries (the very test `vse evaluate --rescore` prints against
the raw scores), a group the seed-group tests (Welch's, and the paired t-test by seed, equal to
scipy's); a transductive result is compared with an inductive one only by name
(--across-transduction); what goes with --rescore and what does not."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import ttest_ind, ttest_rel

from pipeline.reports.report import read_results
from tests.conftest import train_run, vse

TOLERANCE = 1e-12  # the same numbers through the same scipy: equal up to the last bits of float64


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _one_line_refusal(result, says: str) -> None:
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and says in result.output, result.output


@pytest.fixture(scope="module")
def mh_seeds(tiny_cache, tmp_path_factory):
    """A sweep's folder with loss=mh, seeds 0 and 1 (one epoch each on the tiny cache)."""
    root = tmp_path_factory.mktemp("rescore_groups") / "s"
    for seed in (0, 1):
        train_run(tiny_cache, root / f"loss=mh,seed={seed}", loss="mh", seed=seed, epochs=1)
    return root


def test_a_run_against_itself_rescored_is_the_paired_test_evaluate_prints(sh_run, tiny_cache):
    methods = ["--rescore", "qbnorm", "--rescore", "nnn", "--rescore-option", "nnn.k=5"]
    out = _json(vse("compare", sh_run, *methods, "--device", "cpu", "--json"))
    evaluated = _json(vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", tiny_cache, "--json",
                          *methods))
    assert [c["runs"] for c in out["comparisons"]] == [["run + qbnorm", "run"], ["run + nnn", "run"]]
    for compared, rescored in zip(out["comparisons"], evaluated["rescore"]):
        rsum = compared["metrics"]["rsum"]
        assert rsum["a"] == pytest.approx(rescored["metrics"]["rsum"], abs=1e-9)
        assert rsum["b"] == pytest.approx(evaluated["rsum"], abs=1e-9)
        assert rsum["diff"] == pytest.approx(rescored["against_raw"]["rsum_diff"], abs=1e-9)
        assert rsum["p"] == rescored["against_raw"]["p"]  # the same sign flips of the same ranks
        assert compared["rescore"][0]["method"] == rescored["method"] and compared["rescore"][1] is None
        assert compared["rescore"][0]["bank"] == {"split": "train", "images": 24}
    text = vse("compare", sh_run, "--rescore", "qbnorm", "--device", "cpu", "--permutations", 100).stdout
    assert "A = run + qbnorm, B = run" in text and "A re-scored: qbnorm beta=20 k=1, bank train:24" in text


def test_a_transductive_correction_is_compared_with_the_raw_scores_only_by_name(sh_run):
    base = ["compare", sh_run, "--rescore", "dsl", "--transductive", "--device", "cpu", "--permutations", 100]
    _one_line_refusal(vse(*base), "run + dsl (transductive) read the test queries (transductive), run did "
                                  "not")
    assert "--across-transduction" in vse(*base).output
    out = _json(vse(*base, "--across-transduction", "--json"))
    [compared] = out["comparisons"]
    assert compared["runs"] == ["run + dsl (transductive)", "run"] and compared["rescore"][0]["transductive"]


def test_a_group_against_itself_rescored_is_welch_and_paired_by_seed(mh_seeds, tmp_path):
    results = tmp_path / "results.csv"
    done = vse("evaluate", "--runs", f"{mh_seeds}/*", "--out", results, "--rescore", "qbnorm", "--device",
               "cpu")
    assert done.exit_code == 0, done.output
    rows = read_results(results)
    raw = {r["seed"]: r["rsum"] for r in rows if not r.get("rescore")}
    corrected = {r["seed"]: r["rsum"] for r in rows if r.get("rescore")}
    assert sorted(raw) == sorted(corrected) == [0, 1]
    out = _json(vse("compare", f"{mh_seeds}/loss=mh*", "--rescore", "qbnorm", "--device", "cpu", "--json"))
    [c] = out["comparisons"]
    assert (c["a"], c["b"]) == (f"{mh_seeds}/loss=mh* + qbnorm", f"{mh_seeds}/loss=mh*")
    assert out["groups"][c["a"]]["rescore"] == "qbnorm beta=20 k=1, bank train:24"
    assert out["groups"][c["b"]]["rescore"] is None and c["paired_seeds"] == [0, 1]
    rsum = c["metrics"]["rsum"]
    a, b = [corrected[s] for s in (0, 1)], [raw[s] for s in (0, 1)]
    assert math.isclose(rsum["diff"], sum(a) / 2 - sum(b) / 2, rel_tol=1e-9, abs_tol=1e-9)
    assert len({x - y for x, y in zip(a, b)}) > 1  # else scipy's p is undefined: the test would not test
    assert math.isclose(rsum["p_welch"], ttest_ind(a, b, equal_var=False).pvalue, rel_tol=TOLERANCE)
    assert math.isclose(rsum["p_paired"], ttest_rel(a, b).pvalue, rel_tol=TOLERANCE)


def test_runs_against_a_baseline_take_rescored_configurations_and_refuse_transductive_ones(mh_seeds):
    out = _json(vse("compare", "--runs", f"{mh_seeds}/*", "--baseline", "loss=mh", "--rescore", "qbnorm",
                    "--device", "cpu", "--json"))
    assert [(c["a"], c["b"]) for c in out["comparisons"]] == [("loss=mh + qbnorm", "loss=mh")]
    base = ["compare", "--runs", f"{mh_seeds}/*", "--baseline", "loss=mh", "--rescore", "dsl",
            "--transductive", "--device", "cpu"]
    _one_line_refusal(vse(*base), "loss=mh + dsl (transductive) read the test queries (transductive)")
    out = _json(vse(*base, "--across-transduction", "--json"))
    [c] = out["comparisons"]
    assert c["a"] == "loss=mh + dsl (transductive)" and out["groups"][c["a"]]["transductive"] is True


@pytest.mark.parametrize("args, says", [
    (("RUN", "RUN", "--rescore", "qbnorm"), "give one run or group A"),
    (("RUN", "--rescore", "qbnorm", "--member", 0), "--rescore goes without --member and --results"),
    (("RUN", "--transductive"), "go with --rescore NAME"),
])
def test_what_does_not_go_with_rescore_is_a_usage_error(sh_run, args, says):
    result = vse("compare", *[sh_run if a == "RUN" else a for a in args], "--device", "cpu")
    assert result.exit_code == 2 and says in result.output, result.output


def test_a_bad_method_is_one_line_naming_the_option(sh_run):
    _one_line_refusal(vse("compare", sh_run, "--rescore", "hubs", "--device", "cpu"),
                      "--rescore: unknown method 'hubs'")
