"""Feature extraction on real Flickr8k images: crops, resume, bad images, torchrun, CLI.

Most tests use the test-only ``tiny`` backbone; one uses the real EfficientNet-Lite0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torchvision import transforms

from cli.main import cli
from pipeline.backbones.cnns import IMAGENET_MEAN, IMAGENET_STD, Preprocessing, load_backbone
from pipeline.backbones.crops import CropPlan
from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache, ShardedWriter, shards_dir
from pipeline.data.extract import ExtractOptions, extract_features, import_precomputed
from pipeline.data.readers import Dataset

IMAGES = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k" / "images"
pytestmark = [pytest.mark.slow,  # real images through CNNs: `pytest -m "not slow"` skips them
              pytest.mark.skipif(not IMAGES.is_dir(),
                                 reason="needs ../shared/data/flickr8k beside the repository")]
VENV_BIN = Path(sys.executable).parent
DOG = "1024138940_f1fefbdce1.jpg"  # a dog filling the frame (captions: "a dog ...")


def _image_names(n: int) -> list[str]:
    return sorted(p.name for p in IMAGES.iterdir())[:n]


def _dataset(names, image_dir=IMAGES, splits=None) -> Dataset:
    n = len(names)
    return Dataset(name="flickr8k", root=image_dir.parent, image_ids=list(names),
                   image_paths=[image_dir / name for name in names],
                   captions=[f"caption {k} of {name}" for name in names for k in range(2)],
                   caption_image=np.repeat(np.arange(n), 2),
                   splits=splits or {"all": np.arange(n)})


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory) -> str:
    """Exported graphs shared by the module's tests (each backbone exported once)."""
    return str(tmp_path_factory.mktemp("onnx"))


def _tiny(**overrides) -> ExtractOptions:
    return ExtractOptions(**{"backbone": "tiny", "batch_size": 3, "shard_size": 4, "workers": 0,
                             **overrides})


def _features(path) -> np.ndarray:
    with FeatureCache(path) as cache:
        return cache.features[...]


# ---------------------------------------------------------------------------- crops


def _reference_transform(crops: int, size: int, resize: int, mean, std):
    """Torchvision's own transforms on PIL images: the independent implementation."""
    to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    if crops == 1:
        return transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(size),
                                   to_tensor, transforms.Lambda(lambda x: x[None])])
    return transforms.Compose([
        transforms.Resize((resize, resize)), transforms.TenCrop(size),
        transforms.Lambda(lambda crops: torch.stack([to_tensor(c) for c in crops]))])


@pytest.mark.parametrize("crops", [1, 10])
def test_crops_match_torchvision_transforms(crops):
    preprocessing = Preprocessing(224, 256, IMAGENET_MEAN, IMAGENET_STD, "bilinear")
    plan = CropPlan(crops, preprocessing)
    image = Image.open(IMAGES / DOG).convert("RGB").crop((0, 20, 224, 180))  # 224×160, not square
    prepared = plan.prepare(image)
    assert prepared.dtype == torch.uint8 and tuple(prepared.shape) == plan.prepared_shape
    ours = plan.network_input(torch.stack([prepared, prepared]))
    reference = _reference_transform(crops, 224, 256, IMAGENET_MEAN, IMAGENET_STD)(image)
    assert ours.shape == (2 * crops, 3, 224, 224)
    # uint8 rounding of the resized image is the only difference from float ToTensor
    torch.testing.assert_close(ours[:crops], reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours[crops:], reference, atol=1e-5, rtol=0)
    if crops == 10:  # crop 5 is the flip of crop 0's mirror corner (top-right)
        torch.testing.assert_close(ours[5], ours[1].flip(-1))


@pytest.mark.parametrize("crops", [1, 10])
def test_tiny_extraction_equals_a_slow_per_image_reference(tmp_path, crops):
    names = _image_names(7)
    result = extract_features(_dataset(names), tmp_path / "f.h5", options=_tiny(crops=crops))
    backbone = load_backbone("tiny")
    p = backbone.preprocessing
    reference = _reference_transform(crops, p.image_size, p.resize, p.mean, p.std)
    with torch.inference_mode():
        expected = np.stack([backbone.module(reference(Image.open(IMAGES / n).convert("RGB")))
                            .mean(0).numpy() for n in names])
    assert result.num_images == 7 and result.num_shards == 2 and result.shards_computed == 2
    np.testing.assert_allclose(_features(result.path), expected, atol=1e-5, rtol=1e-4)
    with FeatureCache(result.path) as cache:
        assert cache.attrs["crops"] == crops and cache.attrs["image_size"] == 64
        assert cache.attrs["resize"] == 73 and cache.attrs["backbone"] == "tiny"
        assert cache.attrs["resize_mode"] == ("shorter_side" if crops == 1 else "square")


# ---------------------------------------------------------------------------- rows and splits


def test_only_requested_splits_are_extracted_in_dataset_order(tmp_path):
    names = _image_names(8)
    splits = {"train": np.array([5, 0, 2]), "dev": np.array([1, 7]), "test": np.array([6, 3])}
    dataset = _dataset(names, splits=splits)
    out = extract_features(dataset, tmp_path / "f.h5", splits=["test", "train"], options=_tiny()).path
    everything = _dataset(names)
    full = _features(extract_features(everything, tmp_path / "all.h5", options=_tiny(shard_size=100)).path)
    with FeatureCache(out) as cache:
        assert cache.image_ids == [names[i] for i in (0, 2, 3, 5, 6)]  # dataset order
        assert cache.split_names == ["test", "train"]
        assert [cache.image_ids[r] for r in cache.split("train")] == [names[5], names[0], names[2]]
        assert [cache.image_ids[r] for r in cache.split("test")] == [names[6], names[3]]
        assert cache.captions == [c for i in (0, 2, 3, 5, 6) for c in dataset.captions[2 * i:2 * i + 2]]
        assert cache.caption_image.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
        assert cache.split_captions("test").tolist() == [8, 9, 4, 5]
        # a row's features do not depend on which other images are extracted (up to the
        # float rounding of a different batch composition)
        np.testing.assert_allclose(cache.features[...], full[[0, 2, 3, 5, 6]], atol=1e-6)
    with pytest.raises(VseError, match=r"no split 'val' in the dataset \(splits: train, dev, test\)"):
        extract_features(dataset, tmp_path / "x.h5", splits=["val"], options=_tiny())


# ---------------------------------------------------------------------------- resume


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing catches it."""


def test_killed_run_resumes_to_byte_identical_features(tmp_path, monkeypatch):
    dataset = _dataset(_image_names(11))  # shards of 4: [0,4) [4,8) [8,11)
    reference = _features(extract_features(dataset, tmp_path / "ref.h5", options=_tiny(crops=10)).path)

    out = tmp_path / "run.h5"
    real_write = ShardedWriter.write_shard

    def write_then_die(self, index, features, bad_rows=()):
        if index == 1:  # die while writing shard 1: a temp file is left behind, no shard
            (shards_dir(self.out) / f".shard-00001.h5.{os.getpid()}.tmp").write_bytes(b"partial")
            raise _Killed
        real_write(self, index, features, bad_rows)

    monkeypatch.setattr(ShardedWriter, "write_shard", write_then_die)
    with pytest.raises(_Killed):
        extract_features(dataset, out, options=_tiny(crops=10))
    monkeypatch.setattr(ShardedWriter, "write_shard", real_write)
    assert not out.exists()
    assert (shards_dir(out) / "shard-00000.h5").is_file()
    # a file under a final shard name that is not a complete shard is never trusted
    (shards_dir(out) / "shard-00002.h5").write_bytes(b"\x89HDF\r\n\x1a\n garbage")

    result = extract_features(dataset, out, options=_tiny(crops=10))
    assert (result.shards_computed, result.shards_reused, result.images_computed) == (2, 1, 7)
    features = _features(out)
    assert features.tobytes() == reference.tobytes()
    assert sorted(p.name for p in shards_dir(out).iterdir()) == [
        "shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]

    again = extract_features(dataset, out, options=_tiny(crops=10))
    assert again.shards_computed == 0 and _features(out).tobytes() == reference.tobytes()


def test_shards_of_another_configuration_are_recomputed(tmp_path):
    dataset = _dataset(_image_names(6))
    out = tmp_path / "f.h5"
    one = _features(extract_features(dataset, out, options=_tiny(crops=1)).path)
    result = extract_features(dataset, out, options=_tiny(crops=10))
    assert result.shards_computed == result.num_shards == 2
    ten = _features(out)
    assert not np.allclose(one, ten)
    with FeatureCache(out) as cache:
        assert cache.attrs["crops"] == 10


# ---------------------------------------------------------------------------- bad images


def test_unreadable_image_stops_with_one_line_or_is_stored_as_zeros(tmp_path):
    names = _image_names(5)
    folder = tmp_path / "images"
    folder.mkdir()
    for name in names:
        shutil.copy(IMAGES / name, folder / name)
    broken = folder / names[3]
    broken.write_bytes((IMAGES / names[3]).read_bytes()[:700])  # truncated JPEG
    dataset = _dataset(names, image_dir=folder)

    with pytest.raises(VseError) as info:
        extract_features(dataset, tmp_path / "f.h5", options=_tiny())
    assert str(broken) in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "f.h5").exists()

    result = extract_features(dataset, tmp_path / "f.h5", options=_tiny(skip_bad_images=True))
    assert len(result.bad_images) == 1 and result.bad_images[0].startswith(names[3])
    with FeatureCache(result.path) as cache:
        assert cache.bad_images.tolist() == [3]
        assert not cache.features[3].any() and cache.features[[0, 1, 2, 4]].all(axis=1).any()
        assert cache.check().ok  # the zero row is explained


# ---------------------------------------------------------------------------- backbones


def test_missing_or_unfit_weights_name_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    for name, filename in [("resnet152", "resnet152-394f9c45.pth"), ("vgg19", "vgg19-dcbb9e9d.pth")]:
        with pytest.raises(VseError, match=f"no weights file for {name}") as info:
            load_backbone(name)
        assert str(tmp_path / "hub" / "checkpoints" / filename) in str(info.value)
    wrong = tmp_path / "wrong.pth"
    torch.save({"conv.weight": torch.zeros(1)}, wrong)
    with pytest.raises(VseError, match="weights do not fit resnet152") as info:
        load_backbone("resnet152", wrong)
    assert str(wrong) in str(info.value)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(VseError, match="not a readable PyTorch weights file"):
        load_backbone("vgg19", junk)


def test_real_efficientnet_lite0_features(tmp_path, onnx_dir):
    names = [DOG, "1000268201_693b08cb0e.jpg"]
    dataset = _dataset(names)
    options = ExtractOptions(backbone="efficientnet-lite0", batch_size=2, workers=0, onnx_dir=onnx_dir)
    features = {}
    for crops in (1, 10):
        with_crops = ExtractOptions(**{**options.__dict__, "crops": crops})
        runs = [_features(extract_features(dataset, tmp_path / f"{crops}_{k}.h5", options=with_crops).path)
                for k in range(2)]
        assert runs[0].shape == (2, 1280) and runs[0].tobytes() == runs[1].tobytes()
        features[crops] = runs[0]
    assert not np.allclose(features[1], features[10], atol=1e-3)
    # 10 crops of the same photo describe it much like the centre crop does
    norms = np.linalg.norm(features[1], axis=1) * np.linalg.norm(features[10], axis=1)
    cosine = (features[1] * features[10]).sum(1) / norms
    assert (cosine > 0.8).all()
    backbone = load_backbone("efficientnet-lite0")
    with torch.inference_mode():
        for crops in (1, 10):
            classes = backbone.module.net._fc(torch.from_numpy(features[crops])).argmax(1)
            assert 151 <= int(classes[0]) <= 268  # ImageNet's dog classes
    with FeatureCache(tmp_path / "1_0.h5") as cache:
        assert cache.attrs["weights_sha256"] == backbone.weights_sha256
        assert cache.attrs["mean"] == pytest.approx([127 / 255] * 3)
        assert cache.attrs["std"] == pytest.approx([128 / 255] * 3)
        assert (cache.attrs["image_size"], cache.attrs["resize"]) == (224, 256)


# the first photos of Flickr8k: a girl on stairs, two dogs, a skier
PHOTOS = ["1000268201_693b08cb0e.jpg", "1001773457_577c3a7d70.jpg", "1009434119_febe49276a.jpg",
          "101669240_b2d3e7f17b.jpg"]
IMAGENET_DOGS, IMAGENET_SKI = slice(151, 269), 795


@pytest.mark.parametrize("name, size, resize", [("efficientnet-lite0", 224, 256),
                                                ("efficientnet-lite1", 240, 272),
                                                ("efficientnet-lite2", 260, 292)])
def test_efficientnet_lite_features_classify_real_photos(tmp_path, onnx_dir, name, size, resize):
    """Weights, input size and preprocessing fit: the cached features, through the network's
    own ImageNet classifier, see the dogs as dogs and the skier as a skier."""
    options = ExtractOptions(backbone=name, batch_size=4, workers=0, onnx_dir=onnx_dir)
    result = extract_features(_dataset(PHOTOS), tmp_path / "f.h5", options=options)
    backbone = load_backbone(name)
    with torch.inference_mode():
        probs = backbone.module.net._fc(torch.from_numpy(_features(result.path))).softmax(1)
    dog_mass = probs[:, IMAGENET_DOGS].sum(1)
    assert (dog_mass[1:3] > 0.3).all() and (dog_mass[[0, 3]] < 0.15).all(), dog_mass
    assert int(probs[3].argmax()) == IMAGENET_SKI
    with FeatureCache(result.path) as cache:
        assert (cache.attrs["image_size"], cache.attrs["resize"]) == (size, resize)
        assert cache.attrs["interpolation"] == "bicubic" and cache.feature_dim == 1280
        assert cache.attrs["weights_sha256"] == backbone.weights_sha256


# ---------------------------------------------------------------------------- precomputed


def test_vsepp_precomputed_features_are_copied(tmp_path):
    from pipeline.data.readers import load_dataset

    rng = np.random.default_rng(0)
    arrays = {"train": rng.standard_normal((4, 5)).astype(np.float32),
              "test": rng.standard_normal((3, 5)).astype(np.float32)}
    for split, array in arrays.items():
        np.save(tmp_path / f"{split}_ims.npy", array)
        (tmp_path / f"{split}_caps.txt").write_text(
            "".join(f"{split} caption {k}\n" for k in range(5 * len(array))), encoding="utf-8")
    dataset = load_dataset("vsepp-precomp", tmp_path)
    result = import_precomputed(dataset, tmp_path / "out" / "p.h5", splits=["test"], shard_size=2)
    with FeatureCache(result.path) as cache:
        np.testing.assert_array_equal(cache.features[...], arrays["test"])
        assert cache.attrs["backbone"] == "precomputed" and cache.split_names == ["test"]
        assert cache.captions[:2] == ["test caption 0", "test caption 1"] and len(cache.captions) == 15


# ---------------------------------------------------------------------------- CLI and torchrun


def _flickr8k_layout(root: Path, names: list[str]) -> Path:
    """A miniature of the official Flickr8k layout over real images."""
    (root / "images").mkdir(parents=True)
    for name in names:
        (root / "images" / name).symlink_to(IMAGES / name)
    (root / "Flickr8k.token.txt").write_text(
        "".join(f"{n}#{k}\tA caption number {k} of {n} .\n" for n in names for k in range(5)))
    thirds = [names[0::3], names[1::3], names[2::3]]
    for split, part in zip(("train", "dev", "test"), thirds):
        (root / f"Flickr_8k.{split}Images.txt").write_text("".join(f"{n}\n" for n in part))
    return root


def test_cli_extract_and_info(tmp_path):
    root = _flickr8k_layout(tmp_path / "f8k", _image_names(6))
    out = tmp_path / "cache" / "f8k.h5"
    runner = CliRunner()
    result = runner.invoke(cli, ["extract", "--dataset", "flickr8k", "--root", str(root),
                                 "--splits", "train,test", "--backbone", "tiny", "--crops", "10",
                                 "--out", str(out), "--workers", "0", "--shard-size", "3", "--quiet"])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 4 images × 32 (2 shards" in result.output

    info = runner.invoke(cli, ["info", str(out)])
    assert info.exit_code == 0, info.output
    assert "backbone: tiny" in info.output and "crops: 10" in info.output
    assert "train: 2 images, 10 captions" in info.output and "test: 2 images, 10 captions" in info.output
    assert "check: ok" in info.output

    with h5py.File(shards_dir(out) / "shard-00001.h5", "r+") as f:
        f["features"][0, 3] = np.nan
    info = runner.invoke(cli, ["info", str(out)])
    assert info.exit_code == 1
    assert info.output.strip().splitlines()[-1] == (
        f"error: {out}: broken cache: 1 rows with NaN (first rows: 3)")

    (shards_dir(out) / "shard-00000.h5").unlink()
    info = runner.invoke(cli, ["info", str(out)])
    assert info.exit_code == 1 and info.output.strip() == (
        f"error: {out}: missing shard f8k.h5.shards/shard-00000.h5 (rows 0..2)")


def test_cli_backbone_choices_come_from_the_registry():
    from pipeline.backbones.cnns import BACKBONE_NAMES, BUILDERS

    assert BACKBONE_NAMES == tuple(BUILDERS) and "efficientnet-lite2" in BACKBONE_NAMES
    for command in ("extract", "train"):
        option = next(p for p in cli.commands[command].params if p.name == "backbone")
        assert tuple(option.type.choices) == BACKBONE_NAMES


def test_torchrun_two_ranks_equal_one_process(tmp_path):
    root = _flickr8k_layout(tmp_path / "f8k", _image_names(7))
    args = ["extract", "--dataset", "flickr8k", "--root", str(root), "--backbone", "tiny",
            "--crops", "10", "--workers", "0", "--shard-size", "2", "--batch-size", "2", "--quiet"]
    single = CliRunner().invoke(cli, [*args, "--out", str(tmp_path / "one.h5")])
    assert single.exit_code == 0, single.output
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                          "-m", "cli.main", *args, "--out", str(tmp_path / "two.h5")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "4 shards, 2 computed here, 2 reused or by other ranks" in run.stdout  # rank 0: 0, 2
    with FeatureCache(tmp_path / "one.h5") as one, FeatureCache(tmp_path / "two.h5") as two:
        assert one.image_ids == two.image_ids and one.captions == two.captions
        assert one.features[...].tobytes() == two.features[...].tobytes()


def test_an_engine_in_the_workers_gets_every_core_and_no_more(monkeypatch):
    """ONNX Runtime runs in the loader workers: one per core up to MAX_ENGINE_WORKERS, the
    cores beyond that as threads of their sessions; torch keeps a core for itself."""
    from pipeline.backbones.engines import OnnxRuntimeEngine, TorchEngine
    from pipeline.core import runtime
    from pipeline.data import extract

    ort, torch_engine = object.__new__(OnnxRuntimeEngine), object.__new__(TorchEngine)
    for cores, workers, threads in ((1, 1, 1), (2, 2, 1), (8, 8, 1), (16, 8, 2), (12, 8, 1)):
        monkeypatch.setattr(torch, "get_num_threads", lambda cores=cores: cores)
        assert extract.loader_workers(ExtractOptions(), ort) == workers
        assert extract.engine_threads_per_worker(workers) == threads
    assert extract.loader_workers(ExtractOptions(workers=0), ort) == 0  # all in the main process
    assert extract.loader_workers(ExtractOptions(workers=3), ort) == 3
    assert extract.loader_workers(ExtractOptions(), torch_engine) == runtime.default_workers()
