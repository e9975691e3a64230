import dataclasses
import json
import os
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import TINY_TRAIN, demo_captions, learnable_features, write_feature_cache

from cli.main import cli
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.training.build import build_trainer
from pipeline.training.trainer import Trainer


def _config(tiny_cache, run_dir, **overrides):
    return TrainConfig(features=str(tiny_cache), run_dir=str(run_dir), **{**TINY_TRAIN, **overrides})


def test_training_learns_and_writes_run_files(tiny_cache, tmp_path):
    # Validation on the 24 training images: this checks that the loop learns, in 48 steps.
    cfg = _config(tiny_cache, tmp_path / "run", loss="sh", epochs=6, lr_decay_epoch=5, val_split="train")
    summary = build_trainer(cfg, echo=lambda *a: None).fit()
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]
    best = max(records, key=lambda r: r["rsum"])
    assert summary["best_rsum"] == best["rsum"] and summary["best_epoch"] == best["epoch"]
    # chance R@1 on 24 images is about 4 in both directions
    assert best["i2t_r1"] > 50 and best["t2i_r1"] > 30 and best["rsum"] > records[0]["rsum"] + 150
    assert records[-1]["lr"] == pytest.approx(5e-4)  # decayed ×0.1 after epoch 5
    state = load_checkpoint(run / "best.pt")
    assert state["metrics"]["rsum"] == best["rsum"]
    assert json.loads((run / "config.json").read_text())["loss"] == "sh"
    assert json.loads((run / "vocab.json").read_text())["words"][:4] == ["<pad>", "<start>", "<end>", "<unk>"]


def _kill_after(monkeypatch, iterations):
    original = Trainer.step
    calls = {"n": 0}

    def step(self, batch):
        if calls["n"] == iterations:
            raise KeyboardInterrupt  # as if the process died here
        calls["n"] += 1
        return original(self, batch)

    monkeypatch.setattr(Trainer, "step", step)


@pytest.mark.parametrize("loss,extra", [("mh", {"loss_options": {"negative_set_size": 5}}), ("sh", {})])
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(tiny_cache, tmp_path, monkeypatch, loss,
                                                               extra):
    # 120 training captions / 16 = 8 batches per epoch; validation (and last.pt) every 3 iterations.
    opts = dict(loss=loss, epochs=3, lr_decay_epoch=2, val_every=3, **extra)
    build_trainer(_config(tiny_cache, tmp_path / "full", **opts), echo=lambda *a: None).fit()

    with monkeypatch.context() as m:
        _kill_after(m, 13)  # dies in epoch 2, one step after the checkpoint at iteration 12
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_config(tiny_cache, tmp_path / "cut", **opts), echo=lambda *a: None).fit()
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["iteration"] == 12
    build_trainer(_config(tiny_cache, tmp_path / "cut", **opts), resume=True,
                        echo=lambda *a: None).fit()

    full = load_checkpoint(tmp_path / "full" / "last.pt")
    cut = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert cut["iteration"] == full["iteration"] == 24
    for key, value in full["model"].items():
        assert torch.equal(value, cut["model"][key]), key
    assert cut["progress"]["best_rsum"] == full["progress"]["best_rsum"]


def test_resume_refuses_a_different_setting(tiny_cache, tmp_path):
    build_trainer(_config(tiny_cache, tmp_path / "r", loss="sh", epochs=1), echo=lambda *a: None).fit()
    with pytest.raises(VseError, match=r"may not change batch_size 8 \(the run's: 16\)"):
        build_trainer(_config(tiny_cache, tmp_path / "r", loss="sh", epochs=2, batch_size=8),
                            resume=True)
    # every option counts, not a list of some: the lr, the margin, mixed precision (amp) …
    for change, shown in (({"lr": 0.05}, "lr 0.05 (the run's: 0.005)"),
                          ({"margin": 0.3}, "margin 0.3 (the run's: None)"),
                          ({"amp": False}, "amp False (the run's: True)")):
        with pytest.raises(VseError, match=re.escape(shown)):
            build_trainer(_config(tiny_cache, tmp_path / "r", loss="sh", epochs=2, **change),
                                resume=True)
    with pytest.raises(VseError, match="no last.pt"):
        build_trainer(_config(tiny_cache, tmp_path / "none", loss="sh"), resume=True)


def _train_cli(*args):
    return CliRunner().invoke(cli, ["train", *[str(a) for a in args]])


def test_cli_resume_takes_the_runs_options_and_refuses_changes(tiny_cache, tmp_path):
    run = tmp_path / "run"
    first = _train_cli("--features", tiny_cache, "--run-dir", run, "--loss", "mh", "--warmup-epochs", 1,
                       "--epochs", 1, "--embed-dim", 16, "--word-dim", 8, "--batch-size", 16, "--lr", 0.005,
                       "--min-word-count", 1, "--val-every", 0, "--workers", 0, "--device", "cpu")
    assert first.exit_code == 0, first.output
    config_before = (run / "config.json").read_text()
    for flags, shown in ((["--lr", 0.05], "lr 0.05 (the run's: 0.005)"),
                         (["--margin", 0.3], "margin 0.3 (the run's: None)"),
                         (["--negative-set-size", 8],
                          "loss_options {'warmup_epochs': 1, 'negative_set_size': 8}"),
                         (["--no-amp"], "amp False (the run's: True)")):
        refused = _train_cli("--run-dir", run, "--features", tiny_cache, "--resume", "--epochs", 2, *flags)
        assert refused.exit_code == 1, refused.output
        assert refused.output.splitlines() == [refused.output.strip()]
        assert refused.output.startswith(f"error: {run / 'last.pt'}: --resume may not change {shown}")
        assert "only run_dir, epochs, val_every" in refused.output
        assert (run / "config.json").read_text() == config_before  # nothing recorded that was not used
    # only what changes is given; every other option is the run's own (not the defaults)
    resumed = _train_cli("--run-dir", run, "--resume", "--epochs", 2, "--warmup-epochs", 1, "--val-every", 5)
    assert resumed.exit_code == 0, resumed.output
    assert "resuming with epochs 2 (was 1), val_every 5 (was 0)" in resumed.output
    saved = json.loads((run / "config.json").read_text())
    assert saved == {**json.loads(config_before), "epochs": 2, "val_every": 5}
    assert load_checkpoint(run / "last.pt")["train_config"] == saved


def test_resume_refuses_another_number_of_processes(tiny_cache, tmp_path):
    from pipeline.core.checkpoint import save_checkpoint

    run = tmp_path / "run"
    build_trainer(_config(tiny_cache, run, loss="sh", epochs=1), echo=lambda *a: None).fit()
    state = load_checkpoint(run / "last.pt")
    assert state["world_size"] == 1
    save_checkpoint({**state, "world_size": 2}, run / "last.pt")  # as if trained by torchrun × 2
    with pytest.raises(VseError, match=r"--resume with 1 process\(es\), but the run was trained with 2"):
        build_trainer(_config(tiny_cache, run, loss="sh", epochs=2), resume=True)
    del state["world_size"]  # a checkpoint from before world_size was recorded: one process
    save_checkpoint(state, run / "last.pt")
    build_trainer(_config(tiny_cache, run, loss="sh", epochs=2), resume=True,
                        echo=lambda *a: None).fit()
    assert load_checkpoint(run / "last.pt")["epoch"] == 2


def test_nan_features_stop_training_with_a_clear_error(tmp_path):
    ids, captions = demo_captions(10)
    caption_image = np.repeat(np.arange(10), 5)
    feats = learnable_features(captions, caption_image, 10)
    feats[3, 0] = np.nan
    cache = write_feature_cache(tmp_path / "nan.h5", feats, captions, caption_image,
                                {"train": np.arange(8), "dev": np.arange(8, 10)})
    with pytest.raises(VseError, match="loss became nan"):
        build_trainer(_config(cache, tmp_path / "run", loss="sh", epochs=1, batch_size=50),
                echo=lambda *a: None).fit()


def test_collapse_warning_points_to_warmup(tiny_cache, tmp_path):
    from pipeline.losses.base import build_loss
    from pipeline.losses.plugins import loss_traits
    from pipeline.training.trainer import CollapseMonitor

    said = []
    monitor = CollapseMonitor(loss_traits(build_loss("mh")), 16, said.append, patience=3)
    with pytest.warns(UserWarning, match="warmup-epochs"):
        for _ in range(3):
            monitor.update(2 * 16 * 0.2)
    assert said and "collapse" in said[0]


def test_tampered_checkpoint_is_refused_without_running_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (exec, ("open('pwned', 'w').write('x')",))

    path = tmp_path / "best.pt"
    with open(path, "wb") as fh:
        pickle.dump({"format": "vse-checkpoint", "model": Evil()}, fh)
    with pytest.raises(VseError, match="refusing to load"):
        load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()
    (tmp_path / "trunc.pt").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(VseError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "trunc.pt")


def test_cli_train_with_config_file_then_evaluate(tiny_cache, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("loss: mh\nwarmup_epochs: 1\nepochs: 3\nembed_dim: 16\nword_dim: 8\n"
                      "batch_size: 16\nlr: 0.002\nmin_word_count: 1\nval_every: 0\n")
    run = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(cli, ["train", "--features", str(tiny_cache), "--run-dir", str(run),
                                 "--config", str(config), "--epochs", "2"])
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "config.json").read_text())
    assert saved["epochs"] == 2 and saved["embed_dim"] == 16  # flag beats file, file beats default
    assert saved["loss_options"] == {"warmup_epochs": 1}
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(run / "best.pt"), "--features",
                                 str(tiny_cache), "--split", "test", "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)
    # the protocol's metrics, the hubness of the caption gallery (8 test images: under 10, no t2i's),
    # then what the evaluation records: one network's scores
    assert list(metrics) == ["i2t_r1", "i2t_r5", "i2t_r10", "i2t_medr", "i2t_meanr",
                             "t2i_r1", "t2i_r5", "t2i_r10", "t2i_medr", "t2i_meanr", "rsum", "i2t_hubness",
                             "ensemble"]
    assert metrics["rsum"] == pytest.approx(sum(metrics[k] for k in metrics if "_r" in k and "medr" not in k
                                                 and "meanr" not in k))


def test_cli_evaluate_npz_and_bad_npz(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.standard_normal((20, 8)).astype(np.float32)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    captions = np.repeat(images, 5, axis=0) + 0.01 * rng.standard_normal((100, 8)).astype(np.float32)
    captions /= np.linalg.norm(captions, axis=1, keepdims=True)
    np.savez(tmp_path / "emb.npz", images=images, captions=captions)
    result = CliRunner().invoke(cli, ["evaluate", "--embeddings", str(tmp_path / "emb.npz"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["i2t_r1"] == 100.0
    np.savez(tmp_path / "bad.npz", images=images, captions=captions[:99])
    result = CliRunner().invoke(cli, ["evaluate", "--embeddings", str(tmp_path / "bad.npz")])
    assert result.exit_code == 1
    assert "bad.npz" in result.output and "5 per image" in result.output


def test_evaluate_refuses_features_of_another_dimension(tiny_cache, tmp_path):
    build_trainer(_config(tiny_cache, tmp_path / "run", loss="sh", epochs=1),
                        echo=lambda *a: None).fit()
    ids, captions = demo_captions(10)
    other = write_feature_cache(tmp_path / "other.h5", np.zeros((10, 7)), captions,
                                np.repeat(np.arange(10), 5), {"test": np.arange(10)})
    result = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "run" / "best.pt"),
                                      "--features", str(other)])
    assert result.exit_code == 1
    assert "expects 32-d" in result.output


def test_a_bad_validation_split_stops_before_training_and_stale_temporaries_go(tiny_cache, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(VseError, match="no split 'val'"):
        build_trainer(_config(tiny_cache, run, loss="sh", epochs=1, val_split="val"),
                            echo=lambda *a: None)
    assert not run.exists()  # refused at set-up, before any epoch
    run.mkdir()
    killed = run / ".last.pt.999999999.tmp"  # left by a process killed while writing
    live = run / f".other.json.{os.getpid()}.tmp"  # a writer that is still running
    killed.write_bytes(b"half")
    live.write_bytes(b"busy")
    build_trainer(_config(tiny_cache, run, loss="sh", epochs=1), echo=lambda *a: None).fit()
    assert not killed.exists() and live.exists()
    assert (run / "last.pt").exists()


def test_train_options_have_no_defaults_of_their_own_and_help_shows_trainconfigs():
    from cli.train_cmd import TrainOption, train_command

    options = [p for p in train_command.params if isinstance(p, TrainOption)]
    assert {p.name for p in options} <= {f.name for f in dataclasses.fields(TrainConfig)}
    assert len(options) >= 30 and all(p.default is None for p in options)
    help_text = " ".join(CliRunner().invoke(cli, ["train", "--help"]).output.split())
    for name, flag in (("epochs", "--epochs INTEGER"), ("lr", "--lr FLOAT"),
                       ("batch_size", "--batch-size INTEGER")):
        assert f"{flag} [default: {TrainConfig.default(name)}]" in help_text
    assert "[default: freeze-bn]" in help_text
    # --amp and --cpu-amp: unset by default, the measured rule decides (core/precision)
    assert "Unset: on for the dual networks, off for the pairwise ones" in help_text


def test_what_resume_may_change_leaves_the_updates_alone(tiny_cache, tmp_path):
    """RESUME_MAY_CHANGE's promise: more epochs and another --val-every (and the folder's
    path) give the weights of one run with the final settings."""
    opts = {"loss": "mh", "loss_options": {"negative_set_size": 5}, "lr_decay_epoch": 1}
    build_trainer(_config(tiny_cache, tmp_path / "full", epochs=2, **opts), echo=lambda *a: None).fit()
    first = _config(tiny_cache, tmp_path / "first", epochs=1, val_every=3, **opts)
    build_trainer(first, echo=lambda *a: None).fit()
    os.rename(tmp_path / "first", tmp_path / "moved")
    build_trainer(_config(tiny_cache, tmp_path / "moved", epochs=2, val_every=5, **opts), resume=True,
            echo=lambda *a: None).fit()
    full = load_checkpoint(tmp_path / "full" / "last.pt")
    moved = load_checkpoint(tmp_path / "moved" / "last.pt")
    assert moved["iteration"] == full["iteration"] == 16
    for key, value in full["model"].items():
        assert torch.equal(value, moved["model"][key]), key
    assert json.loads((tmp_path / "moved" / "config.json").read_text())["run_dir"] == str(tmp_path / "moved")


@pytest.mark.parametrize("scale", [0.01, 100.0])  # within the max norm, and far above it
def test_clip_gradients_is_clip_grad_norm_bit_for_bit(scale):
    from pipeline.training.trainer import clip_gradients

    g = torch.Generator().manual_seed(3)
    ours = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((7, 5), (5,), (3, 4, 2))]
    theirs = [torch.nn.Parameter(q.detach().clone()) for q in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(a.shape, generator=g) * scale
        b.grad = a.grad.clone()
    clip_gradients(ours, 2.0)
    torch.nn.utils.clip_grad_norm_(theirs, 2.0)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)
    assert (torch.linalg.vector_norm(torch.cat([q.grad.flatten() for q in ours])) <= 2.0 + 1e-5)


def test_adam_kernels_make_the_same_updates_and_old_runs_resume_with_their_own(tiny_cache, tmp_path):
    from pipeline.core.checkpoint import save_checkpoint

    opts = dict(loss="sh", epochs=1)
    fused = build_trainer(_config(tiny_cache, tmp_path / "fused", **opts), echo=lambda *a: None)
    assert fused.optimizer.defaults["fused"] is True  # the default kernel
    fused.fit()
    plain = build_trainer(_config(tiny_cache, tmp_path / "plain", adam_kernel="default", **opts),
                    echo=lambda *a: None)
    assert not plain.optimizer.defaults["fused"]
    plain.fit()
    a, b = (load_checkpoint(tmp_path / name / "last.pt")["model"] for name in ("fused", "plain"))
    for key in a:  # 8 steps: the kernels round differently, nothing more
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    with pytest.raises(VseError, match="--adam-kernel must be one of fused, default, not 'adamw'"):
        _config(tiny_cache, tmp_path / "x", adam_kernel="adamw").check()
    # a checkpoint written before the option existed resumes with PyTorch's default kernel
    state = load_checkpoint(tmp_path / "plain" / "last.pt")
    del state["train_config"]["adam_kernel"]
    save_checkpoint(state, tmp_path / "plain" / "last.pt")
    resumed = build_trainer(_config(tiny_cache, tmp_path / "plain", loss="sh", epochs=2), resume=True,
                      given={"epochs"}, echo=lambda *a: None)
    assert resumed.cfg.adam_kernel == "default" and not resumed.optimizer.defaults["fused"]
