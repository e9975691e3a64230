"""The forward-pass engines (pipeline.backbones.engines): torch and ONNX Runtime agree on real photos,
the exported graph is a cache keyed by the weights, a run is resumed only by its own engine."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli.main import cli
from pipeline.backbones import engines
from pipeline.backbones.cnns import load_backbone
from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache, ShardedWriter, shards_dir
from pipeline.data.extract import ExtractOptions, extract_features
from pipeline.data.readers import Dataset

IMAGES = Path(__file__).resolve().parents[2] / "shared" / "data" / "flickr8k" / "images"
pytestmark = [
    pytest.mark.slow,  # real photos through two engines: `pytest -m "not slow"` skips them
    pytest.mark.skipif(not IMAGES.is_dir(), reason="needs ../shared/data/flickr8k beside the repository"),
    pytest.mark.skipif(not engines.onnxruntime_installed(),
                       reason="needs the onnx extra (onnx, onnxruntime)"),
]
# a girl on stairs, a dog, a skier: real photos, not noise
PHOTOS = ["1000268201_693b08cb0e.jpg", "1001773457_577c3a7d70.jpg", "101669240_b2d3e7f17b.jpg"]


def _dataset(names) -> Dataset:
    return Dataset(name="flickr8k", root=IMAGES.parent, image_ids=list(names),
                   image_paths=[IMAGES / n for n in names], captions=[f"about {n}" for n in names],
                   caption_image=np.arange(len(names)), splits={"all": np.arange(len(names))})


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory) -> Path:
    """One folder of exported graphs for the module: each backbone is exported once."""
    return tmp_path_factory.mktemp("onnx")


def _extract(path, onnx_dir, **overrides):
    options = ExtractOptions(**{"backbone": "tiny", "batch_size": 2, "workers": 0, "shard_size": 2,
                                "onnx_dir": str(onnx_dir), **overrides})
    result = extract_features(_dataset(PHOTOS), path, options=options)
    with FeatureCache(result.path) as cache:
        return cache.features[...], dict(cache.attrs)


@pytest.mark.parametrize("backbone, crops", [
    ("tiny", 1), ("tiny", 10),
    pytest.param("efficientnet-lite0", 1, marks=pytest.mark.slow),
    pytest.param("efficientnet-lite0", 10, marks=pytest.mark.slow),
    pytest.param("efficientnet-lite1", 1, marks=pytest.mark.slow),
    pytest.param("efficientnet-lite2", 1, marks=pytest.mark.slow)])
def test_both_engines_give_the_same_features_on_real_photos(tmp_path, onnx_dir, backbone, crops):
    """Every backbone that works offline (10 crops: the same forward on 10× the batch)."""
    got = {}
    for engine in ("torch", "onnxruntime"):
        got[engine], attrs = _extract(tmp_path / f"{engine}.h5", onnx_dir, backbone=backbone,
                                      crops=crops, engine=engine)
        assert attrs["engine"] == engine and attrs["precision"] == "float32"
        assert attrs["engine_version"] == engines.engine_version(engine)
    assert np.abs(got["torch"]).max() > 0.1  # real activations, not an empty pipeline
    difference = np.abs(got["onnxruntime"] - got["torch"]).max()
    assert difference <= engines.EXPORT_TOLERANCE, difference


def test_auto_is_onnxruntime_on_a_cpu_and_torch_on_a_gpu(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert engines.resolve_engine("auto", cpu) == "onnxruntime"
    assert engines.resolve_engine("auto", gpu) == "torch"
    assert engines.resolve_engine("torch", cpu) == "torch"
    with pytest.raises(VseError, match="--engine onnxruntime runs on the CPU, not cuda:0"):
        engines.resolve_engine("onnxruntime", gpu)
    with pytest.raises(VseError, match="unknown engine 'tensorrt'"):
        engines.resolve_engine("tensorrt", cpu)
    monkeypatch.setattr(engines, "onnxruntime_installed", lambda: False)
    assert engines.resolve_engine("auto", cpu) == "torch"
    with pytest.raises(VseError,
                       match=r"needs the packages onnx and onnxruntime \(pip install 'vse\[onnx\]'\)"):
        engines.resolve_engine("onnxruntime", cpu)


def test_the_exported_graph_is_built_once_per_weights_and_input_size(tmp_path, monkeypatch):
    backbone = load_backbone("tiny")
    engine = engines.build_engine("onnxruntime", backbone, torch.device("cpu"), tmp_path)
    assert engine.graph == tmp_path / f"tiny-{backbone.weights_sha256[:16]}-64.onnx"
    assert sorted(p.name for p in tmp_path.iterdir()) == [engine.graph.name]  # no temporaries
    built = engine.graph.stat().st_mtime_ns

    def no_export(*args):
        raise AssertionError("exported again")

    monkeypatch.setattr(engines, "export_graph", no_export)
    again = engines.build_engine("onnxruntime", load_backbone("tiny"), torch.device("cpu"), tmp_path)
    assert engine.graph.stat().st_mtime_ns == built
    x = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(1))  # any batch size
    with torch.inference_mode():
        expected = backbone.module(x)
    torch.testing.assert_close(again(x), expected, atol=engines.EXPORT_TOLERANCE, rtol=0)


def test_a_graph_that_cannot_be_cached_runs_from_memory(tmp_path):
    (tmp_path / "a file").write_bytes(b"")
    unwritable = tmp_path / "a file" / "onnx"  # its parent is a file: the folder cannot exist
    backbone = load_backbone("tiny")
    engine = engines.build_engine("onnxruntime", backbone, torch.device("cpu"), unwritable)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = backbone.module(x)
    torch.testing.assert_close(engine(x), expected, atol=engines.EXPORT_TOLERANCE, rtol=0)
    # a loader worker's one-thread copy runs from the same bytes
    torch.testing.assert_close(engine.with_threads(1)(x), expected, atol=engines.EXPORT_TOLERANCE, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file"]


def test_onnxruntime_in_loader_workers_gives_the_features_of_one_session(tmp_path, onnx_dir, monkeypatch):
    """Decode + engine in 2 worker processes (one thread each), ORT calls split into pieces
    of 7 inputs, against one multi-threaded session in the main process fed whole batches.
    Bit-identical here; the tolerance is the engines' (threads may change float sums)."""
    reference, _ = _extract(tmp_path / "main.h5", onnx_dir, engine="onnxruntime", crops=10, workers=0)
    monkeypatch.setattr(engines, "ORT_BATCH", 7)  # 2 images × 10 crops = 20 inputs: 3 calls
    from pipeline.data import extract

    made, real_init = [], extract._EncodedBatches.__init__

    def init(self, *args):  # the batches the workers encode are built here, in this process
        made.append(args[-1])
        real_init(self, *args)

    monkeypatch.setattr(extract._EncodedBatches, "__init__", init)
    got, attrs = _extract(tmp_path / "workers.h5", onnx_dir, engine="onnxruntime", crops=10, workers=2)
    assert made == [extract.engine_threads_per_worker(2)]  # the engine ran in the workers
    assert attrs["engine"] == "onnxruntime" and got.shape == reference.shape
    np.testing.assert_allclose(got, reference, atol=engines.EXPORT_TOLERANCE, rtol=0)
    engine = engines.build_engine("onnxruntime", load_backbone("tiny"), torch.device("cpu"), onnx_dir)
    x = torch.randn(20, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    whole = torch.cat([engine(x[i:i + 1]) for i in range(20)])  # one input per call
    torch.testing.assert_close(engine(x), whole, atol=engines.EXPORT_TOLERANCE, rtol=0)  # calls of 7


def test_a_broken_graph_file_is_named_not_used(tmp_path):
    backbone = load_backbone("tiny")
    graph = engines.graph_path(backbone, tmp_path)
    graph.write_bytes(b"not an onnx graph")
    with pytest.raises(VseError, match="ONNX Runtime cannot load the graph") as info:
        engines.build_engine("onnxruntime", backbone, torch.device("cpu"), tmp_path)
    assert str(graph) in str(info.value) and "delete the file to rebuild it" in str(info.value)
    assert graph.read_bytes() == b"not an onnx graph"


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing catches it."""


def test_a_run_is_resumed_only_by_the_engine_that_started_it(tmp_path, onnx_dir, monkeypatch):
    out = tmp_path / "f.h5"
    real_write = ShardedWriter.write_shard

    def write_then_die(self, index, features, bad_rows=()):
        if index == 1:
            raise _Killed
        real_write(self, index, features, bad_rows)

    monkeypatch.setattr(ShardedWriter, "write_shard", write_then_die)
    with pytest.raises(_Killed):
        _extract(out, onnx_dir, engine="torch")
    monkeypatch.setattr(ShardedWriter, "write_shard", real_write)
    shard0 = (shards_dir(out) / "shard-00000.h5").read_bytes()

    with pytest.raises(VseError) as info:
        _extract(out, onnx_dir, engine="auto")  # auto is onnxruntime here
    message = str(info.value)
    assert "were computed by the torch engine; resume with --engine torch" in message
    assert "start over with onnxruntime" in message and str(out) in message
    assert (shards_dir(out) / "shard-00000.h5").read_bytes() == shard0  # nothing lost

    features, attrs = _extract(out, onnx_dir, engine="torch")
    reference, _ = _extract(tmp_path / "ref.h5", onnx_dir, engine="torch")
    assert attrs["engine"] == "torch" and features.tobytes() == reference.tobytes()
    # another configuration (here: 10 crops) is a new cache, whatever engine made the old one
    _, attrs = _extract(out, onnx_dir, engine="onnxruntime", crops=10)
    assert attrs["engine"] == "onnxruntime" and attrs["crops"] == 10


def test_cli_engine_option_and_graph_beside_the_cache(tmp_path):
    root = tmp_path / "f8k"
    (root / "images").mkdir(parents=True)
    for name in PHOTOS:
        (root / "images" / name).symlink_to(IMAGES / name)
    (root / "Flickr8k.token.txt").write_text(
        "".join(f"{n}#{k}\tA caption {k} .\n" for n in PHOTOS for k in range(5)))
    for split, name in zip(("train", "dev", "test"), PHOTOS):
        (root / f"Flickr_8k.{split}Images.txt").write_text(f"{name}\n")
    out = tmp_path / "cache" / "f.h5"
    args = ["extract", "--dataset", "flickr8k", "--root", str(root), "--backbone", "tiny",
            "--workers", "0", "--quiet", "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--engine", "onnxruntime"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (out.parent / "onnx").iterdir()] == [
        engines.graph_path(load_backbone("tiny"), out.parent / "onnx").name]
    info = CliRunner().invoke(cli, ["info", str(out)])
    assert "engine: onnxruntime" in info.output
    bad = CliRunner().invoke(cli, [*args, "--engine", "tvm"])
    assert bad.exit_code == 2 and "'tvm' is not one of 'auto', 'torch', 'onnxruntime'" in bad.output
    assert os.path.exists(out)
