"""A run whose epochs end before its loss's method begins (issue 49): each loss with a phase says
when its method starts (``starts()``), and one check (``training.settings.unreached_phases``)
compares it with the run's epochs: `vse train` says so in one line, `vse sweep` names each such run,
`vse tune` refuses a search whose trials would be such runs, `vse report` marks such a row and
`vse compare` names such a run."""

from __future__ import annotations

import pytest
import yaml
from conftest import TINY_TRAIN, train_run, vse

from pipeline.losses.plugins import loss_traits, make_loss
from pipeline.training.settings import unreached_phases

HARDEST = "the hardest negative (after warmup_epochs {} of summed hinges)"
DIVISION = "the division into clean and noisy pairs (after warmup_epochs {})"
CO_DIVIDE = "the co-divide and co-rectify (after warmup_epochs {})"
KL = "the KL term (annealed over anneal_epochs {}, 0 in epoch 1)"


@pytest.mark.parametrize("loss, options, starts", [
    ("mh", {}, {}),
    ("mh", {"warmup_epochs": 2}, {HARDEST.format(2): 2}),
    ("lseh", {"warmup_epochs": 1}, {HARDEST.format(1): 1}),
    ("decl", {}, {DIVISION.format(5): 5}),                    # its default warm-up: 5 epochs
    ("decl", {"warmup_epochs": 0, "anneal_epochs": 3}, {KL.format(3): 1}),
    ("decl", {"warmup_epochs": 0, "anneal_epochs": 3, "kl_weight": 0.0}, {}),
    ("ncr", {}, {CO_DIVIDE.format(1): 1}),
    ("ncr", {"warmup_epochs": 0, "schedule": "joint"}, {}),
    ("rcl", {}, {}),
    ("infonce", {}, {}),
])
def test_each_loss_with_a_phase_declares_when_its_method_begins(loss, options, starts):
    assert dict(loss_traits(make_loss(loss, options), loss).starts) == starts


def test_the_check_names_each_part_the_run_misses():
    starts = ((DIVISION.format(5), 5), (KL.format(3), 1))
    assert unreached_phases("decl", starts, 6) is None
    assert unreached_phases("decl", starts, 2) == (
        f"loss decl: {DIVISION.format(5)} would begin in epoch 6, after the run's 2 epoch(s): the run "
        "trains without it under decl's name")
    assert unreached_phases("decl", starts, 1).count("would begin") == 2


@pytest.mark.parametrize("loss, options, epochs, said", [
    ("mh", ("--warmup-epochs", 1), 1,
     HARDEST.format(1) + " would begin in epoch 2, after the run's 1 epoch(s)"),
    ("decl", (), 2, DIVISION.format(5) + " would begin in epoch 6, after the run's 2 epoch(s)"),
    ("ncr", (), 1, CO_DIVIDE.format(1) + " would begin in epoch 2, after the run's 1 epoch(s)"),
    ("mh", ("--warmup-epochs", 1), 2, None),
])
def test_a_run_whose_method_never_begins_says_so_in_one_line(tiny_cache, tmp_path, loss, options, epochs,
                                                             said):
    result = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "run", "--loss", loss, *options,
                 "--epochs", epochs, "--embed-dim", 8, "--word-dim", 8, "--batch-size", 16,
                 "--min-word-count", 1, "--val-every", 0, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if "would begin in epoch" in line]
    if said is None:
        assert warned == []
    else:
        assert warned == [f"warning: loss {loss}: {said}: the run trains without it under {loss}'s name"]


def test_a_sweep_names_each_run_whose_method_never_begins(tiny_cache, tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({
        "runs_dir": str(tmp_path / "runs"),
        "base": {"features": str(tiny_cache), "loss": "mh", "loss_options": {"warmup_epochs": 1},
                 **TINY_TRAIN},
        "grid": {"epochs": [1, 2]}}))
    result = vse("sweep", path, "--dry-run")
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warned == [f"warning: epochs=1: loss mh: {HARDEST.format(1)} would begin in epoch 2, after the "
                      "run's 1 epoch(s): the run trains without it under mh's name"]


@pytest.mark.parametrize("base, search, key", [
    ({"loss": "mh"}, {"loss_options.warmup_epochs": {"int": [0, 2]}},
     "search: loss_options.warmup_epochs: 2 makes a trial of 2 epoch(s) miss its method: loss mh: "
     + HARDEST.format(2) + " would begin in epoch 3"),
    ({"loss": "mh"}, {"loss_options.warmup_epochs": {"choice": [1, 3]}},
     "search: loss_options.warmup_epochs: 3 makes a trial of 2 epoch(s) miss its method"),
    ({"loss": "decl"}, {"loss_options.margin": {"uniform": [0.1, 0.3]}},  # decl's own 5-epoch warm-up
     "base: (with the search's low ends, loss_options.margin 0.1) every trial of 2 epoch(s) would miss its "
     f"method: loss decl: {DIVISION.format(5)}"),
])
def test_a_tune_whose_trials_would_miss_the_method_is_refused(tiny_cache, tmp_path, base, search, key):
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({"runs_dir": str(tmp_path / "runs"),
                                    "base": {"features": str(tiny_cache), **TINY_TRAIN, **base},
                                    "search": search}))
    result = vse("tune", path, "--budget", "3x2")
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}: {key}"), lines[0]
    assert not (tmp_path / "runs").exists()  # refused before any study or trial


@pytest.fixture(scope="module")
def warm_and_hard(tiny_cache, tmp_path_factory):
    """Two mh runs of one epoch: "warm" sums its hinges throughout (warmup_epochs 1), "hard" is mh."""
    runs = tmp_path_factory.mktemp("schedules") / "runs"
    train_run(tiny_cache, runs / "warm", loss="mh", epochs=1, loss_options={"warmup_epochs": 1})
    train_run(tiny_cache, runs / "hard", loss="mh", epochs=1)
    return runs


def test_a_report_marks_a_row_whose_method_never_began(warm_and_hard, tmp_path):
    runs = warm_and_hard
    out = tmp_path / "results.csv"
    evaluated = vse("evaluate", "--runs", f"{runs}/*", "--split", "test", "--out", out)
    assert evaluated.exit_code == 0, evaluated.output
    result = vse("report", out, "--format", "md", "--columns", "recall")
    assert result.exit_code == 0, result.output
    rows = {line.split("|")[1].strip(): line for line in result.output.splitlines() if line.startswith("| ")}
    marked = [label for label in rows if "method never began" in label]
    # 8 test images: both rows are also at chance (evaluation.chance), a mark of its own after this one
    unmarked = [label.split(" (at chance")[0] for label in marked]
    assert unmarked == ["warm (its method never began: see below)"], result.output
    assert (f"warm: loss mh: {HARDEST.format(1)} would begin in epoch 2, after the run's 1 epoch(s)"
            in result.output)


def test_a_comparison_names_a_run_whose_method_never_began(warm_and_hard):
    result = vse("compare", warm_and_hard / "hard", warm_and_hard / "warm", "--split", "test",
                 "--permutations", 100)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == (f"B: loss mh: {HARDEST.format(1)} would begin in epoch 2, after the run's "
                         "1 epoch(s): the run trains without it under mh's name")
    assert not any(line.startswith("A: ") for line in lines)
