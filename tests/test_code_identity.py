"""A run knows its code (issue 58): the vse version, the sha256 of its plug-in files and of the
modules they import from beside them, and of its built-in loss and network files. A sweep never
counts a run of other code as done, report never pools it, --resume refuses it; a plug-in imports
its siblings as a script does; a sweep file's relative paths are its folder's."""

import json
import shutil
import sys

import pytest
from conftest import TINY_TRAIN, vse

from pipeline.core import code_identity
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.reports.report import config_key, format_results, seed_groups
from pipeline.training.build import build_trainer
from pipeline.training.run_folder import CODE, config_id, read_code_identity
from pipeline.training.sweep import load_sweep, plan, run_sweep

QUIET = {"echo": lambda *a, **k: None}
TOPK = """import torch
from helper import MARGIN


class TopK(torch.nn.Module):
    \"\"\"Sum of the hinges of the two hardest negatives, both directions.\"\"\"

    def forward(self, img, cap, image_ids=None, relevance=None):
        scores = img @ cap.t()
        positive = scores.diag()
        mask = torch.eye(len(scores), dtype=torch.bool)
        i2t = (MARGIN + scores - positive[:, None]).clamp(min=0).masked_fill(mask, 0)
        t2i = (MARGIN + scores - positive[None, :]).clamp(min=0).masked_fill(mask, 0)
        k = min(2, len(scores))
        return i2t.topk(k, dim=1).values.sum() + t2i.topk(k, dim=0).values.sum()
"""
SWEEP_BASE = "".join(f"  {k}: {v}\n" for k, v in {**TINY_TRAIN, "epochs": 1, "device": "cpu"}.items())


def _plugin(folder, margin=0.2):
    """FOLDER/topk.py importing MARGIN from FOLDER/helper.py."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "topk.py").write_text(TOPK)
    (folder / "helper.py").write_text(f"MARGIN = {margin}\n")
    return folder / "topk.py"


def _sweep_file(folder, features, runs_dir, loss="topk.py:TopK", seeds=(0,)):
    path = folder / "topk.yaml"
    path.write_text(f"runs_dir: {runs_dir}\nbase:\n  features: {features}\n  loss: {loss}\n{SWEEP_BASE}"
                    f"seeds: {list(seeds)}\n")
    return path


def _train(cache, run_dir, **options):
    config = TrainConfig(features=str(cache), run_dir=str(run_dir), **{**TINY_TRAIN, "epochs": 1, **options})
    build_trainer(config, **QUIET).fit()
    return run_dir


def test_a_plugin_importing_a_helper_beside_it_trains_and_both_files_are_recorded(tmp_path, tiny_cache,
                                                                                   monkeypatch):
    loss = _plugin(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)  # named relative: recorded absolute
    run = _train(tiny_cache, tmp_path / "run", loss="mine/topk.py:TopK")
    config = json.loads((run / "config.json").read_text())
    assert config["loss"] == f"{loss}:TopK"
    record = read_code_identity(run)
    digest = code_identity._sha256
    assert record["plugins"]["loss"]["file"] == str(loss)
    assert record["plugins"]["loss"]["sha256"] == digest(loss)
    assert record["plugins"]["loss"]["beside"] == {"helper.py": digest(tmp_path / "mine" / "helper.py")}
    assert record["builtins"] == {"pipeline/networks/vse_model.py": digest(
        code_identity._PACKAGE_PARENT / "pipeline/networks/vse_model.py")}
    assert record["version"] and record["code_id"] == code_identity.code_id(record)
    assert load_checkpoint(run / "last.pt")[code_identity.RECORD_KEY] == record
    # config_id counts the plug-in by its name and content: the same files elsewhere group
    moved = tmp_path / "elsewhere"
    shutil.copytree(tmp_path / "mine", moved)
    again = code_identity.of_config({**config, "loss": f"{moved / 'topk.py'}:TopK"})
    assert again["code_id"] == record["code_id"]
    assert config_id({**config, "loss": f"{moved / 'topk.py'}:TopK"}, again) == config_id(config, record)


def test_resume_refuses_changed_plugin_code_naming_the_file_and_both_hashes(tmp_path, tiny_cache):
    loss = _plugin(tmp_path / "mine")
    run = _train(tiny_cache, tmp_path / "run", loss=f"{loss}:TopK")
    before = code_identity._sha256(tmp_path / "mine" / "helper.py")
    (tmp_path / "mine" / "helper.py").write_text("MARGIN = 0.5\n")  # the sibling, not the file named
    after = code_identity._sha256(tmp_path / "mine" / "helper.py")
    config = TrainConfig(features=str(tiny_cache), run_dir=str(run), loss=f"{loss}:TopK",
                         **{**TINY_TRAIN, "epochs": 2})
    with pytest.raises(VseError) as refused:
        build_trainer(config, resume=True, **QUIET)
    line = str(refused.value)
    assert "\n" not in line and "--resume: helper.py is other code" in line
    assert f"{before[:12]}… then, {after[:12]}… now" in line
    assert load_checkpoint(run / "last.pt")["epoch"] == 1  # nothing trained, nothing written
    # the same files in another folder (a moved project): the same code, so the run goes on
    (tmp_path / "mine" / "helper.py").write_text("MARGIN = 0.2\n")
    shutil.move(tmp_path / "mine", tmp_path / "moved")
    moved = f"{tmp_path / 'moved' / 'topk.py'}:TopK"
    build_trainer(TrainConfig(features=str(tiny_cache), run_dir=str(run), loss=moved,
                              **{**TINY_TRAIN, "epochs": 2}), resume=True, **QUIET).fit()
    assert load_checkpoint(run / "last.pt")["epoch"] == 2
    assert json.loads((run / "config.json").read_text())["loss"] == moved


def test_a_sweep_never_counts_or_pools_a_run_of_other_plugin_code(tmp_path, tiny_cache):
    from pipeline.core.runtime import resolve_device
    from pipeline.reports.batch_eval import evaluate_runs

    _plugin(tmp_path)
    path = _sweep_file(tmp_path, tiny_cache, tmp_path / "runs")
    first = run_sweep(load_sweep(path), **QUIET)
    assert [r.status for r in first.runs] == ["trained"]
    (tmp_path / "helper.py").write_text("MARGIN = 0.5\n")  # the researcher changes the margin
    sweep = plan(load_sweep(path, seeds=[0, 1]))
    assert [r.status for r in sweep.runs] == ["other-code", "new"]
    assert "helper.py is other code than the run's" in sweep.runs[0].detail
    refused = vse("sweep", path, "--seeds", "0,1")
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1, refused.output
    line = refused.output
    assert ("1 of its runs were trained by other code than this sweep's, so they are not done (first: "
            "seed=0: helper.py is other code than the run's") in line
    assert "give the sweep another --name for a new folder, or --overwrite to train them again" in line
    assert not (tmp_path / "runs" / "topk" / "seed=1").exists()  # refused before anything trained
    second = run_sweep(load_sweep(path, seeds=[0, 1], name="topk_v2"), **QUIET)
    assert [r.status for r in second.runs] == ["trained", "trained"]
    old, new = read_code_identity(first.runs[0].run_dir), read_code_identity(second.runs[0].run_dir)
    assert old["code_id"] != new["code_id"]
    assert old["plugins"]["loss"]["sha256"] == new["plugins"]["loss"]["sha256"]  # topk.py itself unchanged

    runs = [first.runs[0].run_dir, *(r.run_dir for r in second.runs)]
    rows = evaluate_runs(runs, device=resolve_device("cpu"), echo=lambda *_: None).rows
    assert [row["code_id"] for row in rows] == [old["code_id"], new["code_id"], new["code_id"]]
    assert rows[0]["config_id"] != rows[1]["config_id"] == rows[2]["config_id"]  # the plug-in's hashes
    groups = seed_groups(rows)
    assert [g.n for g in groups] == [1, 2]
    # one config_id and name but two codes (e.g. an edited built-in file): still two groups, labelled
    alike = [{**row, "run": "loss=topk", "config_id": "same"} for row in rows]
    assert len({config_key(row) for row in alike}) == 2
    table = format_results(alike, seeds=True)
    assert f"loss=topk ({code_identity.short(old['code_id'])})" in table
    assert f"loss=topk ({code_identity.short(new['code_id'])})" in table

    # --overwrite: the old code's run is trained again, in its folder, by the sweep's code
    third = vse("sweep", path, "--seeds", "0,1", "--overwrite")
    assert third.exit_code == 0 and "sweep topk: training 2 of 2 runs" in third.output, third.output
    assert read_code_identity(first.runs[0].run_dir)["code_id"] == new["code_id"]
    assert [r.status for r in plan(load_sweep(path, seeds=[0, 1])).runs] == ["done", "done"]


def test_compare_refuses_two_versions_of_one_file_unless_across_code(tmp_path):
    record = {"code_id": "a", "version": "0.1.0",
              "plugins": {"loss": {"file": "/x/topk.py", "sha256": "1" * 64}},
              "builtins": {"pipeline/networks/vse_model.py": "2" * 64}}
    edited = {**record, "code_id": "b", "plugins": {"loss": {"file": "/y/topk.py", "sha256": "3" * 64}}}
    mh = {**record, "code_id": "c", "plugins": {}, "builtins": {**record["builtins"],
                                                              "pipeline/losses/hinge.py": "4" * 64}}
    assert code_identity.clash({"A": record, "B": mh}) is None  # two methods: what compare compares
    assert code_identity.clash({"A": record, "B": None}) is None  # unrecorded: unknown
    line = code_identity.clash({"A": record, "B": edited})
    assert line == "topk.py differs between the runs (sha256 111111111111… in A, 333333333333… in B)"
    assert "different vse versions" in code_identity.clash({"A": record, "B": {**mh, "version": "0.2.0"}})
    assert code_identity.mixed({"r0": "a", "r1": "a"}) is None
    assert code_identity.mixed({"r0": "a", "r1": ""}).endswith("a: r0; unrecorded: r1")


def test_built_in_code_id_is_stable_and_follows_its_files(monkeypatch):
    config = TrainConfig(features="x.h5", loss="mh")
    first, second = code_identity.of_config(config), code_identity.of_config(config)
    assert first["code_id"] == second["code_id"] and first["plugins"] == {}
    assert set(first["builtins"]) == {"pipeline/losses/hinge.py", "pipeline/networks/vse_model.py"}
    assert code_identity.code_id({**first, "git": {"commit": "0" * 40, "dirty": True}}) == first["code_id"]
    real = code_identity._sha256
    monkeypatch.setattr(code_identity, "_sha256",
                        lambda path: "0" * 64 if str(path).endswith("hinge.py") else real(path))
    edited = code_identity.of_config(config)
    assert edited["code_id"] != first["code_id"]
    assert code_identity.differences(first, edited).startswith("pipeline/losses/hinge.py is other code")
    assert "pipeline/losses/contrastive.py" in code_identity.of_config(TrainConfig(features="x.h5",
                                                                                 loss="infonce"))["builtins"]
    # config_id of a run without plug-ins is what it always was: the code adds nothing to it
    values = config.to_dict()
    assert config_id(values, first) == config_id(values) == config_id(values, None)


def test_a_sweep_files_relative_paths_are_its_folders_and_it_resumes_from_elsewhere(tmp_path, tiny_cache,
                                                                                  monkeypatch):
    project = tmp_path / "project"
    _plugin(project / "losses")
    shutil.copytree(tiny_cache.parent, project / "data")  # the cache and its shards
    (project / "experiments").mkdir()
    path = _sweep_file(project / "experiments", "../data/tiny.h5", "../runs", loss="../losses/topk.py:TopK")
    monkeypatch.chdir(project)  # below the working folder: recorded relative to it, as before
    sweep = load_sweep("experiments/topk.yaml")
    assert sweep.runs_dir.as_posix() == "runs"
    assert sweep.runs[0].config["features"] == "data/tiny.h5"
    assert sweep.runs[0].config["loss"] == f"{project / 'losses' / 'topk.py'}:TopK"
    assert [r.status for r in run_sweep(sweep, **QUIET).runs] == ["trained"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sweep = plan(load_sweep(path, overrides={"epochs": 2}))
    assert sweep.runs[0].config["features"] == str(project / "data" / "tiny.h5")
    assert [(r.status, r.detail) for r in sweep.runs] == [("unfinished", "last.pt at epoch 1/2")]
    assert [r.status for r in run_sweep(sweep, resume=True, **QUIET).runs] == ["trained"]
    run = project / "runs" / "topk" / "seed=0"
    assert load_checkpoint(run / "last.pt")["epoch"] == 2
    assert (run / CODE).is_file() and not (elsewhere / "runs").exists()


def test_a_tune_goes_on_only_under_its_own_code_and_reads_paths_from_its_folder(tmp_path, tiny_cache,
                                                                              monkeypatch):
    _plugin(tmp_path / "tunes")
    path = tmp_path / "tunes" / "topk_tune.yaml"
    base = "".join(f"  {k}: {v}\n" for k, v in {**TINY_TRAIN, "device": "cpu"}.items() if k != "lr")
    path.write_text(f"runs_dir: ../runs\nbase:\n  features: {tiny_cache}\n  loss: topk.py:TopK\n{base}"
                    "search:\n  lr: {log_uniform: [1.0e-3, 2.0e-2]}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    first = vse("tune", path, "--budget", "1x1", "--no-plots")
    assert first.exit_code == 0, first.output
    trial = tmp_path / "runs" / "topk_tune" / "trial_0000"
    assert read_code_identity(trial)["plugins"]["loss"]["file"] == str(tmp_path / "tunes" / "topk.py")
    (tmp_path / "tunes" / "helper.py").write_text("MARGIN = 0.5\n")
    again = vse("tune", path, "--budget", "2x1", "--no-plots")
    assert again.exit_code == 1 and "was made with another code (plug-in or built-in files" in again.output
    assert "give a new --name" in again.output and not (trial.parent / "trial_0001").exists()


def test_the_git_commit_is_recorded_when_there_is_one_and_nothing_fails_without_git(monkeypatch):
    import subprocess

    code_identity.git_state.cache_clear()
    state = code_identity.git_state()
    if (code_identity._PACKAGE_PARENT / ".git").exists():
        assert len(state["commit"]) == 40 and state["dirty"] in (True, False)

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    code_identity.git_state.cache_clear()
    try:
        assert code_identity.git_state() is None
        assert code_identity.of_config({"loss": "sh"})["git"] is None
    finally:
        code_identity.git_state.cache_clear()


def test_a_saved_run_without_plugins_keeps_the_config_id_its_results_row_holds():
    """A results folder's run (its config.json kept in git) has the config_id results.csv recorded
    for it before code identity existed, with its code identity or without (none recorded)."""
    import csv
    from pathlib import Path

    from pipeline.training.run_folder import read_config

    folder = Path(__file__).resolve().parents[1] / "bench" / "results" / "precision_sgraf_cpu"
    rows = {row["run"]: row for row in csv.DictReader(open(folder / "results_fp32.csv", encoding="utf-8"))}
    for name in ("saf_fp32/method=mh,seed=0", "saf_fp32/method=lseh-svd,seed=1"):
        config = read_config(folder / "runs" / name)
        record = code_identity.of_config(config)
        assert config_id(config) == config_id(config, record) == rows[name]["config_id"]


def test_two_plugin_folders_each_import_their_own_helper_and_a_stdlib_name_beside_one_is_refused(tmp_path):
    from pipeline.core.plugin_import import plugin_class, plugin_sources

    for folder, margin in (("a", 0.2), ("b", 0.7)):
        _plugin(tmp_path / folder, margin)
    first = plugin_class(f"{tmp_path / 'a' / 'topk.py'}:TopK", "loss")
    second = plugin_class(f"{tmp_path / 'b' / 'topk.py'}:TopK", "loss")
    margins = [vars(sys.modules[cls.__module__])["MARGIN"] for cls in (first, second)]
    assert margins == [0.2, 0.7]  # as two scripts would: each its own helper.py
    beside = [plugin_sources(f"{tmp_path / f / 'topk.py'}:TopK", "loss")["beside"]["helper.py"] for f in "ab"]
    assert beside == [code_identity._sha256(tmp_path / f / "helper.py") for f in "ab"]
    assert beside[0] != beside[1]

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "json.py").write_text("X = 1\n")
    (tmp_path / "c" / "loss.py").write_text("import json\nimport torch\n\n\nclass L(torch.nn.Module):\n"
                                            "    pass\n")
    with pytest.raises(VseError, match=r"imports 'json', which is beside it .* was imported from .* already: "
                                       "rename one of them"):
        plugin_class(f"{tmp_path / 'c' / 'loss.py'}:L", "loss")
