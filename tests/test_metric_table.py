"""The metric table (pipeline.evaluation.metrics.METRICS) is the one source of metric names: what the
evaluation returns, its JSON, the printed tables, the report layouts and `vse compare` all read
it. And the general formulas are defined once: the human-judgment tau-b is pipeline.evaluation.metrics'."""

import json
import math

import numpy as np
import pytest
from scipy.stats import kendalltau

from pipeline.evaluation.evaluate import evaluate_split_embeddings, format_table, json_metrics
from pipeline.evaluation.inference import SplitEmbeddings
from pipeline.evaluation.judgments import (
    SplitIdentity,
    format_human,
    human_metrics,
    match_judgments,
    read_judgments,
)
from pipeline.evaluation.metrics import (
    METRIC_GROUPS,
    METRIC_KEYS,
    METRICS,
    evaluate_embeddings,
    is_metric,
    kendall_tau_b,
    metric_keys,
    metric_of,
    retrieval_metrics,
)


def split_embeddings(n=12, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(-2, 3, (n, 4)).astype(np.float32)
    captions = rng.integers(-2, 3, (5 * n, 4)).astype(np.float32)
    return SplitEmbeddings(images, captions, np.repeat(np.arange(n), 5), np.arange(n), np.arange(5 * n),
                           "cosine")


def judged(tmp_path, n=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = [f"i{q}.jpg" for q in range(n)]
    lines = ["image,caption_key,grade"]
    for q in range(n):
        for c in rng.choice(n, 4, replace=False):
            lines.append(f"{ids[q]},{ids[c]}#{rng.integers(5)},{rng.integers(4) / 3:.4f}")
    path = tmp_path / "j.csv"
    path.write_text("\n".join(dict.fromkeys(lines)) + "\n", encoding="utf-8")
    keys = [f"{i}#{k}" for i in ids for k in range(5)]
    return match_judgments(read_judgments(path, "csv"), SplitIdentity(ids, keys))


def test_every_key_the_evaluation_returns_is_in_the_table_and_every_retrieval_entry_is_returned(tmp_path):
    emb = split_embeddings()
    rel = np.random.default_rng(1).random((60, 4)).astype(np.float32)

    def relevance(rows):  # a BatchRelevance-like source: (B,) caption rows → (B, B)
        import torch

        v = torch.from_numpy(rel[rows.numpy()])
        return v @ v.T

    metrics = evaluate_split_embeddings(emb, relevance=relevance, cs_ks=(2, 5))
    metrics.update(human_metrics(emb.images, emb.captions, emb.caption_image, judged(tmp_path)))
    unknown = [k for k in metrics if not is_metric(k)]
    assert unknown == []
    groups = {metric_of(k).group for k in metrics}
    assert groups == {"recall", "rank", "sum", "cs", "human", "count"}
    # every recall / rank / sum entry of the table is returned, in the table's order
    assert [k for k in metrics if metric_of(k).group in ("recall", "rank", "sum")] == list(METRIC_KEYS)
    assert list(retrieval_metrics([0, 3], [1, 2])) == list(metric_keys("recall", "rank", "sum"))
    # every human metric and count of the table is returned (families with K = 10, asked by default)
    assert {m.key.format(k=10) for m in METRICS if m.group in ("human", "count")} <= set(metrics)
    # the 5fold protocol averages exactly the table's retrieval keys
    big = split_embeddings(n=10, seed=3)
    folds = evaluate_embeddings(big.images, big.captions, protocol="5fold", fold_size=2)
    assert [k for k in folds if k != "folds"] == list(METRIC_KEYS)


def test_json_and_printed_table_follow_the_table(tmp_path):
    emb = split_embeddings()
    metrics = evaluate_split_embeddings(emb)
    metrics.update(human_metrics(emb.images, emb.captions, emb.caption_image, judged(tmp_path)))
    out = json_metrics(metrics)
    assert list(out) == [k for k in metrics if metric_of(k).in_json]
    assert "mrecall" not in out and "rsum" in out
    assert all(type(out[k]) is int for k in out if metric_of(k).group == "count")
    json.dumps(out, allow_nan=False)  # NaN (undefined) is null
    header = format_table(metrics).splitlines()[0].split()
    assert header == [m.short for m in METRICS if m.direction == "i2t" and m.group in ("recall", "rank")]


def test_a_fractional_median_rank_and_an_undefined_spearman_print_as_everywhere_else():
    """Deliberate fixes: `vse evaluate`'s table printed a 5fold medr (a mean of fold medians,
    e.g. 2.5) rounded to "2" while `vse report` prints 2.5; and an undefined Spearman as "nan"
    on the line where every other undefined value is "n/a". One format per metric now."""
    metrics = retrieval_metrics([0, 1, 4, 9, 10], [0, 1, 2, 3])
    metrics["i2t_medr"] = 2.5
    row = format_table(metrics).splitlines()[1].split()
    assert row[-2:] == ["2.5", "5.8"] and metric_of("i2t_medr").format(2.0) == "2"
    human = {"human_pairs": 3, "human_unmatched": 0, "human_spearman": math.nan}
    for d in ("i2t", "t2i"):
        human.update({f"human_{d}_tau": math.nan, f"human_{d}_r@1": 50.0, f"human_{d}_queries": 1,
                      f"human_{d}_tau_queries": 0})
    lines = format_human(human).splitlines()
    assert lines[0] == "human judgments: 3 pairs, Spearman n/a"
    assert lines[1] == "  image→text  tau n/a  r@1 50.0  (1 queries, tau over 0)"


def test_report_layouts_and_compare_name_only_table_keys():
    from pipeline.evaluation.stats import paired_permutation_test
    from pipeline.reports.compare import COMPARED
    from pipeline.reports.report import LAYOUTS, format_value, table_columns

    table = {m.key for m in METRICS}
    for layout, keys in LAYOUTS.items():
        assert set(keys) <= table, layout
    assert set(COMPARED) <= table
    ranks = (np.array([0, 3, 1]), np.array([2, 0, 0, 5, 1, 1]))
    assert set(paired_permutation_test(ranks, ranks, permutations=10)) == set(COMPARED)
    row = {"run": "a", **retrieval_metrics(*ranks), "i2t_cs@100": 0.5, "epochs_to_best": 3}
    columns = table_columns([row], "paper", epochs=True)
    for _, cols in columns:
        for header, key in cols:
            assert header == metric_of(key).label
            assert format_value(key, row[key]) == metric_of(key).format(row[key])
    assert [title for title, _ in columns] == ["Caption Retrieval", "Image Retrieval", "Coherent Score",
                                               "Training"]
    with pytest.raises(KeyError, match="not a metric"):
        metric_of("i2t_r2")


def test_the_table_is_well_formed():
    keys = [m.key for m in METRICS]
    assert len(keys) == len(set(keys))
    assert {m.group for m in METRICS} == set(METRIC_GROUPS)
    assert {m.direction for m in METRICS} == {"i2t", "t2i", "both"}
    assert metric_of("human_t2i_ndcg@10").label == "NDCG@10"
    assert metric_of("t2i_cs@1000").label == "Image CS@1000"
    assert [m.key for m in METRICS if not m.higher_is_better] == ["i2t_medr", "i2t_meanr", "t2i_medr",
                                                                  "t2i_meanr", "i2t_hubness", "t2i_hubness",
                                                                  "epochs_to_best"]


def test_the_one_tau_b_equals_scipy_on_ties_and_the_judgments_use_it():
    import pipeline.evaluation.judgments.metrics as human
    import pipeline.evaluation.metrics as metrics
    from pipeline.evaluation.judgments import grouped_kendall_tau_b

    assert human.kendall_tau_b is metrics.kendall_tau_b
    assert not hasattr(human, "_signs") and not hasattr(human, "_mean_defined")
    # by hand, with ties in both: x = 3 3 2 1 1, y = 1 2 2 0 1
    x = np.array([[3.0, 3, 2, 1, 1], [1, 1, 1, 1, 1], [1, 2, 3, 4, 5]])
    y = np.array([[1.0, 2, 2, 0, 1], [0, 1, 2, 3, 4], [2, 2, 1, 1, 0]])
    got = kendall_tau_b(x, y).numpy()
    for row, value in zip(range(3), got):
        expected = kendalltau(x[row], y[row]).statistic
        assert (math.isnan(value) and math.isnan(expected)) or value == pytest.approx(expected, abs=1e-15)
    # n0 = 10, ties in x: 2, in y: 2, in both: 0; concordant 5, discordant 1 → 4 / sqrt(8 · 8)
    assert got[0] == pytest.approx(0.5, abs=1e-15) and math.isnan(got[1])
    # rows of different lengths: what lies past a row's length is ignored, whatever it holds
    padded_x, padded_y = np.c_[x, [[9.0], [9.0], [-1.0]]], np.c_[y, [[9.0], [-5.0], [2.0]]]
    short = kendall_tau_b(padded_x, padded_y, [5, 5, 3]).numpy()
    assert short[0] == got[0] and math.isnan(short[1])
    assert short[2] == pytest.approx(kendalltau(x[2, :3], y[2, :3]).statistic, abs=1e-15)
    # grouped: the same numbers, group by group, whatever the order of the items
    groups = np.repeat([7, 3, 5], 5)
    order = np.random.default_rng(0).permutation(15)
    ids, taus = grouped_kendall_tau_b(groups[order], x.ravel()[order], y.ravel()[order])
    assert ids.tolist() == [3, 5, 7]
    assert math.isnan(taus[0]) and taus[1] == pytest.approx(got[2], abs=1e-15)
    assert taus[2] == pytest.approx(got[0], abs=1e-15)
