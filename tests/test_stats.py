"""Seeds and significance: mean ± std tables, Welch-bold, `vse sweep --seeds`, `vse compare`."""

import itertools
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import ttest_ind

from cli.main import cli
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.evaluation.stats import mean_std, paired_permutation_test, recall_hits, welch_greater
from pipeline.reports.report import format_results, seed_groups
from pipeline.training.run_folder import config_id
from pipeline.training.sweep import load_sweep

# ---------------------------------------------------------------------------- statistics


def test_the_rank_correlations_live_here_and_still_import_from_metrics():
    """kendall_tau_b and spearman moved from pipeline.evaluation.metrics (and the metric table to
    metric_table); the old names are the very same objects."""
    from scipy.stats import spearmanr

    from pipeline.evaluation import metric_table, metrics, stats

    assert metrics.kendall_tau_b is stats.kendall_tau_b and metrics.spearman is stats.spearman
    for name in ("METRICS", "METRIC_KEYS", "METRIC_GROUPS", "DIRECTIONS", "RECALL_KS", "Metric", "recall_key",
                 "metric_keys", "metric_of", "metric_order", "is_metric"):
        assert getattr(metrics, name) is getattr(metric_table, name), name
    x, y = np.array([3.0, 1, 2, 2, 5]), np.array([1.0, 0, 4, 4, 2])
    assert stats.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-15)


def test_mean_std_is_the_sample_std_of_the_finite_values():
    assert mean_std([1.0, 2.0, 3.0, None, math.nan]) == (2.0, 1.0, 3)
    mean, std, n = mean_std([4.5])
    assert (mean, n) == (4.5, 1) and math.isnan(std)
    assert mean_std([])[2] == 0


def test_welch_is_scipys_one_sided_test():
    a, b = [30.0, 31.5, 29.0, 32.0], [28.0, 28.5, 30.0]
    expected = ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert welch_greater(a, b) == pytest.approx(expected, rel=1e-12)
    assert welch_greater(b, a) == pytest.approx(1 - expected, rel=1e-9)
    assert math.isnan(welch_greater([1.0], [0.0, 0.5]))          # one seed: no test
    assert welch_greater([2.0, 2.0], [1.0, 1.0]) == 0.0           # no spread, different means
    assert welch_greater([1.0, 1.0], [1.0, 1.0]) == 1.0


def test_recall_hits_are_rank_below_k():
    hits = recall_hits([0, 4, 9, 10], [1, 5])
    assert hits["i2t_r1"].tolist() == [1, 0, 0, 0] and hits["i2t_r5"].tolist() == [1, 1, 0, 0]
    assert hits["i2t_r10"].tolist() == [1, 1, 1, 0] and hits["t2i_r5"].tolist() == [1, 0]


def test_identical_runs_have_no_difference_and_p_one():
    ranks = (np.array([0, 3, 12]), np.array([0, 1, 7, 20, 2, 2]))
    result = paired_permutation_test(ranks, ranks, permutations=200)
    assert all(m["diff"] == 0.0 and m["p"] == 1.0 for m in result.values())
    assert result["rsum"]["a"] == result["rsum"]["b"]


def test_permutation_p_matches_the_exact_sign_flip_distribution():
    # 8 image queries; A finds the truth at rank 0 on 6 of them where B misses (rank 20), and
    # B wins 1: the exact two-sided p over all 2^8 sign flips is computed by enumeration.
    a_i2t = np.array([0, 0, 0, 0, 0, 0, 20, 0])
    b_i2t = np.array([20, 20, 20, 20, 20, 20, 0, 0])
    t2i = np.zeros(4, dtype=np.int64)
    d = 100.0 * ((a_i2t < 1).astype(float) - (b_i2t < 1))
    observed = d.mean()
    flips = np.array(list(itertools.product([-1, 1], repeat=8)), dtype=float)
    exact = np.mean(np.abs(flips @ d / 8) >= abs(observed) - 1e-9)
    result = paired_permutation_test((a_i2t, t2i), (b_i2t, t2i), permutations=20_000, seed=1)
    assert result["i2t_r1"]["diff"] == 62.5 and observed == 62.5        # (6 - 1) / 8, exact
    assert result["i2t_r1"]["a"] == 87.5 and result["i2t_r1"]["b"] == 25.0
    # Monte Carlo over 20,000 flips: within 0.01 of the exact value (its standard error is 0.002)
    assert result["i2t_r1"]["p"] == pytest.approx(exact, abs=0.01)
    assert result["t2i_r1"]["diff"] == 0.0 and result["t2i_r1"]["p"] == 1.0
    assert result["rsum"]["diff"] == sum(result[k]["diff"] for k in result if k != "rsum")


def test_permutation_test_refuses_different_query_sets():
    with pytest.raises(ValueError, match="same queries"):
        paired_permutation_test((np.zeros(3), np.zeros(15)), (np.zeros(4), np.zeros(20)))


# ---------------------------------------------------------------------------- tables over seeds


def _row(name, seed, cid, r1):
    return {"run": f"{name},seed={seed}", "seed": seed, "config_id": cid, "i2t_r1": r1, "i2t_r5": 50.0,
            "i2t_r10": 60.0, "i2t_medr": 2.0, "t2i_r1": 10.0, "t2i_r5": 40.0, "t2i_r10": 50.0,
            "t2i_medr": 4.0, "rsum": r1 + 210.0}


def test_seeds_of_one_configuration_are_one_row_with_mean_std_n():
    rows = [_row("loss=mh", s, "aaa", r1) for s, r1 in enumerate([30.0, 31.0, 32.0])]
    rows += [_row("loss=sh", s, "bbb", r1) for s, r1 in enumerate([20.0, 21.0, 22.0])]
    groups = seed_groups(rows)
    assert [(g.label, g.n) for g in groups] == [("loss=mh", 3), ("loss=sh", 3)]
    table = format_results(rows, "md", "recall")
    lines = table.splitlines()
    # mh's R@1 (31 ± 1) beats sh's (21 ± 1) by Welch's test: bold; every other column ties
    assert lines[2] == ("| loss=mh | **31.0 ± 1.0 (3)** | 50.0 ± 0.0 (3) | 60.0 ± 0.0 (3) | 10.0 ± 0.0 (3) "
                        "| 40.0 ± 0.0 (3) | 50.0 ± 0.0 (3) | **241.0 ± 1.0 (3)** |")
    assert lines[3].startswith("| loss=sh | 21.0 ± 1.0 (3) |")
    assert "Welch" in lines[-1] and "mean ± std" in lines[-1]


def test_a_best_mean_inside_the_seed_noise_is_not_bold():
    rows = [_row("a", s, "aaa", r1) for s, r1 in enumerate([30.0, 25.0, 35.0])]
    rows += [_row("b", s, "bbb", r1) for s, r1 in enumerate([29.0, 24.0, 33.0])]
    assert "**" not in format_results(rows, "md", "recall")
    assert "**30.0 ± 5.0 (3)**" in format_results(rows, "md", "recall", bold="best")


def test_single_seed_rows_are_never_bold_by_significance():
    rows = [_row("a", 0, "aaa", 30.0), _row("b", 0, "bbb", 20.0)]
    table = format_results(rows, "md", "recall")
    assert "**" not in table and "one seed per row" in table
    assert "**30.0**" in format_results(rows, "md", "recall", bold="best")


def test_config_id_ignores_seed_and_execution_options_only():
    base = TrainConfig(features="x.h5", run_dir="runs/a").to_dict()
    assert config_id(base) == config_id({**base, "seed": 3, "run_dir": "runs/b", "workers": 2})
    assert config_id(base) != config_id({**base, "lr": 1e-3})


def test_a_run_from_before_an_option_reads_as_the_value_it_used(tmp_path):
    """config.json written before --adam-kernel existed: such runs used PyTorch's default
    kernel, so they group with new runs of adam_kernel 'default', not with 'fused' ones."""
    import json

    from pipeline.training.run_folder import read_config

    new = TrainConfig(features="x.h5", run_dir="runs/a", adam_kernel="default").to_dict()
    old = {k: v for k, v in new.items() if k != "adam_kernel"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert read_config(tmp_path)["adam_kernel"] == "default"
    assert config_id(read_config(tmp_path)) == config_id(new)
    assert config_id(read_config(tmp_path)) != config_id({**new, "adam_kernel": "fused"})


def test_a_run_saved_before_the_caption_branch_groups_with_todays_runs():
    """SAF runs saved before --caption-loss-weight existed (no key: 0, off), by the version that
    stored it unset (None) and by today's (0.0) are one configuration; VSRN's unset weight is its
    branch on (1.0), not the branch off."""
    today = TrainConfig(features="x.h5", run_dir="runs/a", network="saf").to_dict()
    assert today["caption_loss_weight"] == 0.0
    unset = {**today, "caption_loss_weight": None}
    before = {k: v for k, v in today.items() if k != "caption_loss_weight"}
    from pipeline.core.config import with_old_defaults

    assert config_id(today) == config_id(unset) == config_id(with_old_defaults(before))
    vsrn = TrainConfig(features="x.h5", run_dir="runs/a", network="vsrn").to_dict()
    assert vsrn["caption_loss_weight"] == 1.0
    assert config_id({**vsrn, "caption_loss_weight": None}) == config_id(vsrn)
    assert config_id({**vsrn, "caption_loss_weight": 0.0}) != config_id(vsrn)


# ---------------------------------------------------------------------------- sweep --seeds


def test_sweep_seeds_repeat_each_grid_point(tmp_path, tiny_cache):
    path = tmp_path / "s.yaml"
    path.write_text(f"runs_dir: {tmp_path}\nbase:\n  features: {tiny_cache}\ngrid:\n  loss: [sh, mh]\n")
    names = [r.name for r in load_sweep(path, seeds=[0, 1]).runs]
    assert names == ["loss=sh,seed=0", "loss=sh,seed=1", "loss=mh,seed=0", "loss=mh,seed=1"]
    path.write_text(path.read_text() + "seeds: [3]\n")
    assert [r.config["seed"] for r in load_sweep(path).runs] == [3, 3]
    path.write_text(path.read_text().replace("loss: [sh, mh]", "loss: [sh]\n  seed: [0]"))
    with pytest.raises(VseError, match="give the seeds once"):
        load_sweep(path)
    result = CliRunner().invoke(cli, ["sweep", str(path), "--seeds", "x", "--dry-run"])
    assert result.exit_code == 2 and "expected integers" in result.output


# ---------------------------------------------------------------------------- vse compare


@pytest.fixture
def two_runs(sh_and_mh_runs):
    return sh_and_mh_runs


def test_compare_gives_the_evaluated_differences(two_runs, tiny_cache):
    runner = CliRunner()
    result = runner.invoke(cli, ["compare", str(two_runs / "sh"), str(two_runs / "mh"), "--json",
                                 "--permutations", "500", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["runs"] == ["sh", "mh"] and out["queries"] == {"images": 8, "captions": 40}
    single = {}
    for name in ("sh", "mh"):
        done = runner.invoke(cli, ["evaluate", "--checkpoint", str(two_runs / name / "best.pt"),
                                   "--features", str(tiny_cache), "--json", "--device", "cpu"])
        single[name] = json.loads(done.stdout)
    for key, m in out["metrics"].items():
        assert m["a"] == pytest.approx(single["sh"][key], abs=1e-9)
        assert m["diff"] == pytest.approx(single["sh"][key] - single["mh"][key], abs=1e-9)
        assert 0 < m["p"] <= 1
    same = runner.invoke(cli, ["compare", str(two_runs / "sh"), str(two_runs / "sh"), "--permutations", "100",
                               "--device", "cpu"])
    assert same.exit_code == 0 and "paired permutation test" in same.output
