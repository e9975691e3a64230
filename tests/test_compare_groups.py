"""Seeds compared from the command line (issue 58): `vse compare` of two seed groups (Welch's p over
seeds, equal to scipy's; the paired t-test when the seeds pair up; a group of several configurations,
precisions or code identities refused), `--runs ... --baseline`, and `vse report --baseline`."""

from __future__ import annotations

import csv
import json
import math

import pytest
from scipy.stats import ttest_ind, ttest_rel

from pipeline.core.errors import VseError
from pipeline.reports.compare import _one_configuration
from pipeline.reports.report import format_p, read_results
from tests.conftest import train_run, vse

SEEDS = (0, 1, 2)
TOLERANCE = 1e-12  # the same numbers through the same scipy: equal up to the last bits of float64


@pytest.fixture(scope="module")
def sweep(tiny_cache, tmp_path_factory):
    """A sweep's folder: loss=sh and loss=mh, seeds 0-2, one epoch each on the tiny cache."""
    root = tmp_path_factory.mktemp("groups") / "s"
    for loss in ("sh", "mh"):
        for seed in SEEDS:
            train_run(tiny_cache, root / f"loss={loss},seed={seed}", loss=loss, seed=seed, epochs=1)
    return root


@pytest.fixture(scope="module")
def results(sweep, tmp_path_factory):
    """`vse evaluate --runs` of the sweep: each run's own numbers, to check the comparison against."""
    out = tmp_path_factory.mktemp("results") / "results.csv"
    done = vse("evaluate", "--runs", f"{sweep}/*", "--split", "test", "--device", "cpu", "--out", out)
    assert done.exit_code == 0, done.output
    return out


def per_seed(results, loss: str, key: str = "rsum") -> dict:
    return {row["seed"]: row[key] for row in read_results(results) if row["loss"] == loss}


def compare_json(*args):
    done = vse("compare", *args, "--device", "cpu", "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def test_two_seed_groups_give_welchs_p_equal_to_scipys(sweep, results):
    out = compare_json(f"{sweep}/loss=mh*", f"{sweep}/loss=sh*")
    [c] = out["comparisons"]
    mh, sh = per_seed(results, "mh"), per_seed(results, "sh")
    rsum = c["metrics"]["rsum"]
    expected = ttest_ind(list(mh.values()), list(sh.values()), equal_var=False).pvalue
    assert math.isclose(rsum["p_welch"], expected, rel_tol=TOLERANCE)
    assert rsum["a"]["n"] == rsum["b"]["n"] == 3
    assert math.isclose(rsum["diff"], sum(mh.values()) / 3 - sum(sh.values()) / 3, rel_tol=1e-9)
    assert set(c["metrics"]) >= {"i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum"}
    # the table prints the same p
    text = vse("compare", f"{sweep}/loss=mh*", f"{sweep}/loss=sh*", "--device", "cpu").stdout
    line = next(line for line in text.splitlines() if line.startswith("rsum "))
    assert format_p(expected) in line.split()


def test_the_same_seeds_give_the_paired_t_test_over_seeds(sweep, results):
    [c] = compare_json(f"{sweep}/loss=mh*", f"{sweep}/loss=sh*")["comparisons"]
    mh, sh = per_seed(results, "mh"), per_seed(results, "sh")
    assert c["paired_seeds"] == list(SEEDS)
    expected = ttest_rel([mh[s] for s in SEEDS], [sh[s] for s in SEEDS]).pvalue
    assert math.isclose(c["metrics"]["rsum"]["p_paired"], expected, rel_tol=TOLERANCE)
    # seeds 0, 1 against 1, 2 do not pair up: Welch's test alone
    [c] = compare_json(f"{sweep}/loss=mh,seed=[01]", f"{sweep}/loss=sh,seed=[12]")["comparisons"]
    assert c["paired_seeds"] is None and c["metrics"]["rsum"]["p_paired"] is None
    expected = ttest_ind([mh[0], mh[1]], [sh[1], sh[2]], equal_var=False).pvalue
    assert math.isclose(c["metrics"]["rsum"]["p_welch"], expected, rel_tol=TOLERANCE)


def test_kept_rows_of_a_results_table_give_the_same_numbers(sweep, results):
    fresh = compare_json(f"{sweep}/loss=mh*", f"{sweep}/loss=sh*")
    done = vse("compare", f"{sweep}/loss=mh*", f"{sweep}/loss=sh*", "--results", results, "--device", "cpu",
               "--json")
    assert done.exit_code == 0, done.output
    assert "kept: checkpoint and evaluation unchanged" in done.stderr
    assert json.loads(done.stdout) == fresh


def test_one_run_each_is_the_paired_test_over_queries(sweep):
    done = vse("compare", sweep / "loss=mh,seed=0", f"{sweep}/loss=sh,seed=0", "--permutations", 100,
               "--device", "cpu")
    assert done.exit_code == 0, done.output
    assert "paired permutation test over queries (100 sign flips, two-sided)" in done.output


def test_a_group_of_two_configurations_is_refused_naming_them(sweep):
    done = vse("compare", f"{sweep}/*", f"{sweep}/loss=sh*", "--device", "cpu")
    assert done.exit_code == 1
    assert "holds 2 configurations (loss=sh, loss=mh)" in done.output or \
        "holds 2 configurations (loss=mh, loss=sh)" in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_runs_against_a_baseline(sweep, results):
    out = compare_json("--runs", f"{sweep}/*", "--baseline", "sh")
    [c] = out["comparisons"]
    assert (c["a"], c["b"]) == ("loss=mh", "loss=sh")
    mh, sh = per_seed(results, "mh"), per_seed(results, "sh")
    expected = ttest_ind(list(mh.values()), list(sh.values()), equal_var=False).pvalue
    assert math.isclose(c["metrics"]["rsum"]["p_welch"], expected, rel_tol=TOLERANCE)
    refused = vse("compare", "--runs", f"{sweep}/*", "--baseline", "lseh", "--device", "cpu")
    assert refused.exit_code == 1 and "--baseline 'lseh' names no configuration" in refused.output


def rows_of(precisions, codes=None):
    codes = codes or [""] * len(precisions)
    return [{"run": f"x,seed={i}", "seed": i, "loss": "mh", "config_id": "c", "precision": p, "code_id": code,
             "rsum": 100.0 + i} for i, (p, code) in enumerate(zip(precisions, codes))]


def test_a_group_of_two_precisions_is_pooled_only_on_purpose():
    rows = rows_of(["fp32/fp32/fp32", "fp32/fp32/fp32", "bf16/fp32/fp32"])
    with pytest.raises(VseError, match="runs of different precision.*--across-precision pools them"):
        _one_configuration("A", ["x*"], rows, False, False)
    assert _one_configuration("A", ["x*"], rows, True, False).samples["rsum"] == [100.0, 101.0, 102.0]


def test_a_group_of_two_code_identities_is_pooled_only_on_purpose():
    rows = rows_of(["fp32/fp32/fp32"] * 3, codes=["aaa", "aaa", "bbb"])
    with pytest.raises(VseError, match=r"different code identity \(aaa: x,seed=0, x,seed=1; bbb: x,seed=2\)"):
        _one_configuration("A", ["x*"], rows, False, False)
    assert _one_configuration("A", ["x*"], rows, False, True).n == 3


# ---------------------------------------------------------------------------- vse report --baseline


@pytest.fixture
def seed_table(tmp_path):
    values = {"mh": [280.0, 284.5, 281.0], "topk": [283.0, 286.0, 289.5], "sh": [270.0, 275.0, 271.0]}
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["run", "loss", "seed", "config_id", "rsum"])
        writer.writerows([f"loss={loss},seed={s}", loss, s, loss, v] for loss, vs in values.items()
                         for s, v in enumerate(vs))
    return path, values


@pytest.mark.parametrize("fmt", ["md", "latex", "csv"])
def test_report_baseline_adds_welchs_p_against_that_row(seed_table, fmt):
    path, values = seed_table
    done = vse("report", path, "--columns", "recall", "--format", fmt, "--baseline", "mh")
    assert done.exit_code == 0, done.output
    assert "p vs mh (rsum)" in done.output
    for loss in ("topk", "sh"):
        p = ttest_ind(values[loss], values["mh"], equal_var=False).pvalue
        line = next(line for line in done.output.splitlines() if line.startswith(("| loss=" + loss,
                                                                                  "loss=" + loss)))
        assert line.rstrip(" |\\").endswith(format_p(p)), line
    assert "(baseline)" in next(line for line in done.output.splitlines() if "loss=mh" in line)


def test_report_baseline_refuses_an_unknown_row_and_per_run(seed_table):
    path, _ = seed_table
    unknown = vse("report", path, "--baseline", "lseh")
    assert unknown.exit_code == 1 and "--baseline 'lseh' names no configuration" in unknown.output
    per_run = vse("report", path, "--baseline", "mh", "--per-run")
    assert per_run.exit_code == 1 and "not with --per-run" in per_run.output
    assert "p vs" not in vse("report", path).output  # without --baseline the table is as it was


# ---------------------------------------------------------------------------- vse claims on the same runs


def test_vse_claims_on_the_groups_results_gives_welchs_one_sided_verdict(results, tmp_path):
    claims = tmp_path / "claims.yaml"
    claims.write_text(f"results: {results}\nclaims:\n"
                      "  - {claim: mh beats sh, paper: VSE++, better: mh, worse: sh, metric: rsum}\n"
                      "  - {claim: sh beats mh, paper: VSE++, better: sh, worse: mh, metric: rsum}\n")
    done = vse("claims", claims)
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "claims.json").read_text())
    mh, sh = list(per_seed(results, "mh").values()), list(per_seed(results, "sh").values())
    p = ttest_ind(mh, sh, equal_var=False, alternative="greater").pvalue
    first, second = written["claims"]
    assert math.isclose(first["p_claimed"], p, rel_tol=TOLERANCE)
    assert math.isclose(second["p_reverse"], p, rel_tol=TOLERANCE)
    expected = "holds" if p < 0.05 else "reversed" if 1 - p < 0.05 else "inside the seed noise"
    assert first["verdict"] == expected
