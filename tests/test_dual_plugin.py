"""A user's dual network (examples/mean_words_dual.py, one file): `vse check-network` passes it, `vse
train --network FILE.py:Class` trains it on the tiny cache of real demo captions, `vse evaluate` gives
finite recalls on its checkpoint; a broken copy is refused (one line, or the check that fails)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUIET, TINY_TRAIN, vse

from pipeline.core.config import TrainConfig
from pipeline.core.registry import NETWORKS
from pipeline.networks.network_check import run_network_contract

EXAMPLE = "examples/mean_words_dual.py:MeanWordsDual"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("words", [False, True])
def test_the_example_keeps_the_dual_contract(words):
    results = run_network_contract(EXAMPLE, words=words, timing=False)
    assert len(results) == 6 and all(r.ok for r in results), [(r.check, r.detail) for r in results]
    assert results[0].check == "embeddings (B, E) of both sides, finite"
    result = vse("check-network", ROOT / "examples" / "mean_words_dual.py:MeanWordsDual", "--words")
    assert result.exit_code == 0 and "FAIL" not in result.output, result.output


def test_its_declaration_makes_it_dual():
    config = TrainConfig(features="f.h5", network=EXAMPLE)
    assert not config.pairwise and NETWORKS.spec(EXAMPLE).kind == "dual"
    config.check()  # a dual network of its own layers: no head options given, nothing refused
    with pytest.raises(Exception, match="--image-pool: not for --network .* encodes cached images"):
        TrainConfig(features="f.h5", network=EXAMPLE, image_pool="gpo").check()


@pytest.fixture(scope="module")
def dual_run(tiny_cache, tmp_path_factory) -> Path:
    from pipeline.training.build import build_trainer

    run = tmp_path_factory.mktemp("dual") / "run"
    config = TrainConfig(features=str(tiny_cache), run_dir=str(run), network=EXAMPLE, loss="mh",
                         **{**TINY_TRAIN, "epochs": 2, "val_every": 0})
    trainer = build_trainer(config, **QUIET)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.fit()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    return run


def test_it_trains_and_evaluates(dual_run, tiny_cache):
    records = [json.loads(line) for line in (dual_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and all(np.isfinite(r["rsum"]) for r in records)
    state = torch.load(dual_run / "best.pt", weights_only=True)
    # a plug-in is recorded by its absolute file (resume works from any folder: core.code_identity)
    file, _, name = EXAMPLE.rpartition(":")
    assert state["model_config"]["network"] == f"{Path(file).resolve()}:{name}"
    assert state["model_config"]["set_size"] == 0
    evaluated = vse("evaluate", "--checkpoint", dual_run / "best.pt", "--features", tiny_cache, "--split",
                    "test", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads(evaluated.stdout)
    recalls = [metrics[k] for k in metrics if k.startswith(("i2t_r", "t2i_r")) and k[5:].isdigit()]
    assert len(recalls) >= 6 and all(np.isfinite(r) and 0 <= r <= 100 for r in recalls), metrics
    assert 0 <= metrics["rsum"] <= 600 and np.isfinite(metrics["rsum"])


def test_search_refuses_its_checkpoint_naming_what_reads_it(dual_run, tmp_path):
    """vse embed reads VSE's own models only: a dual plug-in's checkpoint is refused in one line
    that says so (not that it scores pairs jointly), and nothing is written."""
    captions = tmp_path / "captions.txt"
    captions.write_text("a dog runs\n", encoding="utf-8")
    result = vse("embed", dual_run / "best.pt", "--captions", captions, "--out", tmp_path / "e.h5")
    assert result.exit_code == 1
    assert "is a dual network of your own" in result.output and "jointly" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "e.h5").exists()


BROKEN = '''
import torch
from torch import nn
from pipeline.networks.network import DualNetwork


class NoTextEncoder(DualNetwork):
    def __init__(self, config):
        super().__init__(config)
        self.image_encoder = nn.Linear(config.feature_dim, config.embed_dim)


class ReadsPadding(NoTextEncoder):
    """The mean over every token position, padding included."""

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size or 2, config.word_dim)
        self.text_encoder = _Mean(self.embed, config)


class _Mean(nn.Module):
    def __init__(self, embed, config):
        super().__init__()
        self.embed, self.fc = embed, nn.Linear(config.text_dim, config.embed_dim) if config.text_dim else None

    def forward(self, captions, lengths):
        words = self.embed(captions) if self.fc is None else self.fc(captions)
        return words.mean(1)


class OneSide(ReadsPadding):
    def forward(self, images, *captions):
        return self.image_encoder(images)
'''


def test_a_broken_copy_is_refused(tmp_path, tiny_cache):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN)
    result = vse("check-network", f"{path}:NoTextEncoder")
    assert result.exit_code == 1 and "has no text_encoder" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    reads = {r.check: r.ok for r in run_network_contract(f"{path}:ReadsPadding", timing=False)}
    assert reads["padding never read"] is False and reads["a batch's rows = each item embedded alone"]
    result = vse("check-network", f"{path}:ReadsPadding")
    assert result.exit_code == 1 and "FAIL" in result.output
    one_side = {r.check: r.ok for r in run_network_contract(f"{path}:OneSide", timing=False)}
    assert one_side["embeddings (B, E) of both sides, finite"] is False
    result = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "r", "--network",
                 f"{path}:OneSide", "--epochs", 1, "--min-word-count", 1, "--workers", 0, "--device", "cpu",
                 "--val-every", 0)
    assert result.exit_code == 1 and "forward(images, *captions) must give" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
