"""`vse evaluate`'s modes as library calls (pipeline.evaluation.command, pipeline.reports.runs_command):
what the CLI prints is what they render."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import cli
from pipeline.evaluation.command import Evaluation, evaluate_embeddings_file
from pipeline.evaluation.evaluate import format_table, json_metrics
from pipeline.evaluation.metrics import evaluate_embeddings, hubness_metrics
from pipeline.reports.runs_command import NoRunFolders, evaluate_run_folders


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "emb.npz"
    np.savez(path, images=rng.standard_normal((10, 6)), captions=rng.standard_normal((50, 6)))
    return path


def test_the_npz_mode_renders_what_the_cli_prints(npz):
    notes = []
    evaluation = evaluate_embeddings_file(npz, "single", None, echo=notes.append)
    with np.load(npz) as f:  # the protocol's metrics and each direction's hubness of the same scores
        expected = {**evaluate_embeddings(f["images"], f["captions"]),
                    **hubness_metrics(f["images"] @ f["captions"].T)}
        assert set(expected) >= {"i2t_hubness", "t2i_hubness"}
        assert evaluation.metrics == pytest.approx(expected, abs=1e-6)  # hubness: a float32 product
    assert evaluation.title == f"{npz} (single)" and notes == []
    assert evaluation.render(as_json=True) == json.dumps(json_metrics(evaluation.metrics))
    assert evaluation.render() == format_table(evaluation.metrics, evaluation.title)
    for as_json in (False, True):
        printed = CliRunner().invoke(cli, ["evaluate", "--embeddings", str(npz), "--device", "cpu",
                                           *(["--json"] if as_json else [])])
        assert printed.exit_code == 0 and printed.stdout == evaluation.render(as_json) + "\n"


def test_extra_json_items_and_a_footer_follow_the_metrics():
    rng = np.random.default_rng(1)
    metrics = evaluate_embeddings(rng.standard_normal((4, 3)), rng.standard_normal((20, 3)))
    evaluation = Evaluation(metrics, "t", json_extra={"pairs": 4}, footer="scored 4 pairs")
    assert json.loads(evaluation.render(True)) == {**json_metrics(metrics), "pairs": 4}
    assert evaluation.render().endswith("\nscored 4 pairs")


def test_no_run_folder_is_a_usage_error(tmp_path):
    with pytest.raises(NoRunFolders, match="no run folders match"):
        evaluate_run_folders([str(tmp_path / "none" / "*")], None)
    result = CliRunner().invoke(cli, ["evaluate", "--runs", str(tmp_path / "none" / "*"), "--device", "cpu"])
    assert result.exit_code == 2 and "Error: no run folders match" in result.output
