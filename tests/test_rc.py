"""RC mode: images → random crops → CNN every step, on 12 real demo images and the tiny CNN."""

import json

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from click.testing import CliRunner
from rc_data import make_flickr8k

from cli.main import cli
from pipeline.backbones.cnns import load_backbone
from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.core.errors import VseError
from pipeline.data.extract import ExtractOptions, extract_features
from pipeline.data.image_source import RandomCrops, resized_crop_box
from pipeline.data.readers import load_dataset, open_image
from pipeline.evaluation.inference import embed_rc_checkpoint, encode_split
from pipeline.training.build import build_trainer
from pipeline.training.trainer import Trainer

SMALL = dict(embed_dim=16, word_dim=8, batch_size=4, lr=5e-3, min_word_count=1, val_every=0, workers=0,
             log_every=1)
QUIET = dict(echo=lambda *a: None)


@pytest.fixture(scope="module")
def images_root(tmp_path_factory):
    """12 demo images (224×224 JPEG) in the Flickr8k layout: 8 train, 2 dev, 2 test."""
    return make_flickr8k(tmp_path_factory.mktemp("flickr8k"))


@pytest.fixture(scope="module")
def tiny_features(images_root, tmp_path_factory):
    """`vse extract` of the same images with the tiny CNN, 1 centre crop."""
    out = tmp_path_factory.mktemp("cache") / "tiny.h5"
    extract_features(load_dataset("flickr8k", images_root), out, options=ExtractOptions(
        backbone="tiny", crops=1, workers=0, batch_size=5, device="cpu"), dataset_kind="flickr8k")
    return out


def _rc(root, run_dir, **overrides):
    return TrainConfig(rc=True, root=str(root), backbone="tiny", run_dir=str(run_dir),
                       **{**SMALL, **overrides})


def _cnn_state(state):
    return state["backbone"]["state"]


def test_frozen_rc_run_trains_the_head_only_and_checkpoints_the_cnn(images_root, tmp_path):
    summary = build_trainer(_rc(images_root, tmp_path / "run", epochs=2, loss="sh"), **QUIET).fit()
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and summary["iterations"] == 2 * 10  # 40 pairs / 4
    assert summary["best_rsum"] == max(r["rsum"] for r in records)
    best = load_checkpoint(run / "best.pt")  # weights_only load
    assert best["backbone"]["name"] == "tiny" and best["backbone"]["finetune"] is False
    assert not any(k.startswith("image_encoder.backbone") for k in best["model"])
    pretrained = load_backbone("tiny").module.state_dict()
    last = load_checkpoint(run / "last.pt")
    assert set(_cnn_state(last)) == set(pretrained)
    for key, value in pretrained.items():  # frozen: not a bit changed
        assert torch.equal(_cnn_state(last)[key], value), key
    assert best["feature_source"] == {"backbone": "tiny", "crops": 1, "dataset": "flickr8k",
                                      "finetuned": False}


def test_finetune_trains_the_cnn_in_its_own_param_group(images_root, tmp_path):
    cfg = _rc(images_root, tmp_path / "run", epochs=1, loss="sh", finetune=True, backbone_lr_factor=0.1)
    trainer = build_trainer(cfg, **QUIET)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([5e-3, 5e-4])
    cnn = {id(p) for p in trainer.model.backbone.parameters()}
    assert {id(p) for p in trainer.optimizer.param_groups[1]["params"]} == cnn
    assert not cnn & {id(p) for p in trainer.optimizer.param_groups[0]["params"]}
    trainer.fit()
    pretrained = load_backbone("tiny").module.state_dict()
    tuned = _cnn_state(load_checkpoint(tmp_path / "run" / "last.pt"))
    assert load_checkpoint(tmp_path / "run" / "last.pt")["backbone"]["finetune"] is True
    for key, value in pretrained.items():
        assert not torch.allclose(tuned[key], value), key


def test_frozen_backbone_takes_no_gradient_and_stays_in_eval_mode(images_root, tmp_path):
    trainer = build_trainer(_rc(images_root, tmp_path / "run", finetune=False), **QUIET)
    trainer.model.train()
    assert not trainer.model.backbone.cnn.training and trainer.model.image_encoder.proj.training
    assert all(not p.requires_grad for p in trainer.model.backbone.parameters())
    assert len(trainer.optimizer.param_groups) == 1
    batch = trainer.epoch_batches(0)[0]
    assert batch.images.dtype == torch.uint8 and batch.images.shape == (4, 3, 64, 64)
    features = trainer.model.backbone(batch.images)
    assert not features.requires_grad  # no graph through the CNN


def test_freeze_bn_keeps_batchnorm_statistics_when_finetuning():
    from pipeline.backbones.pixels import PixelBackbone

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten())

    pixels = torch.randint(0, 256, (4, 3, 5, 5), dtype=torch.uint8)
    frozen = PixelBackbone(net(), (0.5,) * 3, (0.25,) * 3, trainable=True, freeze_bn=True).train()
    moving = PixelBackbone(net(), (0.5,) * 3, (0.25,) * 3, trainable=True, freeze_bn=False).train()
    frozen(pixels).sum().backward()
    moving(pixels)
    assert torch.equal(frozen.cnn[1].running_mean, torch.zeros(4))
    assert not torch.equal(moving.cnn[1].running_mean, torch.zeros(4))
    assert frozen.cnn[1].weight.grad is not None  # the affine part still trains
    # the normalisation is the backbone's own: (x/255 - mean) / std
    x = pixels.float() / 255
    expected = frozen.cnn.eval()((x - 0.5) / 0.25)
    assert torch.allclose(frozen(pixels), expected, atol=1e-5)


def _kill_after(monkeypatch, iterations):
    original = Trainer.step
    calls = {"n": 0}

    def step(self, batch):
        if calls["n"] == iterations:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(self, batch)

    monkeypatch.setattr(Trainer, "step", step)


def test_rc_resume_gives_the_same_weights_as_an_uninterrupted_run(images_root, tmp_path, monkeypatch):
    # 5 batches per epoch; a checkpoint every 3 iterations; crops decoded in a worker process
    opts = dict(epochs=2, loss="mh", finetune=True, batch_size=8, val_every=3, workers=1, lr_decay_epoch=1)
    build_trainer(_rc(images_root, tmp_path / "full", **opts), **QUIET).fit()
    with monkeypatch.context() as m:
        _kill_after(m, 7)  # epoch 2, batch 2; last checkpoint at iteration 6
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_rc(images_root, tmp_path / "cut", **opts), **QUIET).fit()
    assert load_checkpoint(tmp_path / "cut" / "last.pt")["iteration"] == 6
    build_trainer(_rc(images_root, tmp_path / "cut", **opts), resume=True, **QUIET).fit()
    full, cut = (load_checkpoint(tmp_path / r / "last.pt") for r in ("full", "cut"))
    assert cut["iteration"] == full["iteration"] == 10
    for key, value in full["model"].items():
        assert torch.equal(value, cut["model"][key]), key
    for key, value in _cnn_state(full).items():
        assert torch.equal(value, _cnn_state(cut)[key]), key
    with pytest.raises(VseError, match="may not change finetune"):
        build_trainer(_rc(images_root, tmp_path / "cut", **{**opts, "finetune": False}), resume=True,
                            **QUIET)


def test_init_from_a_cached_run_loads_its_projection_and_text_encoder(images_root, tiny_features, tmp_path):
    cached = TrainConfig(features=str(tiny_features), run_dir=str(tmp_path / "cached"), epochs=2, loss="sh",
                         **SMALL)
    build_trainer(cached, **QUIET).fit()
    best = load_checkpoint(tmp_path / "cached" / "best.pt")
    said = []
    rc = build_trainer(_rc(images_root, tmp_path / "rc",
                                 init_from=str(tmp_path / "cached" / "best.pt")),
                 echo=said.append)
    head = rc.model.head_state_dict()
    assert set(head) == set(best["model"])
    for key, value in best["model"].items():
        assert torch.equal(head[key], value), key
    assert rc.vocab.words == best["vocab"] and "kept fresh" not in said[0]
    # RC validation = centre crops through the current CNN = the 1-crop cache's features
    rc_emb = encode_split(rc.model, rc.index, rc.captions, "dev", rc.device)
    cached_trainer = build_trainer(cached, **QUIET)
    cached_trainer.model.load_state_dict(best["model"])
    cache_emb = encode_split(cached_trainer.model, cached_trainer.index, cached_trainer.captions, "dev",
                             cached_trainer.device)
    np.testing.assert_allclose(rc_emb.images, cache_emb.images, atol=1e-5)
    np.testing.assert_array_equal(rc_emb.caption_rows, cache_emb.caption_rows)
    assert rc.validate()["rsum"] == pytest.approx(best["metrics"]["rsum"])


def test_random_crops_are_windows_of_the_resized_image_drawn_per_epoch_and_position(images_root):
    backbone = load_backbone("tiny")
    p = backbone.preprocessing  # 64 from 73
    paths = load_dataset("flickr8k", images_root).image_paths
    crops = RandomCrops(paths, p, "random", seed=3)
    rows, positions = np.array([0, 0, 5]), np.array([7, 8, 9])
    first = crops.batch(rows, 1, positions)
    assert first.shape == (3, 3, 64, 64) and first.dtype == torch.uint8
    assert torch.equal(first, crops.batch(rows, 1, positions))  # same (epoch, position): same crop
    assert torch.equal(first[1], crops.batch(rows[1:2], 1, positions[1:2])[0])  # batch-independent
    assert not torch.equal(first, crops.batch(rows, 2, positions))
    resized = TF.pil_to_tensor(TF.resize(open_image(paths[0]), 73,
                                         interpolation=TF.InterpolationMode.BILINEAR))
    flips = 0
    for epoch in range(8):
        crop = crops.batch(rows[:1], epoch, positions[:1])[0]
        windows = resized.unfold(1, 64, 1).unfold(2, 64, 1)  # (3, 10, 10, 64, 64)
        found = [(crop == windows[:, i, j]).all() or (crop.flip(-1) == windows[:, i, j]).all()
                 for i in range(windows.shape[1]) for j in range(windows.shape[2])]
        assert any(found), epoch
        flips += not any((crop == windows[:, i, j]).all() for i in range(10) for j in range(10))
    assert 0 < flips < 8


def test_random_resized_crop_box_follows_the_torchvision_rule(images_root):
    rng = np.random.default_rng(0)
    for height, width in [(224, 224), (300, 500), (500, 120)]:
        boxes = np.array([resized_crop_box(height, width, rng) for _ in range(300)])
        top, left, h, w = boxes.T
        assert (top >= 0).all() and (top + h <= height).all()
        assert (left >= 0).all() and (left + w <= width).all()
        area, aspect = h * w / (height * width), w / h
        assert area.min() >= 0.08 * 0.95 and area.max() <= 1.0 and area.std() > 0.05
        assert aspect.min() >= 3 / 4 * 0.95 and aspect.max() <= 4 / 3 * 1.05
    # no draw fits a 1000×10 strip: the centre crop of the clamped aspect 3/4
    assert resized_crop_box(1000, 10, np.random.default_rng(0)) == (493, 0, 13, 10)
    crops = RandomCrops(load_dataset("flickr8k", images_root).image_paths,
                        load_backbone("tiny").preprocessing, "random-resized", seed=0)
    assert crops.batch(np.array([0]), 0, np.array([0])).shape == (1, 3, 64, 64)


def test_evaluate_an_rc_checkpoint(images_root, tiny_features, tmp_path):
    build_trainer(_rc(images_root, tmp_path / "frozen", epochs=1, loss="sh"), **QUIET).fit()
    tuned_trainer = build_trainer(_rc(images_root, tmp_path / "tuned", epochs=1, loss="sh",
                                            finetune=True), **QUIET)
    tuned_trainer.fit()
    runner = CliRunner()
    # frozen CNN: the 1-crop cache of the same backbone holds exactly its features
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "frozen" / "best.pt"),
                                 "--features", str(tiny_features), "--split", "test", "--json"])
    assert result.exit_code == 0, result.output
    from_cache = json.loads(result.output)
    emb = embed_rc_checkpoint(tmp_path / "frozen" / "best.pt", "flickr8k", images_root, "test",
                              torch.device("cpu"))
    from pipeline.evaluation.evaluate import evaluate_split_embeddings

    assert evaluate_split_embeddings(emb)["rsum"] == pytest.approx(from_cache["rsum"])
    # fine-tuned CNN: no cache matches; refused in one line, and evaluated on images instead
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "tuned" / "best.pt"),
                                 "--features", str(tiny_features)])
    assert result.exit_code == 1 and "fine-tuned end to end" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "--root" in result.output
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "tuned" / "best.pt"),
                                 "--root", str(images_root), "--split", "test", "--json"])
    assert result.exit_code == 0, result.output
    on_images = json.loads(result.output)
    tuned = embed_rc_checkpoint(tmp_path / "tuned" / "best.pt", "flickr8k", images_root, "test",
                                torch.device("cpu"))
    expected = encode_split(tuned_trainer.model, tuned_trainer.index, tuned_trainer.captions, "test",
                            tuned_trainer.device)  # one epoch: best.pt is the final model
    np.testing.assert_allclose(tuned.images, expected.images, atol=1e-6)
    np.testing.assert_allclose(tuned.captions, expected.captions, atol=1e-6)
    assert on_images["rsum"] == pytest.approx(evaluate_split_embeddings(tuned)["rsum"])
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(tmp_path / "tuned" / "best.pt"),
                                 "--root", str(images_root), "--features", str(tiny_features)])
    assert result.exit_code == 2 and "--root goes with --checkpoint" in result.output


def test_unreadable_image_stops_training_in_one_line(images_root, tmp_path):
    import shutil

    root = tmp_path / "broken"
    shutil.copytree(images_root, root)
    victim = sorted((root / "images").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:200])  # truncated JPEG
    with pytest.raises(VseError) as caught:
        build_trainer(_rc(root, tmp_path / "run", epochs=1, workers=1), **QUIET).fit()
    message = str(caught.value)
    assert victim.name in message and "\n" not in message and "Traceback" not in message


def test_cli_rc_options_and_their_errors(images_root, tmp_path):
    runner = CliRunner()
    base = ["train", "--run-dir", str(tmp_path / "run"), "--epochs", "1", "--batch-size", "4",
            "--embed-dim", "16", "--word-dim", "8", "--min-word-count", "1", "--val-every", "0"]
    result = runner.invoke(cli, base + ["--rc", "--root", str(images_root), "--backbone", "tiny",
                                        "--finetune", "--backbone-lr-factor", "0.5",
                                        "--crop", "random-resized", "--no-freeze-bn", "--workers", "0"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["rc"], saved["backbone"], saved["finetune"], saved["backbone_lr_factor"], saved["crop"],
            saved["freeze_bn"]) == (True, "tiny", True, 0.5, "random-resized", False)
    result = runner.invoke(cli, base + ["--features", "x.h5", "--finetune"])
    assert result.exit_code == 1 and "--finetune needs --rc" in result.output
    result = runner.invoke(cli, base + ["--rc"])
    assert result.exit_code == 1 and "--rc needs --root" in result.output


def test_rc_pools_the_cnn_map_end_to_end_and_embeds_like_evaluate(images_root, tmp_path):
    """--rc --grid --image-pool gpo: the CNN's map as a set (VSE∞'s grid setting), fine-tuned; evaluated
    on images, and `vse embed` of the same files gives the same image embeddings."""
    trainer = build_trainer(_rc(images_root, tmp_path / "grid", epochs=1, loss="mh", finetune=True,
                                grid=True, image_pool="gpo"), **QUIET)
    trainer.fit()
    state = load_checkpoint(tmp_path / "grid" / "best.pt")
    assert state["backbone"]["grid"] is True and len(state["pool_weights"]["image"]) == 16 * 16
    emb = embed_rc_checkpoint(tmp_path / "grid" / "best.pt", "flickr8k", images_root, "test",
                              torch.device("cpu"))
    from pipeline.search.embed import Embedder

    names = [trainer.index.paths[r] for r in emb.image_rows]
    embedded = Embedder.from_checkpoint(tmp_path / "grid" / "best.pt", "cpu").embed_images(names)
    expected = emb.images / np.linalg.norm(emb.images, axis=1, keepdims=True)
    np.testing.assert_allclose(embedded, expected, atol=1e-5)
