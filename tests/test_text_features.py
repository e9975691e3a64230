"""Cached caption features: `vse encode-text` (minilm, cbow; resumable), and training,
evaluation and resume with --text-features (a head over frozen caption vectors)."""

import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import QUIET, TINY_TRAIN, demo_captions, learnable_features, write_feature_cache

from cli.main import cli
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache
from pipeline.data.caption_features import CaptionFeatures, encode_text, parts_dir
from pipeline.data.caption_index import caption_fingerprint
from pipeline.losses.base import LOSS_NAMES
from pipeline.networks.vse_model import VectorTextEncoder
from pipeline.training.build import build_trainer
from pipeline.training.trainer import Trainer


@pytest.fixture(scope="session")
def tiny_text(tiny_cache, tmp_path_factory):
    """CBoW caption features of the tiny cache's 200 captions."""
    out = tmp_path_factory.mktemp("text") / "tiny_text.h5"
    encode_text(tiny_cache, "cbow", out, device="cpu")
    return out


@pytest.fixture(scope="session")
def tiny_relevance(tiny_cache, tmp_path_factory):
    from pipeline.relevance import build_relevance

    out = tmp_path_factory.mktemp("relevance") / "cbow.h5"
    build_relevance(tiny_cache, "cbow", out, device="cpu")
    return out


def _config(tiny_cache, tiny_text, run_dir, **overrides):
    return TrainConfig(features=str(tiny_cache), text_features=str(tiny_text), run_dir=str(run_dir),
                       **{**TINY_TRAIN, **overrides})


# ------------------------------------------------------------------------------ encode-text


def test_encode_text_cbow_gives_the_relevance_vectors_in_cache_order(tiny_cache, tiny_text):
    from pipeline.relevance import compute_relevance_vectors

    with FeatureCache(tiny_cache) as cache:
        captions = cache.captions
    file = CaptionFeatures(tiny_text)
    assert file.caption_fingerprint == caption_fingerprint(captions)
    assert file.model == "cbow" and file.model_identity["word_vectors"]
    relevance, _ = compute_relevance_vectors(captions, np.arange(len(captions)), "cbow")
    assert np.array_equal(file.vectors(), relevance.vectors)  # one encoding module for both commands
    assert file.vectors().shape == (200, 50)
    assert not parts_dir(tiny_text).exists()  # parts go once the combined file is written


def test_encode_text_resumes_a_killed_run_reusing_its_parts(tiny_cache, tiny_text, tmp_path, monkeypatch):
    from pipeline.text import encoders

    out = tmp_path / "text.h5"
    real, calls = encoders.encode_captions, []

    def dies_on_third_part(captions, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # as if the process died here
        calls.append(len(captions))
        return real(captions, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(encoders, "encode_captions", dies_on_third_part)
        with pytest.raises(KeyboardInterrupt):
            encode_text(tiny_cache, "cbow", out, part_size=64)
    assert not out.exists() and len(list(parts_dir(out).glob("part-*.h5"))) == 2
    result = encode_text(tiny_cache, "cbow", out, part_size=64)
    assert (result.parts, result.parts_computed) == (4, 2)  # 200 captions: 64+64 reused, 64+8 computed
    assert np.array_equal(CaptionFeatures(out).vectors(), CaptionFeatures(tiny_text).vectors())
    again = encode_text(tiny_cache, "cbow", out, part_size=64)
    assert again.up_to_date and again.parts_computed == 0


def test_encode_text_minilm_on_a_few_captions(tmp_path):
    ids, captions = demo_captions(3)
    cache = write_feature_cache(tmp_path / "c.h5", np.zeros((3, 4)), captions, np.repeat(np.arange(3), 5),
                                {"test": np.arange(3)}, image_ids=ids)
    out = tmp_path / "minilm.h5"
    result = CliRunner().invoke(cli, ["encode-text", "--features", str(cache), "--model", "minilm",
                                      "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "15 captions x 384 (minilm" in result.output
    file = CaptionFeatures(out)
    vectors = file.vectors()
    assert vectors.shape == (15, 384) and file.caption_fingerprint == caption_fingerprint(captions)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert file.model_identity["model"].endswith("all-MiniLM-L6-v2")
    cos = vectors @ vectors.T  # captions of one image are closer than captions of two (5 each)
    same = np.kron(np.eye(3), np.ones((5, 5))).astype(bool) & ~np.eye(15, dtype=bool)
    assert cos[same].mean() > cos[~np.kron(np.eye(3), np.ones((5, 5))).astype(bool)].mean() + 0.1


def test_encode_text_never_overwrites_a_file_it_did_not_make(tiny_cache, tmp_path):
    out = tmp_path / "precious.h5"
    out.write_bytes(b"not ours")
    result = CliRunner().invoke(cli, ["encode-text", "--features", str(tiny_cache), "--model", "cbow",
                                      "--out", str(out)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "refusing to overwrite" in result.output and out.read_bytes() == b"not ours"


# ------------------------------------------------------------------------------ training


def test_text_features_train_learn_and_evaluate(tiny_cache, tiny_text, tmp_path):
    cfg = _config(tiny_cache, tiny_text, tmp_path / "run", loss="sh", epochs=6, lr_decay_epoch=5,
                  val_split="train")
    trainer = build_trainer(cfg, **QUIET)
    assert isinstance(trainer.model.text_encoder, VectorTextEncoder) and trainer.vocab is None
    assert isinstance(trainer.source.inputs._array, np.ndarray)  # image features preloaded too
    summary = trainer.fit()
    assert summary["best_rsum"] > 300  # 24 training images; chance R@1 is about 4
    state = load_checkpoint(tmp_path / "run" / "best.pt")
    entry = state["text_features"]
    assert entry["path"] == str(tiny_text) and entry["model"] == "cbow" and state["vocab"] == []
    assert entry["caption_fingerprint"] == CaptionFeatures(tiny_text).caption_fingerprint
    assert not (tmp_path / "run" / "vocab.json").exists()

    runner = CliRunner()
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "run" / "best.pt"),
                                 "--features", str(tiny_cache), "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rsum"] == pytest.approx(summary["best_rsum"], abs=1e-3)
    result = runner.invoke(cli, ["evaluate", "--runs", str(tmp_path / "run"), "--split", "train"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("projection", ["linear", "mlp"])
def test_resume_with_text_features_gives_the_same_weights(tiny_cache, tiny_text, tmp_path, monkeypatch,
                                                          projection):
    opts = dict(loss="mh", epochs=3, lr_decay_epoch=2, val_every=3, text_projection=projection)
    build_trainer(_config(tiny_cache, tiny_text, tmp_path / "full", **opts), **QUIET).fit()
    original, calls = Trainer.step, {"n": 0}

    def step(self, batch):
        if calls["n"] == 13:
            raise KeyboardInterrupt  # dies one step after the checkpoint at iteration 12
        calls["n"] += 1
        return original(self, batch)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "step", step)
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_config(tiny_cache, tiny_text, tmp_path / "cut", **opts), **QUIET).fit()
    build_trainer(_config(tiny_cache, tiny_text, tmp_path / "cut", **opts), resume=True, **QUIET).fit()
    full, cut = (load_checkpoint(tmp_path / r / "last.pt") for r in ("full", "cut"))
    assert cut["iteration"] == full["iteration"] == 24
    assert full["model_config"]["text_projection"] == projection
    for key, value in full["model"].items():
        assert torch.equal(value, cut["model"][key]), key

    with pytest.raises(VseError, match="may not change text_features"):
        build_trainer(TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "cut"),
                            **{**TINY_TRAIN, **opts}), resume=True)


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_every_loss_trains_a_step_on_text_features(tiny_cache, tiny_text, tiny_relevance, tmp_path, loss):
    trainer = build_trainer(_config(tiny_cache, tiny_text, tmp_path / loss, loss=loss,
                              relevance=str(tiny_relevance),
                              epochs=1), **QUIET)
    networks = getattr(trainer.model, "members", [trainer.model])  # ncr: two networks co-trained
    before = [{k: v.clone() for k, v in net.text_encoder.state_dict().items()} for net in networks]
    batch = trainer.epoch_batches(0)[0]
    assert isinstance(batch.captions, tuple) and batch.captions[0].shape == (16, 50)
    assert np.isfinite(trainer.step(batch))
    for net, old in zip(networks, before):  # every network's caption head moved
        after = net.text_encoder.state_dict()
        assert any(not torch.equal(old[k], after[k]) for k in old)


# ------------------------------------------------------------------------------ refusals


def _other_model_file(tiny_text, path):
    """The same vectors, said to come from another model: what a checkpoint must refuse."""
    path.write_bytes(tiny_text.read_bytes())
    with h5py.File(path, "r+") as f:
        identity = json.loads(f.attrs["model_identity"])
        other = {**identity, "word_vectors": "glove.840B.300d"}
        f.attrs["model_identity"] = json.dumps(other, sort_keys=True)
    return path


def test_caption_features_of_other_captions_or_model_are_refused_in_one_line(tiny_cache, tiny_text, tmp_path):
    build_trainer(_config(tiny_cache, tiny_text, tmp_path / "run", loss="sh", epochs=1), **QUIET).fit()
    best = str(tmp_path / "run" / "best.pt")
    runner = CliRunner()

    other = _other_model_file(tiny_text, tmp_path / "other_model.h5")
    result = runner.invoke(cli, ["evaluate", "--checkpoint", best, "--features", str(tiny_cache),
                                 "--text-features", str(other)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "word_vectors differ" in result.output and "was trained on 'cbow'" in result.output

    ids, captions = demo_captions(40)
    shuffled = write_feature_cache(tmp_path / "shuffled.h5", learnable_features(captions, np.repeat(
        np.arange(40), 5), 40), captions[5:] + captions[:5], np.repeat(np.arange(40), 5),
        {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}, image_ids=ids)
    result = runner.invoke(cli, ["evaluate", "--checkpoint", best, "--features", str(shuffled)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "made for other captions" in result.output
    result = runner.invoke(cli, ["train", "--features", str(shuffled), "--text-features", str(tiny_text),
                                 "--run-dir", str(tmp_path / "r2"), "--epochs", "1"])
    assert result.exit_code == 1 and "made for other captions" in result.output

    with pytest.raises(VseError, match="may not change text_features"):  # another model's vectors
        build_trainer(_config(tiny_cache, other, tmp_path / "run", loss="sh", epochs=2), resume=True)
    with pytest.raises(VseError, match="no GRU"):
        _config(tiny_cache, tiny_text, tmp_path / "g", glove=True).check()


def test_cli_train_with_text_features_and_mlp_head(tiny_cache, tiny_text, tmp_path):
    run = tmp_path / "run"
    result = CliRunner().invoke(cli, ["train", "--features", str(tiny_cache),
                                      "--text-features", str(tiny_text),
                                      "--text-projection", "mlp", "--run-dir", str(run), "--epochs", "1",
                                      "--embed-dim", "16", "--batch-size", "16", "--val-every", "0"])
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "config.json").read_text())
    assert saved["text_features"] == str(tiny_text) and saved["text_projection"] == "mlp"
    config = load_checkpoint(run / "best.pt")["model_config"]
    assert config["text_dim"] == 50 and config["text_projection"] == "mlp"


def test_sweep_evaluate_runs_report_plot_gallery_on_text_features(tiny_cache, tiny_text, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"runs_dir: {tmp_path / 'runs'}\nbase:\n  features: {tiny_cache}\n"
                    f"  text_features: {tiny_text}\n  embed_dim: 16\n  batch_size: 16\n  lr: 0.005\n"
                    "  workers: 0\n  epochs: 1\n  val_every: 0\n"
                    "grid:\n  loss: [sh, mh]\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["sweep", str(grid)])
    assert result.exit_code == 0, result.output
    runs = tmp_path / "runs" / "grid"
    results = tmp_path / "results.csv"
    result = runner.invoke(cli, ["evaluate", "--runs", str(runs / "*"), "--out", str(results)])
    assert result.exit_code == 0, result.output
    assert "2 of 2 runs evaluated" in result.output
    gallery = ["gallery", "--checkpoint", str(runs / "loss=mh" / "best.pt"), "--features", str(tiny_cache),
               "--n", "3", "--out", str(tmp_path / "g.html")]
    plot = ["plot", "--results", str(results), "--out", str(tmp_path / "p")]
    for command in (["report", str(results)], plot, gallery):
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, (command[0], result.output)
    assert (tmp_path / "g.html").stat().st_size > 0
