"""Precision is part of the protocol (issue 53): each run records what each part computed in, the
defaults follow the measured rule, and reports, comparisons and claims never set runs of different
precision side by side silently."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core import precision
from pipeline.core.config import TrainConfig
from pipeline.core.runtime import EMULATED_BF16_ENV
from pipeline.reports.report import format_results, seed_groups
from tests.conftest import train_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


# ---------------------------------------------------------------------------- the record
def test_labels_name_each_part():
    assert precision.of_step(None, "cpu").label == "fp32/fp32/fp32"
    assert precision.of_step(torch.bfloat16, "cpu").label == "bf16/fp32/fp32"
    assert precision.of_step(torch.float16, "cuda", tf32=False).label == "fp16/fp32/fp32"
    assert precision.of_step(None, "cuda", tf32=True).label == "fp32+tf32/fp32/fp32"
    assert precision.of_step(None, "cpu", tf32=True).label == "fp32/fp32/fp32"  # TF32 is a GPU's
    assert precision.label_of({}) == precision.UNRECORDED
    assert precision.label_of({"precision": precision.of_step(None, "cpu").as_dict()}) == "fp32/fp32/fp32"


def test_mixed_names_the_runs_of_each_precision():
    assert precision.mixed({"a": "fp32/fp32/fp32", "b": "fp32/fp32/fp32"}) is None
    line = precision.mixed({"runs/a": "fp32/fp32/fp32", "runs/b": "bf16/fp32/fp32"})
    assert "bf16/fp32/fp32: runs/b" in line and "fp32/fp32/fp32: runs/a" in line and "\n" not in line


# ---------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("network, dual", [("vse++", True), ("saf", False), ("sgr", False)])
def test_gpu_autocast_default_follows_the_measured_rule(network, dual, tiny_cache):
    config = TrainConfig(features=str(tiny_cache), network=network)
    assert config.amp is dual  # the pairwise networks train in fp32 on a GPU unless asked
    assert TrainConfig(features=str(tiny_cache), network=network, amp=True).amp is True
    assert TrainConfig.from_dict({"features": str(tiny_cache), "network": network}).to_dict()["amp"] is dual


def test_cpu_bf16_is_never_a_default(tiny_cache, monkeypatch):
    from pipeline.core import cpuinfo

    monkeypatch.setattr(cpuinfo, "cpu_native_bf16", lambda: True)  # a CPU with native bf16: still fp32
    for network in ("vse++", "saf"):
        config = TrainConfig(features=str(tiny_cache), text_features=str(tiny_cache), network=network)
        assert config.cpu_amp is False


def test_old_configs_without_amp_read_as_before(tiny_cache):
    from pipeline.core.config import with_old_defaults

    assert with_old_defaults({"features": str(tiny_cache)})["amp"] is True


# ---------------------------------------------------------------------------- runs record it
@pytest.fixture(scope="module")
def fp32_and_bf16_runs(tiny_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("precision") / "runs"
    train_run(tiny_cache, root / "fp32", loss="mh", epochs=1, cpu_amp=False)
    with pytest.MonkeyPatch.context() as patch:  # bf16 on any CPU: emulated where it is not native
        patch.setenv(EMULATED_BF16_ENV, "1")
        train_run(tiny_cache, root / "bf16", loss="mh", epochs=1, cpu_amp=True)
    return root


def test_checkpoints_record_each_part(fp32_and_bf16_runs):
    for name, network in (("fp32", "fp32"), ("bf16", "bf16")):
        state = torch.load(fp32_and_bf16_runs / name / "last.pt", weights_only=True, map_location="cpu")
        assert state["precision"] == {"network": network, "loss": "fp32", "evaluation": "fp32",
                                      "label": f"{network}/fp32/fp32"}


def test_results_rows_carry_it_and_the_table_shows_a_mix(fp32_and_bf16_runs, tmp_path):
    from tests.conftest import vse

    out = tmp_path / "results.csv"
    result = vse("evaluate", "--runs", f"{fp32_and_bf16_runs}/*", "--split", "test", "--out", out)
    assert result.exit_code == 0, result.output
    from pipeline.reports.report import read_results

    rows = {Path(r["run"]).name: r for r in read_results(out)}
    assert rows["fp32"]["precision"] == "fp32/fp32/fp32" and rows["bf16"]["precision"] == "bf16/fp32/fp32"
    table = format_results(list(rows.values()))
    assert "(bf16/fp32/fp32)" in table and "(fp32/fp32/fp32)" in table and "rows differ in it" in table
    one = format_results([rows["fp32"]])
    assert "fp32/fp32" not in one and "differ" not in one


def test_seed_groups_never_merge_precisions():
    rows = [{"run": "a/seed=0", "config_id": "x", "precision": "fp32/fp32/fp32", "rsum": 1.0},
            {"run": "a/seed=1", "config_id": "x", "precision": "bf16/fp32/fp32", "rsum": 2.0},
            {"run": "a/seed=2", "config_id": "x", "precision": "fp32/fp32/fp32", "rsum": 3.0}]
    assert [g.n for g in seed_groups(rows)] == [2, 1]


def test_compare_refuses_two_precisions(fp32_and_bf16_runs, monkeypatch):
    from pipeline.reports.batch_eval import RunEvaluator
    from tests.conftest import vse

    embedded = []
    real_embed = RunEvaluator.embed
    monkeypatch.setattr(RunEvaluator, "embed",
                        lambda self, *a, **k: embedded.append(a) or real_embed(self, *a, **k))
    result = vse("compare", fp32_and_bf16_runs / "fp32", fp32_and_bf16_runs / "bf16", "--permutations", 100)
    assert embedded == []  # refused from the checkpoints' records, before either run was embedded
    assert result.exit_code == 1
    line = result.output.strip().splitlines()[-1]
    assert "different precision" in line and "bf16/fp32/fp32" in line and "--across-precision" in line
    import pipeline.evaluation.inference as inference
    import pipeline.reports.compare as compare

    reads = []
    real_load = compare.load_checkpoint
    monkeypatch.setattr(compare, "load_checkpoint",
                        lambda path: reads.append(Path(path).parent.name) or real_load(path))
    monkeypatch.setattr(inference, "load_checkpoint", lambda *a, **k: pytest.fail("a checkpoint read twice"))
    allowed = vse("compare", fp32_and_bf16_runs / "fp32", fp32_and_bf16_runs / "bf16", "--permutations", 100,
                  "--across-precision", "--json")
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(allowed.output)["precision"] == ["fp32/fp32/fp32", "bf16/fp32/fp32"]
    assert reads == ["fp32", "bf16"]  # each checkpoint read once, its model built from that state


def test_claims_refuse_two_precisions():
    from pipeline.reports.claims import Claim, claim_groups, verdicts

    def group_rows(precision_label, values):
        return [{"run": f"x/seed={i}", "config_id": precision_label, "loss": "mh", "rsum": v,
                 "precision": precision_label} for i, v in enumerate(values)]

    rows = group_rows("fp32/fp32/fp32", [1.0, 2.0, 3.0]) + [
        {**r, "loss": "lseh", "run": f"y/seed={i}", "config_id": "y"}
        for i, r in enumerate(group_rows("bf16/fp32/fp32", [5.0, 6.0, 7.0]))]
    claims = [Claim("lseh beats mh", "LSEH", "lseh", "mh", "rsum")]
    verdict = verdicts(claim_groups(rows), claims)[0]
    assert verdict["verdict"].startswith("not compared: runs of different precision")
    same = [{**r, "precision": "fp32/fp32/fp32"} for r in rows]
    verdict = verdicts(claim_groups(same), claims)[0]
    assert verdict["verdict"] == "holds" and verdict["precision"] == "fp32/fp32/fp32"
