"""experiments/reality_check.py and its summary and tables (reality_tables.py): the reality check's steps
end to end on the tiny cache (2 losses, 3 trials of 1 epoch, 2 seeds, one loss tuned again without a
pruner), a rerun that trains nothing, the summary's counts and minutes, a co-trained run read as one
network, the dry run, the spec's refusals, and the repository's spec and claims file as `vse tune` and
`vse claims` read them."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

pytest.importorskip("optuna")

import reality_check as rc  # noqa: E402
import reality_tables as rt  # noqa: E402

TINY = {"embed_dim": 16, "word_dim": 8, "batch_size": 16, "min_word_count": 1, "workers": 0, "log_every": 1,
        "device": "cpu"}
STEPS = rc.STEPS


def _spec(tmp_path, cache, **changes) -> Path:
    """sh and mh, budget 3x1 with the median pruner, mh tuned again unpruned, seeds 0-1; the repository's
    claim set (reality: mh-best against sh-best is measured here, the others are not); a second regime of
    sh and the best other loss of the first."""
    losses = [{"name": "sh", "loss": "sh", "search": {"loss_options.margin": {"uniform": [0.05, 0.5]}}},
              {"name": "mh", "loss": "mh", "search": {"loss_options.margin": {"uniform": [0.05, 0.5]}}}]
    spec = {"name": "reality", "runs_dir": str(tmp_path / "runs"), "budget": "3x1", "pruner": "median",
            "seeds": [0, 1], "unpruned": ["mh"], "out": str(tmp_path / "out"), "claims": "reality",
            "base": {"features": str(cache), **TINY}, "search": {"lr": {"log_uniform": [1e-3, 2e-2]}},
            "losses": losses, "second_regime": {"name": "grid", "out": str(tmp_path / "out_grid"),
                                                "budget": "2x1", "base": {"features": str(cache), **TINY},
                                                "losses": ["sh"], "best_of_fast": 1},
            **changes}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_every_step_runs_then_a_rerun_trains_nothing(tmp_path, tiny_cache, capsys):
    spec_path = _spec(tmp_path, tiny_cache)
    assert rc.main([str(spec_path), "--no-plots"]) == 0
    first = capsys.readouterr().out
    for step in STEPS:
        assert f"[{step}] ran" in first, first
    root, out = tmp_path / "runs" / "reality", tmp_path / "out"

    # the files: a tune file per study (the unpruned one too), a sweep file of each loss's defaults
    for name in ("sh", "mh", "mh-unpruned"):
        tune = yaml.safe_load((root / "tune_files" / f"{name}.yaml").read_text())
        assert tune["name"] == name and set(tune["search"]) == {"lr", "loss_options.margin"}
    for loss in ("sh", "mh"):
        sweep = yaml.safe_load((root / "defaults" / f"{loss}.yaml").read_text())
        assert sweep["name"] == f"{loss}-default" and sweep["base"]["loss"] == loss
        assert sweep["base"]["epochs"] == 1 and "lr" not in sweep["base"]  # default lr; the budget's epochs

    # the studies: 3 trials each, with the pruner they were given; the exports; the seed runs
    for name, pruner in (("sh", "median"), ("mh", "median"), ("mh-unpruned", "none")):
        records = [json.loads(p.read_text()) for p in sorted((root / name).glob("trial_*/tune.json"))]
        assert len(records) == 3 and {r["state"] for r in records} <= {"COMPLETE", "PRUNED"}
        assert {r["pruner"] for r in records} == {pruner} and {r["budget"] for r in records} == {"3×1"}
        assert [r["drawn"] for r in records] == ["random"] * 3  # fewer trials than TPE's start-up
        assert (root / "best" / f"{name}.yaml").read_text().startswith("# vse tune export")
    # with 3 trials (no pruning before the 4th) both mh studies train the same 3 points: the same best,
    # whose seeds are not trained twice
    assert rc.same_options(rc.load_spec(spec_path), "mh")
    assert not list((root / "mh-unpruned-best").glob("seed=*"))
    for folder in ("sh-default", "mh-default", "sh-best", "mh-best"):
        for seed in (0, 1):
            config = json.loads((root / folder / f"seed={seed}" / "config.json").read_text())
            assert config["seed"] == seed and config["epochs"] == 1 and config["loss"] == folder.split("-")[0]
    # the unpruned study draws the pruned one's start-up points (the same sampler seed)
    params = [[json.loads(p.read_text())["params"] for p in sorted((root / n).glob("trial_*/tune.json"))]
              for n in ("mh", "mh-unpruned")]
    assert params[0] == params[1]

    # results: one row per seed run; the tables
    with open(out / "results.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * 4
    table = (out / "table_recall.md").read_text()
    for loss in ("sh", "mh"):
        for kind in ("default", "tuned"):
            assert f"| method={loss},options={kind}" in table, table
    assert not (out / "table_human.md").exists()  # no judgments in this spec

    # the summary: each study's counts, minutes and best options; the pruner's check; the cost
    summary = json.loads((out / "studies.json").read_text())
    assert summary["format"] == rt.SUMMARY_FORMAT and summary["tpe_startup_trials"] == 10
    assert [s["study"] for s in summary["studies"]] == ["sh", "mh", "mh-unpruned"]
    for study in summary["studies"]:
        trials = study["trials"]
        assert trials["complete"] + trials["pruned"] == 3 and trials["failed"] == 0
        assert (trials["random"], trials["tpe"], trials["re_run"], trials["unrecorded"]) == (3, 0, 0, 0)
        assert study["minutes"] > 0 and (study["study"] == "mh-unpruned" or study["seed_minutes"] > 0)
        assert set(study["best"]["params"]) == {"lr", "loss_options.margin"} and "dev_rsum" in study["best"]
    assert all(d["seed_minutes"] > 0 for d in summary["defaults"])
    minutes = summary["minutes"]
    assert minutes["total"] == pytest.approx(minutes["tune"] + minutes["seeds"], rel=1e-12)
    [check] = summary["pruner_check"]
    assert check["loss"] == "mh" and check["verdict"] == "the same options" and check["p"] is None
    assert check["pruned"]["test_rsum"]["n"] == 2 and check["unpruned"]["test_rsum"] == {"n": 0}
    assert check["pruned"]["params"] == check["unpruned"]["params"]
    side = (out / "default_vs_tuned.md").read_text().splitlines()
    rows = [line for line in side if line.startswith(("| sh |", "| mh |"))]
    assert len(rows) == 2 and all(row.split(" | ")[1].endswith("(2)") for row in rows)
    assert all(row.split(" | ")[8] == "3 + 0" for row in rows)  # drawn: random + TPE
    assert "| mh | " in (out / "pruner_check.md").read_text()

    # the claims: vse claims on the tuned rows; the same claims on the default rows beside them
    claims = json.loads((out / "claims.json").read_text())
    assert claims["format"] == "vse-claims"
    by_claim = {c["claim"]: c for c in claims["claims"]}
    vsepp = "VSE++ (max of hinges) beats VSE0 (sum of hinges)"
    assert by_claim[vsepp]["mh-best"]["n"] == 2 and by_claim[vsepp]["sh-best"]["n"] == 2
    assert by_claim["PCME++ beats PCME on rsum"]["verdict"] == "not measured"
    compared = {c["claim"]: c for c in json.loads((out / "claims_compare.json").read_text())["claims"]}
    assert compared[vsepp]["tuned"] == by_claim[vsepp]["verdict"]
    assert compared[vsepp]["default"] not in ("not measured",)

    # the same command again: nothing is trained, evaluated or rewritten
    written = {p: p.stat().st_mtime for p in out.iterdir()}
    assert rc.main([str(spec_path), "--no-plots"]) == 0
    again = capsys.readouterr().out
    assert "$ vse" not in again, again
    for step in STEPS:
        assert f"[{step}] skipped (done)" in again, again
    assert {p: p.stat().st_mtime for p in out.iterdir()} == written
    assert len(list((root / "mh").glob("trial_*"))) == 3

    # the dry run: every step done, and the cost ahead from the minutes measured (none left)
    assert rc.main([str(spec_path), "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert "[tune] mh-unpruned: 3/3 trials" in dry and "[evaluate] " in dry and ": done (" in dry
    assert "ahead: about 0 min" in dry, dry

    # the second regime: sh, and the best of the others on the first regime's tuned test rsum
    assert rc.main([str(spec_path), "--second-regime", "--dry-run"]) == 0
    second = capsys.readouterr().out
    assert [line.split(":")[0] for line in second.splitlines() if line.startswith("[tune]")] == \
        ["[tune] sh", "[tune] mh"], second
    assert "0/2 trials" in second and not (tmp_path / "runs" / "grid").exists()


def test_a_dry_run_writes_nothing_and_says_nothing_is_measured(tmp_path, tiny_cache, capsys):
    assert rc.main([str(_spec(tmp_path, tiny_cache)), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[files] 5 to write: 3 tune files, 2 sweep files" in out
    assert "[tune] mh-unpruned: 0/3 trials" in out and "nothing measured yet" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
    assert rc.main([str(_spec(tmp_path, tiny_cache)), "--second-regime", "--dry-run"]) == 1
    assert "best_of_fast: 1: the fast loop has no results yet" in capsys.readouterr().err


def test_without_a_pruner_each_loss_is_one_study_and_there_is_nothing_to_check(tmp_path, tiny_cache, capsys):
    spec = rc.load_spec(_spec(tmp_path, tiny_cache, pruner="none", unpruned=[]))
    assert [(s.name, s.pruner, s.check) for s in spec.studies] == [("sh", "none", False),
                                                                     ("mh", "none", False)]
    assert [rc.arm_kind(arm) for arm in rc.seed_arms(spec)] == ["default", "tuned", "default", "tuned"]
    assert rc.main([str(_spec(tmp_path, tiny_cache, pruner="none", unpruned=[])), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[files] 4 to write: 2 tune files, 2 sweep files" in out and "none pruner" in out, out
    assert rt.pruner_table(spec, {"pruner_check": []}).startswith("No pruner: every trial")


def test_a_co_trained_run_is_read_as_its_one_network(tmp_path, tiny_cache):
    """results.csv holds a co-trained run's row (2 networks) and its network's row (--member): the
    tables read the one network's."""
    spec = rc.load_spec(_spec(tmp_path, tiny_cache, member=1))
    run = spec.study("mh").seed_run(0)
    rows = [{"run": "mh-best/seed=0", "checkpoint": str(run / "best.pt"), "loss": "mh", "rsum": 300.0,
             "ensemble": 2, "member": ""},
            {"run": "mh-best/seed=0,member=1", "checkpoint": str(run / "best.pt"), "loss": "mh",
             "rsum": 280.0, "ensemble": 1, "member": 1}]
    results = tmp_path / "results.csv"
    with open(results, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    [[row]] = rc.arm_rows(spec, results).values()
    assert row["rsum"] == 280.0 and row["run"] == "method=mh,options=tuned,member=1,seed=0"


@pytest.mark.parametrize("changes, problem", [
    ({"grid": {}}, "unknown key(s) grid"),
    ({"budget": None}, "missing budget"),
    ({"pruner": "asha"}, "pruner: one of median, hyperband, none, got 'asha'"),
    ({"pruner": "none"}, "unpruned: the pruner's check; with pruner: none every study is unpruned"),
    ({"unpruned": ["ncr"]}, "unpruned: names of losses: (ncr is none)"),
    ({"seeds": [0]}, "seeds: a list of at least two distinct integers"),
    ({"claims": "realty"}, "claims: 'realty' is no claim set"),
    ({"base": {"epochs": 6}}, "base: epochs: the budget's epochs are the schedule"),
    ({"second_regime": {"name": "g", "out": "o", "budget": "2x1", "base": {"a": 1}, "losses": ["ncr"]}},
     "second_regime: losses: names of losses: (ncr is none)"),
])
def test_a_bad_spec_is_one_line_naming_the_file_before_anything_runs(tmp_path, tiny_cache, capsys, changes,
                                                                     problem):
    assert rc.main([str(_spec(tmp_path, tiny_cache, **changes))]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and problem in err and "spec.yaml" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_search_a_run_refuses_stops_before_any_file(tmp_path, tiny_cache, capsys):
    losses = [{"name": "mh", "loss": "mh", "search": {"loss_options.margn": {"uniform": [0.05, 0.5]}}}]
    assert rc.main([str(_spec(tmp_path, tiny_cache, losses=losses, unpruned=[], second_regime=None))]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "losses: mh: " in err and "margn" in err, err
    assert not (tmp_path / "runs").exists()


def test_the_repository_spec_states_every_loss_once_and_its_claims_name_its_rows():
    """experiments/f8k_reality.yaml: at least 15 losses, every built-in one, each search checked by
    `vse tune`'s rules; the budget searches (TPE-guided trials after the start-up); the claims file
    loads and names only tuned rows of its losses."""
    from pipeline.core.registry import LOSSES
    from pipeline.reports.claims import load_claims
    from pipeline.training.tune import TPE_STARTUP_TRIALS

    spec = rc.load_spec(ROOT / "experiments" / "f8k_reality.yaml")
    assert len(spec.losses) >= 15 and set(LOSSES.names) <= {spec.entries[n]["loss"] for n in spec.losses}
    # no pruner (the pilot's median pruner failed its check on infonce: bench/results/f8k_reality_pilot):
    # every trial trains the whole schedule, one study per loss, no check studies
    assert spec.budget.trials - TPE_STARTUP_TRIALS >= 20 and spec.pruner == "none"
    assert spec.seeds == [0, 1, 2, 3, 4] and [s.name for s in spec.studies] == spec.losses
    assert all(s.pruner == "none" and not s.check for s in spec.studies)
    rc.check_searches(spec)
    claims = load_claims(spec.claims)
    assert [p.resolve() for p in claims.results] == [(spec.out / "results.csv").resolve()]
    named = {name for c in claims.claims for name in (c.better, c.worse)}
    assert named <= {loss + rt.TUNED for loss in spec.losses}, named
    assert spec.second is not None and set(spec.second["losses"]) <= set(spec.losses)


def test_how_a_trials_values_were_drawn():
    """TPE's start-up trials are random, the later ones TPE's, a failed trial queued again a re-run."""
    import optuna

    from pipeline.training import tune

    study = optuna.create_study(direction="maximize")
    distribution = optuna.distributions.FloatDistribution(0.0, 1.0)
    drawn = []
    for i in range(tune.TPE_STARTUP_TRIALS + 1):
        trial = study.ask()
        drawn.append(tune._drawn(study, trial))
        study.tell(trial, float(i))
    assert drawn == ["random"] * tune.TPE_STARTUP_TRIALS + ["TPE"]
    failed = study.ask({"x": distribution})
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    assert tune.queue_again(study, study.trials[-1])
    assert tune._drawn(study, study.ask()) == "re-run"
