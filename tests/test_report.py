"""Batch evaluation (`vse evaluate --runs`), results.csv, the papers' tables and the plots."""

import json
import shutil

import pytest
from click.testing import CliRunner
from conftest import train_run

from cli.main import cli
from pipeline.core.errors import VseError
from pipeline.reports.report import format_results, read_results, write_results
from pipeline.training.run_folder import find_runs, fractional_epochs, read_validation_log, run_names


@pytest.fixture(scope="module")
def runs(tiny_cache, sh_and_mh_runs, tmp_path_factory):
    """runs/{sh,mh} (2 epochs, validated every 3 iterations), a nested sweep run, a run with
    a truncated best.pt and one that never reached a validation."""
    root = tmp_path_factory.mktemp("report") / "runs"
    for name in ("sh", "mh"):
        shutil.copytree(sh_and_mh_runs / name, root / name)
    train_run(tiny_cache, root / "grid" / "loss=mh,seed=1", loss="mh", epochs=1, seed=1)
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text((root / "sh" / "config.json").read_text())
    (root / "broken" / "best.pt").write_bytes((root / "sh" / "best.pt").read_bytes()[:2000])
    (root / "empty").mkdir()
    (root / "empty" / "config.json").write_text((root / "sh" / "config.json").read_text())
    return root


def _best_epoch_by_hand(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = records[0]
    for record in records:
        if record["rsum"] > best["rsum"]:
            best = record
    return best["epoch"]


def test_find_runs_descends_into_sweep_folders(runs):
    found = find_runs(str(runs / "*"))
    assert [p.relative_to(runs).as_posix() for p in found] == \
        ["broken", "empty", "grid/loss=mh,seed=1", "mh", "sh"]
    assert run_names(found) == ["broken", "empty", "grid/loss=mh,seed=1", "mh", "sh"]
    assert run_names(found[-1:]) == ["sh"]


def test_evaluate_runs_writes_one_row_per_usable_run(runs, tiny_cache, tmp_path):
    out = tmp_path / "results.csv"
    result = CliRunner().invoke(cli, ["evaluate", "--runs", str(runs / "*"), "--split", "test",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped broken" in result.stderr and "corrupt or truncated checkpoint" in result.stderr
    assert "skipped empty" in result.stderr and "no best.pt" in result.stderr
    assert "3 of 5 runs evaluated, 2 skipped" in result.stderr
    assert "| Model | Caption R@1 |" in result.stdout
    rows = {row["run"]: row for row in read_results(out)}
    assert sorted(rows) == ["grid/loss=mh,seed=1", "mh", "sh"]
    for name, run_dir in (("sh", runs / "sh"), ("mh", runs / "mh"),
                          ("grid/loss=mh,seed=1", runs / "grid" / "loss=mh,seed=1")):
        single = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(run_dir / "best.pt"), "--features",
                                          str(tiny_cache), "--split", "test", "--json"])
        assert single.exit_code == 0, single.output
        for key, value in json.loads(single.stdout).items():
            assert rows[name][key] == pytest.approx(value), (name, key)
        assert rows[name]["epochs_to_best"] == _best_epoch_by_hand(run_dir)
        assert rows[name]["mrecall"] == pytest.approx(rows[name]["rsum"] / 6)
        assert rows[name]["images"] == 8 and rows[name]["split"] == "test"
        assert rows[name]["backbone"] == "synthetic" and rows[name]["features"] == str(tiny_cache)
    assert rows["sh"]["loss"] == "sh" and rows["sh"]["margin"] == 0.2  # the loss's default, resolved
    assert rows["mh"]["negative_set_size"] == 4
    assert json.loads(rows["mh"]["loss_options"]) == {"negative_set_size": 4}
    assert rows["grid/loss=mh,seed=1"]["seed"] == 1 and rows["grid/loss=mh,seed=1"]["epochs_to_best"] == 1


def test_each_cache_is_opened_and_tokenised_once(runs, monkeypatch):
    import pipeline.reports.batch_eval as batch_eval
    from pipeline.core.runtime import resolve_device

    opened, encoded = [], []
    from pipeline.text.vocabulary import TokenizedCaptions

    real_cache, real_encode = batch_eval.FeatureCache, TokenizedCaptions.encode
    monkeypatch.setattr(batch_eval, "FeatureCache", lambda path: opened.append(path) or real_cache(path))
    monkeypatch.setattr(TokenizedCaptions, "encode",
                        classmethod(lambda cls, *a, **k: encoded.append(1) or real_encode(*a, **k)))
    run_dirs = [runs / "sh", runs / "mh", runs / "grid" / "loss=mh,seed=1"]
    result = batch_eval.evaluate_runs(run_dirs, device=resolve_device("cpu"), echo=lambda m: None)
    assert len(result.rows) == 3 and not result.skipped
    assert len(opened) == 1  # one cache for the three runs
    assert len(encoded) == 1  # same training captions → same vocabulary → tokenised once


def test_relevance_adds_the_coherent_score(runs, tiny_cache, tmp_path):
    from pipeline.core.runtime import resolve_device
    from pipeline.evaluation.evaluate import coherent_score_report, embed_checkpoint
    from pipeline.relevance import build_relevance
    from pipeline.reports.batch_eval import evaluate_runs

    relevance = tmp_path / "svd.h5"
    build_relevance(tiny_cache, "svd", relevance, k=20, device="cpu")
    cpu = resolve_device("cpu")
    result = evaluate_runs([runs / "sh"], device=cpu, relevance=str(relevance), cs_ks=(3, 8),
                           echo=lambda m: None)
    row = result.rows[0]
    expected = coherent_score_report(embed_checkpoint(runs / "sh" / "best.pt", tiny_cache, "test", cpu),
                                     str(relevance), (3, 8))
    assert set(expected) == {"i2t_cs@3", "t2i_cs@3", "i2t_cs@8", "t2i_cs@8"}
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, nan_ok=True)
    table = format_results(result.rows, "md", "paper")
    assert "Caption CS@3" in table and "Image CS@8" in table and f"{row['t2i_cs@8']:.3f}" in table


ROWS = [
    {"run": "vse_sh", "i2t_r1": 30.04, "i2t_r5": 60.0, "i2t_r10": 70.0, "i2t_medr": 4.0,
     "t2i_r1": 20.0, "t2i_r5": 50.0, "t2i_r10": 62.5, "t2i_medr": 5.0, "rsum": 292.5},
    {"run": "vse|mh", "i2t_r1": 30.0, "i2t_r5": 64.0, "i2t_r10": 75.0, "i2t_medr": 3.0,
     "t2i_r1": 22.0, "t2i_r5": 49.0, "t2i_r10": 61.0, "t2i_medr": 5.0, "rsum": 301.0},
    {"run": "partial", "i2t_r1": 10.0, "i2t_r5": None, "i2t_r10": 20.0, "i2t_medr": 2.5,
     "t2i_r1": 5.0, "t2i_r5": 9.0, "t2i_r10": 99.0, "t2i_medr": 7.0, "rsum": None},
]


def test_markdown_table_in_the_papers_layout_with_best_in_bold():
    assert format_results(ROWS, "md", "paper", bold="best").split("\n\n")[0] == "\n".join([
        "| Model | Caption R@1 | Caption R@10 | Caption Med r | Image R@1 | Image R@10 | Image Med r |",
        "|:---|---:|---:|---:|---:|---:|---:|",
        # 30.04 and 30.0 print alike: both bold; the lowest Med r (2.5) wins; 5 vs 5 vs 7 ties
        r"| vse\_sh | **30.0** | 70.0 | 4 | 20.0 | 62.5 | **5** |",
        r"| vse\|mh | **30.0** | **75.0** | 3 | **22.0** | 61.0 | **5** |",
        "| partial | 10.0 | 20.0 | **2.5** | 5.0 | **99.0** | 7 |",
    ])


def test_latex_and_csv_tables_of_the_recall_layout():
    latex = format_results(ROWS[:2], "latex", "recall", bold="best")
    assert latex.splitlines() == [
        r"\begin{tabular}{lrrrrrrr}",
        r"\toprule",
        r" & \multicolumn{3}{c}{Caption Retrieval} & \multicolumn{3}{c}{Image Retrieval} &  \\",
        r"\cmidrule(lr){2-4}\cmidrule(lr){5-7}",
        r"Model & R@1 & R@5 & R@10 & R@1 & R@5 & R@10 & rsum \\",
        r"\midrule",
        r"vse\_sh & \textbf{30.0} & 60.0 & 70.0 & 20.0 & \textbf{50.0} & \textbf{62.5} & 292.5 \\",
        r"vse\textbar{}mh & \textbf{30.0} & \textbf{64.0} & \textbf{75.0} & \textbf{22.0} & "
        r"49.0 & 61.0 & \textbf{301.0} \\",
        r"\bottomrule",
        r"\end{tabular}",
        "% bold: best value, without a significance test",
    ]
    assert format_results(ROWS, "csv", "recall").splitlines() == [
        "Model,Caption Retrieval R@1,Caption Retrieval R@5,Caption Retrieval R@10,Image Retrieval R@1,"
        "Image Retrieval R@5,Image Retrieval R@10,rsum",
        "vse_sh,30.0,60.0,70.0,20.0,50.0,62.5,292.5",
        "vse|mh,30.0,64.0,75.0,22.0,49.0,61.0,301.0",
        "partial,10.0,,20.0,5.0,9.0,99.0,",
    ]


def test_results_csv_round_trips_and_bad_files_are_one_line_errors(tmp_path):
    path = write_results(ROWS, tmp_path / "r.csv")
    back = read_results(path)
    assert back == [{**row} for row in ROWS]
    assert path.read_text().splitlines()[0].startswith("run,i2t_r1,i2t_r5,i2t_r10,i2t_medr,t2i_r1")
    (tmp_path / "bad.csv").write_text("run,i2t_r1\nx,high\n")
    with pytest.raises(VseError, match="bad.csv.*'i2t_r1' holds 'high'"):
        read_results(tmp_path / "bad.csv")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(VseError, match="no 'run' column"):
        read_results(tmp_path / "other.csv")
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "missing.csv")])
    assert result.exit_code == 1 and "missing.csv: cannot read results" in result.output


def test_cli_report_prints_the_chosen_format(tmp_path):
    write_results(ROWS, tmp_path / "r.csv")
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "r.csv"), "--format", "latex", "--no-bold"])
    assert result.exit_code == 0, result.output
    assert r"\multicolumn{3}{c}{Caption Retrieval}" in result.output and r"\textbf" not in result.output


def test_validation_log_tolerates_a_killed_writer_and_resumed_duplicates(tmp_path):
    lines = [{"epoch": 1, "iteration": 3, "rsum": 10.0}, {"epoch": 1, "iteration": 8, "rsum": 30.0},
             {"epoch": 2, "iteration": 12, "rsum": 20.0}, {"epoch": 2, "iteration": 12, "rsum": 24.0},
             {"epoch": 2, "iteration": 16, "rsum": 30.0}]
    text = "\n".join(json.dumps(r) for r in lines) + '\n{"epoch": 3, "itera'
    (tmp_path / "metrics.jsonl").write_text(text)
    records = read_validation_log(tmp_path)
    assert [(r["iteration"], r["rsum"]) for r in records] == [(3, 10.0), (8, 30.0), (12, 24.0), (16, 30.0)]
    assert records[1]["mrecall"] == 5.0
    # epoch 1 ended at iteration 8, so the validations sit at 3/8, 1, 12/8, 2 epochs
    assert fractional_epochs(records) == [0.375, 1.0, 1.5, 2.0]
    from pipeline.training.run_folder import epochs_to_best
    assert epochs_to_best(records) == 1  # the first record reaching the maximum


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_from_runs_and_from_results(runs, tmp_path):
    from pipeline.reports.plots import plot_runs

    run_dirs = [runs / "sh", runs / "mh"]
    written = plot_runs(run_dirs, tmp_path / "a")
    # two mh-family sizes are needed for the negatives figure: here only sh (none) and mh (4)
    assert sorted(written) == ["epochs_to_best", "validation_curves"]
    rows = [{"run": f"r{i}", "loss": "mh", "negative_set_size": size, "batch_size": 128, "seed": seed,
             "i2t_r1": 10.0 + (size or 127) / 10, "t2i_r1": 8.0 + seed, "epochs_to_best": 3 + seed}
            for i, (size, seed) in enumerate([(1, 0), (1, 1), (8, 0), (None, 0)])]
    written = plot_runs(run_dirs, tmp_path / "b", results=rows)
    assert sorted(written) == ["epochs_to_best", "negative_set_size", "validation_curves"]
    for paths in written.values():
        png, pdf = paths
        assert png.suffix == ".png" and _is_png(png) and png.stat().st_size > 5000
        assert pdf.suffix == ".pdf" and pdf.read_bytes()[:5] == b"%PDF-"


def test_negative_set_sizes_of_rows():
    from pipeline.reports.plots import negative_set

    assert negative_set({"loss": "mh", "negative_set_size": 8, "batch_size": 128}) == 8
    assert negative_set({"loss": "mh", "negative_set_size": None, "batch_size": 128}) == 127
    assert negative_set({"loss": "sh", "batch_size": 128}) is None


def test_cli_plot(runs, tmp_path):
    result = CliRunner().invoke(cli, ["plot", "--runs", str(runs / "*"), "--out", str(tmp_path / "figs")])
    assert result.exit_code == 0, result.output
    assert f"validation_curves: {tmp_path / 'figs' / 'validation_curves.png'}" in result.output
    assert _is_png(tmp_path / "figs" / "epochs_to_best.png")
    result = CliRunner().invoke(cli, ["plot", "--runs", str(tmp_path / "nothing*"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "no run folders match" in result.output


def test_epochs_to_best_column_fewest_in_bold():
    rows = [{**ROWS[0], "epochs_to_best": 7}, {**ROWS[1], "epochs_to_best": 12}]
    lines = format_results(rows, "md", "recall", epochs=True, bold="best").splitlines()
    assert lines[0].endswith("| rsum | Epochs to best |")
    assert lines[2].endswith("| 292.5 | **7** |") and lines[3].endswith("| **301.0** | 12 |")
    assert "Epochs" not in format_results(rows, "md", "recall")


def test_keep_evaluated_skips_unchanged_runs_and_evaluates_the_rest(runs, tmp_path):
    """--keep-evaluated: a row whose checkpoint bytes and evaluation options are unchanged keeps its
    numbers (shown by a value edited in the table surviving); a changed checkpoint, another split
    or a table without the identity columns is evaluated again; and it is refused without --out."""
    out = tmp_path / "results.csv"
    pattern = str(runs / "[ms]h")
    first = CliRunner().invoke(cli, ["evaluate", "--runs", pattern, "--split", "test", "--out", str(out),
                                     "--keep-evaluated"])
    assert first.exit_code == 0, first.output
    assert "2 of 2 runs evaluated (0 kept from" in first.stderr
    rows = read_results(out)
    assert all(len(row["checkpoint_sha256"]) == 64 and len(row["evaluation_id"]) == 12 for row in rows)
    true_rsum = {row["run"]: row["rsum"] for row in rows}
    for row in rows:
        row["rsum"] = 999.0
    write_results(rows, out)

    again = CliRunner().invoke(cli, ["evaluate", "--runs", pattern, "--split", "test", "--out", str(out),
                                     "--keep-evaluated"])
    assert again.exit_code == 0, again.output
    assert "(2 kept from" in again.stderr and "sh: rsum 999.0 (kept" in again.stderr
    assert {row["run"]: row["rsum"] for row in read_results(out)} == {"mh": 999.0, "sh": 999.0}

    changed = tmp_path / "changed"  # sh's folder with mh's checkpoint: other bytes, evaluated again
    shutil.copytree(runs / "sh", changed / "sh")
    shutil.copy(runs / "mh" / "best.pt", changed / "sh" / "best.pt")
    moved = read_results(out)
    for row in moved:
        row["checkpoint"] = row["checkpoint"].replace(str(runs), str(changed))
    write_results(moved, out)
    result = CliRunner().invoke(cli, ["evaluate", "--runs", str(changed / "sh"), "--split", "test",
                                      "--out", str(out), "--keep-evaluated"])
    assert result.exit_code == 0, result.output
    assert read_results(out)[0]["rsum"] == pytest.approx(true_rsum["mh"])

    write_results(rows, out)  # the 999 rows again, but evaluated on another split now
    dev = CliRunner().invoke(cli, ["evaluate", "--runs", pattern, "--split", "dev", "--out", str(out),
                                   "--keep-evaluated"])
    assert dev.exit_code == 0 and "(0 kept from" in dev.stderr
    assert all(row["rsum"] != 999.0 for row in read_results(out))

    old = [{k: v for k, v in row.items() if k not in ("checkpoint_sha256", "evaluation_id")} for row in rows]
    write_results(old, out)  # a table written before these columns existed: nothing is kept
    result = CliRunner().invoke(cli, ["evaluate", "--runs", pattern, "--split", "test", "--out", str(out),
                                      "--keep-evaluated"])
    assert "(0 kept from" in result.stderr
    assert {row["run"]: row["rsum"] for row in read_results(out)} == pytest.approx(true_rsum)

    refused = CliRunner().invoke(cli, ["evaluate", "--runs", pattern, "--keep-evaluated"])
    assert refused.exit_code == 2 and "--keep-evaluated goes with --runs and --out" in refused.output


def test_evaluation_id_changes_with_every_option_that_changes_the_numbers(tmp_path):
    """Each setting a kept row depends on (``--keep-evaluated``) moves the id: the split, protocol,
    caches, relevance, CS@K, the judgments file's bytes, format and threshold, the checkpoint name."""
    from types import SimpleNamespace

    import torch

    from pipeline.reports.batch_eval import RunEvaluator

    judged = tmp_path / "judged.txt"
    judged.write_text("a\n")
    judgments = SimpleNamespace(path=judged, format="flickr8k-crowdflower", threshold=2 / 3)
    base = {"split": "test", "protocol": "single", "features": None, "relevance": None, "cs_ks": (),
            "judgments": None, "text_features": None}

    def ident(checkpoint="best.pt", **changes):
        return RunEvaluator(torch.device("cpu"), **{**base, **changes}).evaluation_id(checkpoint)

    variants = [ident(), ident("last.pt"), ident(split="dev"), ident(protocol="5fold"),
                ident(features="a.h5"), ident(text_features="t.h5"), ident(relevance="r.h5"),
                ident(relevance="r.h5", cs_ks=(1, 10)), ident(judgments=judgments),
                ident(judgments=SimpleNamespace(**{**vars(judgments), "threshold": 0.5})),
                ident(judgments=SimpleNamespace(**{**vars(judgments), "format": "flickr8k-expert"}))]
    assert len(set(variants)) == len(variants)
    assert ident() == ident()  # and stable
    before = ident(judgments=judgments)
    judged.write_text("b\n")  # the same path, other judgments
    assert ident(judgments=judgments) != before


def test_an_exported_sweeps_seed_folders_group_under_the_study():
    """`vse tune --export` then `vse sweep --seeds` makes STUDY-best/seed=N runs: one group, labelled
    by the study."""
    from pipeline.reports.report import seed_groups

    rows = [{"run": f"mh_clean-best/seed={s}", "rsum": 300.0 + s} for s in range(3)]
    rows.append({"run": "noise=clean,method=mh,seed=0", "loss": "mh", "rsum": 290.0})
    groups = seed_groups(rows)
    assert [g.label for g in groups] == ["mh_clean-best", "noise=clean,method=mh"]
    assert groups[0].samples["rsum"] == [300.0, 301.0, 302.0]
    # a co-trained study's network-0 rows (`vse evaluate --member 0`): one group too, beside the ensemble's
    members = [{"run": f"ncr_clean-best/seed={s},member=0", "member": 0, "rsum": 290.0 + s} for s in range(2)]
    assert [(g.label, len(g.rows)) for g in seed_groups(members)] == [("ncr_clean-best,member=0", 2)]
