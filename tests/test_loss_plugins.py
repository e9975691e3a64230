"""Losses as plug-ins: the registry, the loss contract (`vse check-loss`) on every built-in
loss and on the example plug-in, `vse train --loss FILE.py:Class`, one-line errors, and
evaluation of such a run without the loss."""

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_TRAIN

from cli.main import cli
from pipeline.core import registry
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.core.similarity import SIMILARITIES
from pipeline.losses.base import LOSS_NAMES, VseLoss
from pipeline.losses.check import run_contract
from pipeline.losses.plugins import loss_traits, make_loss
from pipeline.training.build import build_trainer

LOSSES = registry.LOSSES.resolved()  # name → class, the built-in losses

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/infonce_learnable_tau.py:LearnableTemperatureInfoNCE"

@pytest.fixture(autouse=True)
def _at_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the example's import path is relative to the repository


def test_the_registry_declares_what_each_loss_is():
    assert LOSS_NAMES == tuple(LOSSES) and len(LOSS_NAMES) == 19
    for name, cls in LOSSES.items():
        assert cls.name == name and issubclass(cls, VseLoss)
        assert cls.similarity in SIMILARITIES
    traits = {name: loss_traits(make_loss(name)) for name in LOSS_NAMES}
    assert {n for n, t in traits.items() if t.uses_relevance} == {"lseh", "ladder"}
    assert {n for n, t in traits.items() if t.similarity != "cosine"} == {"order", "pcme", "pcmepp"}
    assert {n for n, t in traits.items() if t.collapse_value(16)} == {"mh", "lseh", "selhn"}
    assert traits["mh"].collapse_value(16) == pytest.approx(2 * 16 * 0.2)
    assert {n for n, t in traits.items() if t.networks > 1} == {"ncr", "bicro"}
    assert {n for n, t in traits.items() if t.sample_pass} == {"ncr", "decl", "bicro"}
    assert {n for n, t in traits.items() if t.takes_sample_ids} == {"rcl", "decl", "ncr", "crcl", "bicro"}
    assert loss_traits(make_loss("order", {"squared": False})).similarity == "order-norm"


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_built_in_loss_keeps_the_contract(name):
    results = run_contract(name, distributed=False, timing=False)
    assert [r.check for r in results] == ["finite scalar", "float64 gradcheck",
                                          "same-image pairs never negatives",
                                          "invariant to permuting the batch"]
    same_image = results[2]
    # their authors mask only the diagonal, and so do the defaults
    if name in ("rcl", "decl", "ncr", "crcl", "bicro", "poly", "selhn", "pcme", "pcmepp"):
        assert same_image.ok is None and "not applicable" in same_image.detail
        results = [r for r in results if r is not same_image]
        masked = run_contract(name, {"mask_same_image": True}, distributed=False, timing=False)
        assert masked[2].ok, masked
    assert all(r.ok for r in results), results


def test_the_contract_catches_a_loss_that_pushes_same_image_pairs_apart():
    results = {r.check: r for r in run_contract("lseh", {"mask_same_image": False},
                                                distributed=False, timing=False)}
    assert results["same-image pairs never negatives"].ok is False
    assert results["invariant to permuting the batch"].ok is True


def test_the_example_plug_in_keeps_the_contract_under_gloo():
    results = run_contract(EXAMPLE)  # spawns the 2 gloo processes; times B = 128
    assert all(r.ok is not False for r in results), results
    assert results[4].check == "2 × 4-pair gloo processes = one 8 step" and results[4].ok
    assert results[5].ok is None and results[5].detail.endswith("ms (median of 10)")


def test_check_loss_command(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["check-loss", EXAMPLE, "--no-distributed"])
    assert result.exit_code == 0, result.output
    assert re.search(r"same-image pairs never negatives +ok", result.output)
    result = runner.invoke(cli, ["check-loss", "lseh", "--loss-option", "mask_same_image=false",
                                 "--no-distributed"])
    assert result.exit_code == 1 and "FAIL" in result.output
    result = runner.invoke(cli, ["check-loss", str(tmp_path / "nope.py") + ":Loss"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"error: {tmp_path / 'nope.py'}: no such loss file"]


@pytest.mark.parametrize("source, class_name, message", [
    (None, "Loss", "no such loss file"),
    ("import torch\n", "Loss", "has no 'Loss'"),
    ("class Loss:\n    pass\n", "Loss", "'Loss' is not a torch.nn.Module class"),
    ("def broken(:\n", "Loss", "cannot import (SyntaxError"),
    ("raise RuntimeError('no GPU here')\n", "Loss", "cannot import (RuntimeError: no GPU here)"),
])
def test_bad_plug_ins_are_refused_in_one_line_naming_the_file(tmp_path, source, class_name, message):
    path = tmp_path / "my_loss.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(VseError) as info:
        make_loss(f"{path}:{class_name}")
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_names_and_options_are_refused():
    with pytest.raises(VseError, match="unknown loss 'triplet' .built-in: sh, mh, order"):
        TrainConfig(features="x.h5", loss="triplet").check()
    with pytest.raises(VseError, match="cannot import module 'no_such_package.losses' .ModuleNotFoundError"):
        make_loss("no_such_package.losses:Loss")
    with pytest.raises(VseError, match="cannot build .* with options {'margin': 0.1}"):
        make_loss(EXAMPLE, {"margin": 0.1})
    with pytest.raises(VseError, match=r"loss mh has no option marg \(its options: mask_same_image, "):
        make_loss("mh", {"marg": 0.1})


def test_train_a_plug_in_then_evaluate_without_it(tiny_cache, tmp_path):
    plugin = tmp_path / "my_infonce.py"
    shutil.copy(ROOT / EXAMPLE.split(":")[0], plugin)
    spec = f"{plugin}:LearnableTemperatureInfoNCE"
    run = tmp_path / "run"
    runner = CliRunner()
    args = ["train", "--features", str(tiny_cache), "--run-dir", str(run), "--loss", spec,
            "--loss-option", "tau=0.1"]
    for key, value in {**TINY_TRAIN, "epochs": 1}.items():
        if key != "log_every":  # no such flag
            args += [f"--{key.replace('_', '-')}", str(value)]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    config = json.loads((run / "config.json").read_text())
    assert config["loss"] == spec and config["loss_options"] == {"tau": 0.1}
    state = load_checkpoint(run / "last.pt")
    # the temperature reached the optimizer: it moved from log(1 / 0.1)
    assert state["loss"]["log_scale"].item() != pytest.approx(math.log(10.0), abs=1e-6)
    plugin.unlink()  # evaluation needs the model only
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(run / "best.pt"), "--features",
                                 str(tiny_cache), "--split", "test", "--json"])
    assert result.exit_code == 0, result.output
    assert "rsum" in json.loads(result.output)


def test_the_loss_parameters_are_optimised_and_resumed(tiny_cache, tmp_path):
    config = TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "run"), loss=EXAMPLE,
                         epochs=1, **TINY_TRAIN)
    trainer = build_trainer(config, echo=lambda *a: None)
    scale = trainer.loss.log_scale
    assert any(q is scale for group in trainer.optimizer.param_groups for q in group["params"])
    trainer.fit()
    resumed = build_trainer(config, resume=True,
                                  echo=lambda *a: None)  # restored, nothing left to train
    assert resumed.loss.log_scale.item() == scale.item() != pytest.approx(math.log(1 / 0.07))


def test_order_code_form_is_carried_into_the_checkpoint_and_evaluation(tiny_cache, tmp_path):
    from pipeline.evaluation.evaluate import embed_checkpoint, evaluate_split_embeddings
    from pipeline.evaluation.metrics import evaluate_embeddings

    config = TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "run"), loss="order",
                         loss_options={"squared": False}, epochs=1, **TINY_TRAIN)
    build_trainer(config, echo=lambda *a: None).fit()
    state = load_checkpoint(tmp_path / "run" / "best.pt")
    assert state["model_config"]["similarity"] == "order-norm"
    emb = embed_checkpoint(tmp_path / "run" / "best.pt", tiny_cache, "test", torch.device("cpu"))
    assert emb.similarity == "order-norm" and (emb.images >= 0).all()
    assert evaluate_split_embeddings(emb) == evaluate_embeddings(emb.images, emb.captions,
                                                                 emb.caption_image, similarity="order-norm")


def test_the_docs_list_the_registry():
    protocol = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    section = protocol.split("## Losses", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^- `(\w+)`", section, flags=re.M) == list(LOSS_NAMES)
    architecture = " ".join((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").split())
    assert ", ".join(LOSS_NAMES) in architecture
