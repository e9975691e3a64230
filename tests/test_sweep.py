"""`vse sweep`: grid expansion, one folder per grid point, skip finished, resume unfinished."""

import json

import pytest
from click.testing import CliRunner

from cli.main import cli
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.errors import VseError
from pipeline.training.run_folder import DONE_MARKER
from pipeline.training.sweep import expand_grid, load_sweep, param_string, plan, run_sweep
from pipeline.training.trainer import Trainer

BASE = ("  embed_dim: 16\n  word_dim: 8\n  batch_size: 16\n  lr: 0.005\n  min_word_count: 1\n"
        "  workers: 0\n  log_every: 1\n")


def _write(tmp_path, text, name="grid.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _sweep_file(tmp_path, tiny_cache, grid, base_extra="", name="grid.yaml"):
    return _write(tmp_path, f"runs_dir: {tmp_path / 'runs'}\nbase:\n  features: {tiny_cache}\n"
                            f"{BASE}{base_extra}grid:\n{grid}", name)


def test_grid_is_the_product_in_file_order_with_loss_options_merged(tmp_path, tiny_cache):
    path = _sweep_file(tmp_path, tiny_cache,
                       "  loss: [sh, mh]\n  loss_options.negative_set_size: [4, 8]\n  seed: [0]\n",
                       base_extra="  epochs: 1\n  loss_options: {warmup_epochs: 1}\n")
    sweep = load_sweep(path)
    assert sweep.name == "grid" and sweep.root == tmp_path / "runs" / "grid"
    assert [r.name for r in sweep.runs] == [
        "loss=sh,negative_set_size=4,seed=0", "loss=sh,negative_set_size=8,seed=0",
        "loss=mh,negative_set_size=4,seed=0", "loss=mh,negative_set_size=8,seed=0"]
    last = sweep.runs[-1]
    assert last.config["loss"] == "mh" and last.config["seed"] == 0 and last.config["epochs"] == 1
    assert last.config["loss_options"] == {"warmup_epochs": 1, "negative_set_size": 8}
    assert last.config["run_dir"] == str(tmp_path / "runs" / "grid" / last.name)
    assert sweep.runs[0].config["loss_options"] == {"warmup_epochs": 1, "negative_set_size": 4}


def test_bundles_set_a_loss_with_its_own_options(tmp_path, tiny_cache):
    path = _sweep_file(tmp_path, tiny_cache,
                       "  method:\n    - {name: vse0, loss: sh}\n"
                       "    - {name: vsepp, loss: mh, loss_options.warmup_epochs: 1}\n"
                       "    - {loss: mh, margin: 0.1}\n  seed: [0, 1]\n")
    runs = load_sweep(path).runs
    assert [r.name for r in runs] == ["method=vse0,seed=0", "method=vse0,seed=1", "method=vsepp,seed=0",
                                      "method=vsepp,seed=1", "method=loss-mh+margin-0.1,seed=0",
                                      "method=loss-mh+margin-0.1,seed=1"]
    assert runs[0].config["loss"] == "sh" and runs[0].config["loss_options"] == {}
    assert runs[3].config["loss"] == "mh" and runs[3].config["loss_options"] == {"warmup_epochs": 1}
    assert runs[3].config["seed"] == 1 and "method" not in runs[3].config and "name" not in runs[3].config
    assert runs[4].config["margin"] == 0.1


def test_name_sweeps_one_grid_again_beside_the_first(tmp_path, tiny_cache):
    """--name with an override (another loss here, another network in the Makefile): its own
    folder, the file's runs untouched, and a bad name refused in one line."""
    path = _sweep_file(tmp_path, tiny_cache, "  seed: [0, 1]\n", base_extra="  loss: mh\n")
    first = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run"])
    again = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--name", "grid_sh", "--loss", "sh"])
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert f"new        {tmp_path / 'runs' / 'grid' / 'seed=0'}" in first.output
    assert f"new        {tmp_path / 'runs' / 'grid_sh' / 'seed=1'}" in again.output
    assert "/grid/" not in again.output
    runs = load_sweep(path, name="grid_sh", overrides={"loss": "sh"}).runs
    assert [r.config["loss"] for r in runs] == ["sh", "sh"]
    bad = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--name", "../x"])
    assert bad.exit_code == 1 and "sweep name '../x' may hold only" in bad.output


def test_only_keeps_the_runs_with_every_value_and_refuses_a_filter_that_matches_none(tmp_path, tiny_cache):
    """--only method=mh --seeds 3-5: one method's extra seeds from the table's own file, with the same
    run names (and so the same folders) as the file's own seeds."""
    path = _sweep_file(tmp_path, tiny_cache, "  method:\n    - {name: vse0, loss: sh}\n"
                       "    - {name: vsepp, loss: mh}\n  margin: [0.1, 0.2]\n")
    runs = load_sweep(path, seeds=[3, 4], only=["method=vsepp", "margin=0.2"]).runs
    assert [r.name for r in runs] == ["method=vsepp,margin=0.2,seed=3", "method=vsepp,margin=0.2,seed=4"]
    assert runs[0].run_dir == tmp_path / "runs" / "grid" / "method=vsepp,margin=0.2,seed=3"
    out = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--only", "method=vse0"])
    assert out.exit_code == 0 and out.output.count("new ") == 2 and "vsepp" not in out.output
    none = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--only", "method=vse"])
    assert none.exit_code == 1 and "--only 'method=vse' matches no run (its values: method=vse0, " \
        "method=vsepp)" in none.output and str(path) in none.output
    bad = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run", "--only", "vsepp"])
    assert bad.exit_code == 1 and "expected KEY=VALUE" in bad.output


def test_param_strings_are_safe_folder_names():
    assert (param_string({"relevance": "cache/rel svd.h5", "margin": 0.2})
            == "relevance=cache_rel_svd.h5,margin=0.2")
    assert param_string({"loss_options.thetas": [0.63, 0.5], "glove": True}) == "thetas=0.63_0.5,glove=true"
    assert param_string({}) == "base"


@pytest.mark.parametrize("text,message", [
    ("base: {features: x.h5}\ngrid: {lr_typo: [1]}\n", "grid key 'lr_typo' is not a training option"),
    ("base: {features: x.h5}\ngrid: {lr: 0.1}\n", "grid key 'lr' needs a non-empty list"),
    ("base: {features: x.h5}\ngrid: {m: [{loss: sh, marginn: 1}]}\n",
     "grid key 'm': 'marginn' is not a training"),
    ("base: {features: x.h5, lrr: 1}\ngrid: {lr: [0.1]}\n", "unknown training option.*lrr"),
    ("bases: {}\n", "unknown sweep key.*bases"),
    ("grid: {lr: [0.1]}\n", "no features"),
    ("- a\n", "mapping"),
    ("base: [\n", "cannot parse sweep file"),
])
def test_bad_sweep_files_are_one_line_errors(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(VseError, match=message) as info:
        load_sweep(path)
    assert str(info.value).startswith(str(path))


def test_expand_grid_without_a_grid_is_one_run():
    assert expand_grid({}) == [{}]


def test_sweep_trains_each_run_once_and_skips_finished_ones(tmp_path, tiny_cache, monkeypatch):
    path = _sweep_file(tmp_path, tiny_cache, "  loss: [sh, mh]\n", base_extra="  epochs: 1\n  val_every: 0\n")
    said = []
    sweep = run_sweep(load_sweep(path), echo=said.append, quiet_runs=True)
    assert [r.status for r in sweep.runs] == ["trained", "trained"]
    for run in sweep.runs:
        assert (run.run_dir / "best.pt").is_file()
        done = json.loads((run.run_dir / DONE_MARKER).read_text())
        assert done["epoch"] == 1 and done["best_epoch"] == 1
        assert json.loads((run.run_dir / "config.json").read_text())["loss"] == run.name.split("=")[1]

    def no_training(self):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(Trainer, "fit", no_training)
    said.clear()
    sweep = run_sweep(load_sweep(path), echo=said.append)
    assert [r.status for r in sweep.runs] == ["done", "done"]
    assert said == [f"done already: loss=sh ({sweep.runs[0].detail})",
                    f"done already: loss=mh ({sweep.runs[1].detail})"]
    # A run finished by hand (last.pt at the final epoch, no marker) counts as done too.
    (sweep.runs[0].run_dir / DONE_MARKER).unlink()
    assert plan(load_sweep(path)).runs[0].status == "done"


def test_a_killed_sweep_resumes_where_it_stopped(tmp_path, tiny_cache, monkeypatch):
    # 120 training captions / 16 = 8 iterations per epoch; checkpoints every 3 iterations.
    path = _sweep_file(tmp_path, tiny_cache, "  seed: [0, 1]\n",
                       base_extra="  loss: sh\n  epochs: 2\n  val_every: 3\n")
    steps = {"n": 0}
    original = Trainer.step
    # Run 1 takes 16 steps; the kill comes 5 steps into run 2 (its last.pt is at iteration 3).
    step_limit = {"kill_at": 16 + 5}

    def killing_step(self, batch):
        if steps["n"] == step_limit["kill_at"]:
            raise KeyboardInterrupt  # as if the sweep process died
        steps["n"] += 1
        return original(self, batch)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", killing_step)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(load_sweep(path), echo=lambda *a: None, quiet_runs=True)
    statuses = plan(load_sweep(path))
    assert [r.status for r in statuses.runs] == ["done", "unfinished"]
    assert statuses.runs[1].detail == "last.pt at epoch 0/2"

    said = []
    run_sweep(load_sweep(path), echo=said.append)  # without --resume it is left alone
    assert "unfinished: seed=1 (last.pt at epoch 0/2); pass --resume to continue it" in said

    steps["n"] = 0
    with monkeypatch.context() as m:
        m.setattr(Trainer, "step",
                  lambda self, batch: steps.__setitem__("n", steps["n"] + 1) or original(self, batch))
        sweep = run_sweep(load_sweep(path), resume=True, echo=lambda *a: None, quiet_runs=True)
    assert [r.status for r in sweep.runs] == ["done", "trained"]
    assert steps["n"] == 16 - 3  # continued from iteration 3, not from the start
    state = load_checkpoint(sweep.runs[1].run_dir / "last.pt")
    assert state["epoch"] == 2 and state["iteration"] == 16
    log = (sweep.runs[1].run_dir / "metrics.jsonl").read_text()
    epochs = [json.loads(line)["iteration"] for line in log.splitlines()]
    assert epochs == [3, 6, 8, 9, 12, 15, 16]


def test_parallel_jobs_and_a_failing_run_do_not_stop_the_others(tmp_path, tiny_cache):
    path = _sweep_file(tmp_path, tiny_cache, f"  features: [{tiny_cache}, {tmp_path / 'missing.h5'}]\n",
                       base_extra="  epochs: 1\n  val_every: 0\n  loss: sh\n")
    result = CliRunner().invoke(cli, ["sweep", str(path), "--jobs", "2"])
    assert result.exit_code == 1
    assert "1 of 2 runs failed" in result.output and "missing.h5: feature cache not found" in result.output
    runs = load_sweep(path).runs
    assert (runs[0].run_dir / DONE_MARKER).is_file() and not (runs[1].run_dir / DONE_MARKER).exists()
    result = CliRunner().invoke(cli, ["sweep", str(path), "--dry-run"])
    assert result.exit_code == 0
    detail = plan(load_sweep(path)).runs[0].detail
    assert result.output.splitlines() == [f"done       {runs[0].run_dir}  ({detail})",
                                          f"new        {runs[1].run_dir}"]


@pytest.mark.slow
def test_a_killed_sweep_takes_its_workers_with_it(tmp_path, tiny_cache):
    """`kill` (SIGTERM) of `vse sweep --jobs 2`: its worker processes stop too, and no run goes on
    training in the background (joblib's workers used to outlive their parent)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    path = _sweep_file(tmp_path, tiny_cache, "  loss: [sh, mh]\n", base_extra="  epochs: 200\n")
    process = subprocess.Popen([sys.executable, "-m", "cli.main", "sweep", str(path), "--jobs", "2"],
                               cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((tmp_path / "runs").glob("*/*/metrics.jsonl"))) < 2:
        time.sleep(0.5)  # both runs have trained an epoch: the workers are busy
    assert len(list((tmp_path / "runs").glob("*/*/metrics.jsonl"))) == 2
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    deadline = time.time() + 30
    alive = True
    while alive and time.time() < deadline:
        try:
            os.killpg(process.pid, 0)  # anything left of the sweep's process group?
            time.sleep(0.5)
        except ProcessLookupError:
            alive = False
    if alive:
        os.killpg(process.pid, signal.SIGKILL)
    assert not alive, "the sweep's workers outlived it"
    sizes = [p.stat().st_size for p in (tmp_path / "runs").glob("*/*/metrics.jsonl")]
    time.sleep(2)
    assert sizes == [p.stat().st_size for p in (tmp_path / "runs").glob("*/*/metrics.jsonl")]
