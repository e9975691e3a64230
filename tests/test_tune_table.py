"""experiments/tune_table.py: the equal-tuning protocol end to end on the tiny cache (tune, export, seeds,
evaluate, tables, the side-by-side table and the claims compared), a rerun that skips every
finished step, and its refusals."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

pytest.importorskip("optuna")

import tune_table  # noqa: E402

TINY = {"embed_dim": 16, "word_dim": 8, "batch_size": 16, "min_word_count": 1, "workers": 0, "log_every": 1,
        "device": "cpu"}
CLAIM = "rcl beats mh under caption20 noise"


def _default_results(path: Path) -> Path:
    """A default-options table of the two methods at caption20, 2 seeds: rcl far above mh."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["run", "loss", "seed", "rsum"])
        for seed in (0, 1):
            writer.writerow([f"noise=caption20,method=mh,seed={seed}", "mh", seed, 200.0 + seed])
            writer.writerow([f"noise=caption20,method=rcl,seed={seed}", "rcl", seed, 300.0 + 2 * seed])
    return path


def _spec(tmp_path, cache, **changes) -> Path:
    """Two methods at one noise level, budget 2x1, seeds 0-1 of 2 epochs."""
    methods = [{"name": "mh", "loss": "mh", "search": {"loss_options.margin": {"uniform": [0.05, 0.5]}}},
               {"name": "rcl", "loss": "rcl", "search": {"loss_options.tau": {"log_uniform": [0.01, 0.2]}}}]
    spec = {"name": "tuned", "runs_dir": str(tmp_path / "runs"), "budget": "2x1", "seeds": [0, 1],
            "epochs": 2, "out": str(tmp_path / "out"),
            "default_results": str(_default_results(tmp_path / "default.csv")), "claims": "noisy",
            "base": {"features": str(cache), **TINY}, "search": {"lr": {"log_uniform": [1e-3, 2e-2]}},
            "noise": [{"name": "caption20", "noise_rate": 0.2}], "methods": methods, **changes}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_the_protocol_runs_end_to_end_and_a_rerun_skips_every_finished_step(tmp_path, tiny_cache, capsys):
    spec_path = _spec(tmp_path, tiny_cache)
    assert tune_table.main([str(spec_path), "--no-plots"]) == 0
    first = capsys.readouterr().out
    out, root = tmp_path / "out", tmp_path / "runs" / "tuned"
    for step in ("files", "tune", "export", "seeds", "evaluate", "tables", "compare"):
        assert f"[{step}] ran" in first, first

    # each study: its generated tune file, its trials, the export and its seed runs
    for method in ("mh", "rcl"):
        study = f"caption20-{method}"
        records = [json.loads(p.read_text()) for p in sorted((root / study).glob("trial_*/tune.json"))]
        assert len(records) == 2 and {r["state"] for r in records} <= {"COMPLETE", "PRUNED"}
        assert all(r["budget"] == "2×1" for r in records)
        assert (root / "best" / f"{study}.yaml").read_text().startswith("# vse tune export")
        for seed in (0, 1):
            config = json.loads((root / f"{study}-best" / f"seed={seed}" / "config.json").read_text())
            assert config["epochs"] == 2 and config["seed"] == seed and config["loss"] == method
            assert config["noise_rate"] == 0.2

    # results and the tables, rows named as the default table's
    with open(out / "results.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 4
    table = (out / "table_noisy.md").read_text()
    for method in ("mh", "rcl"):
        # 8 test images of a 2-epoch run: the row is also marked as at chance (evaluation.chance)
        label = rf"\| noise=caption20,method={method} \(tuned 2×1\)( \(at chance[^|]*)? \|"
        assert re.search(label, table), table
    assert not (out / "table_human.md").exists()  # no judgments in this spec

    side = (out / "side_by_side.md").read_text().splitlines()
    rows = [line for line in side if line.startswith("| mh |") or line.startswith("| rcl |")]
    assert [r.split(" | ")[:3] for r in rows] == [["| mh", "caption20", "200.5 ± 0.7 (2)"],
                                                   ["| rcl", "caption20", "301.0 ± 1.4 (2)"]]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3].endswith("(2)") and cells[6].startswith("lr ")
        assert cells[8] in ("1 + 1", "2 + 0", "0 + 2")
        assert float(cells[9]) >= 0 and float(cells[10]) >= 0  # minutes, .1f: a tiny run reads 0.0
    spec = tune_table.load_spec(spec_path)
    assert all(tune_table.seed_minutes(s, spec) > 0 for s in spec.studies)
    assert all(r["minutes"] > 0 for s in spec.studies for r in tune_table.trial_records(s))
    assert any(line.startswith("Cost of the budget: ") and "for 2 studies" in line for line in side)

    compared = json.loads((out / "claims_compare.json").read_text())
    by_claim = {c["claim"]: c for c in compared["claims"]}
    tuned = json.loads((out / "claims.json").read_text())["claims"]
    assert by_claim[CLAIM]["default"] == "holds"
    assert by_claim[CLAIM]["tuned"] == next(c["verdict"] for c in tuned if c["claim"] == CLAIM)
    assert by_claim[CLAIM]["change"] == tune_table.claim_change("holds", by_claim[CLAIM]["tuned"])
    assert by_claim["ncr beats mh under caption20 noise"]["change"] == "not compared"  # ncr not in this spec
    assert CLAIM in compared["summary"][by_claim[CLAIM]["change"]] and compared["budget"] == "2×1"
    assert [c["claim"] for c in compared["pairs"]] == ["rcl beats mh at caption20"]  # the default's order
    assert compared["pairs"][0]["default"] == "holds"
    assert f"- {by_claim[CLAIM]['change']}: {CLAIM}" in side

    # the same command again: every step is skipped, nothing is trained or rewritten
    written = {p: p.stat().st_mtime for p in out.iterdir()}
    assert tune_table.main([str(spec_path), "--no-plots"]) == 0
    again = capsys.readouterr().out
    assert "$ vse" not in again, again
    for step in ("files", "tune", "export", "seeds", "evaluate", "tables", "compare"):
        assert f"[{step}] skipped (done)" in again, again
    assert {p: p.stat().st_mtime for p in out.iterdir()} == written
    assert len(list((root / "caption20-mh").glob("trial_*"))) == 2


@pytest.mark.parametrize("default, tuned, change", [
    ("holds", "holds", "holds"), ("holds", "reversed", "flips"), ("reversed", "holds", "flips"),
    ("holds", "inside the seed noise", "disappears"), ("reversed", "inside the seed noise", "disappears"),
    ("inside the seed noise", "holds", "appears"), ("reversed", "reversed", "stays reversed"),
    ("inside the seed noise", "inside the seed noise", "inside the seed noise in both"),
    ("holds", "not measured", "not compared"),
    ("not testable: 1 and 3 seeds (one seed is an anecdote)", "holds", "not compared"),
])
def test_a_claims_change_from_its_two_verdicts(default, tuned, change):
    assert tune_table.claim_change(default, tuned) == change


@pytest.mark.parametrize("changes, problem", [
    ({"grid": {}}, "unknown key(s) grid"),
    ({"methods": []}, "missing methods"),
    ({"claims": "noisier"}, "claims: 'noisier' is no claim set"),
    ({"seeds": [0, 0]}, "seeds: a non-empty list of distinct integers"),
    ({"noise": [{"name": "a b"}]}, "study name (NOISE-METHOD) 'a b-mh'"),
    ({"budget": "2"}, "--budget is TRIALSxEPOCHS"),
])
def test_a_bad_spec_is_one_line_naming_the_file_before_anything_runs(tmp_path, tiny_cache, capsys, changes,
                                                                     problem):
    spec_path = _spec(tmp_path, tiny_cache, **changes)
    assert tune_table.main([str(spec_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and problem in err, err
    assert not (tmp_path / "runs").exists()


def test_a_search_a_run_refuses_stops_before_the_first_trial_of_any_study(tmp_path, tiny_cache, capsys):
    """The second method's range is checked with the first's: no study starts."""
    methods = [{"name": "mh", "loss": "mh", "search": {"loss_options.margin": {"uniform": [0.05, 0.5]}}},
               {"name": "rcl", "loss": "rcl", "search": {"loss_options.tua": {"uniform": [0.01, 0.2]}}}]
    assert tune_table.main([str(_spec(tmp_path, tiny_cache, methods=methods))]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "caption20-rcl.yaml: search: " in err, err
    assert "loss rcl has no option tua" in err, err
    assert not (tmp_path / "runs" / "tuned" / "caption20-mh").exists()
