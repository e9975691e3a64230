"""Set-valued image features (VSE∞): caches whose rows are sets of vectors — CNN grids from
`vse extract --grid`, and the field's precomputed regions read where they lie."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import DEMO_DATA, demo_captions, train, vse, write_feature_cache

from pipeline.core.errors import VseError
from pipeline.data.cache import FeatureCache

# ---------------------------------------------------------------------------- precomputed regions


def regions_folder(root: Path, sizes=(("train", 8), ("dev", 2), ("test", 2)), k=36, d=16, seed=0) -> dict:
    """A SCAN / VSE∞ precomp folder: {split}_ims.npy (N, K, D) float32 and {split}_caps.txt with 5
    real captions per image. Returns the arrays by split."""
    root.mkdir(parents=True, exist_ok=True)
    _, captions = demo_captions(sum(n for _, n in sizes))
    rng, arrays, start = np.random.default_rng(seed), {}, 0
    for split, n in sizes:
        arrays[split] = rng.standard_normal((n, k, d)).astype(np.float32)
        np.save(root / f"{split}_ims.npy", arrays[split])
        (root / f"{split}_caps.txt").write_text("\n".join(captions[5 * start:5 * (start + n)]) + "\n")
        start += n
    return arrays


def test_regions_are_read_in_place_never_copied(tmp_path):
    arrays = regions_folder(tmp_path / "precomp")
    out = tmp_path / "regions.h5"
    result = vse("extract", "--dataset", "vsepp-precomp", "--root", tmp_path / "precomp", "--out", out)
    assert result.exit_code == 0, result.output
    assert "12 images × 36 × 16 (sets) (no copy" in result.output
    assert out.stat().st_size < 64_000 and not Path(f"{out}.shards").exists()  # 221 kB of regions stay put
    with FeatureCache(out) as cache:
        assert cache.is_set and (cache.set_size, cache.feature_dim) == (36, 16) and cache.dtype == np.float32
        everything = np.concatenate([arrays[s] for s in ("train", "dev", "test")])
        np.testing.assert_array_equal(cache.read([11, 0, 9, 0]), everything[[11, 0, 9, 0]])
        np.testing.assert_array_equal(cache.read(np.arange(12)), everything)
        assert cache.split_captions("test").tolist() == list(range(50, 60))
    info = vse("info", out)
    assert info.exit_code == 0 and "12 rows of sets of 36 × 16 (read in place" in info.output
    # the cache and its folder move together; a missing array is named in one line
    shutil.move(tmp_path / "precomp", tmp_path / "moved" / "precomp")
    shutil.move(out, tmp_path / "moved" / "regions.h5")
    with FeatureCache(tmp_path / "moved" / "regions.h5") as cache:
        np.testing.assert_array_equal(cache.read([3]), arrays["train"][[3]])
    (tmp_path / "moved" / "precomp" / "dev_ims.npy").unlink()
    with pytest.raises(VseError, match=r"dev_ims.npy, which is missing \(the cache and the files it names "
                                       r"move together; import them again, it copies nothing\)"):
        FeatureCache(tmp_path / "moved" / "regions.h5")


def test_a_region_file_replaced_after_import_is_refused_by_train_resume_evaluate(tmp_path):
    """Rows read in place: another array of the same shape under the same name is noticed (its size
    and sampled blocks are recorded at import), by every command that opens the cache."""
    regions_folder(tmp_path / "precomp")
    out = tmp_path / "regions.h5"
    assert vse("extract", "--dataset", "vsepp-precomp", "--root", tmp_path / "precomp", "--out",
               out).exit_code == 0
    run = ["--features", out, "--image-pool", "mean", "--val-split", "dev"]
    assert train(out, tmp_path / "run", *run[2:]).exit_code == 0
    changed = tmp_path / "precomp" / "train_ims.npy"
    imported = np.load(changed)
    np.save(changed, imported[::-1].copy())  # the same shape and size, other rows
    with pytest.raises(VseError, match=r"train_ims.npy: changed since the cache .*regions.h5 was imported"):
        FeatureCache(out)
    for args in (["train", *run, "--run-dir", tmp_path / "run", "--resume", "--epochs", 2],
                 ["evaluate", "--checkpoint", tmp_path / "run" / "best.pt", "--features", out]):
        result = vse(*args)
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines()[-1].startswith(f"error: {changed}: changed since")
    np.save(changed, imported)  # the imported array again: accepted
    FeatureCache(out).close()


@pytest.mark.parametrize("array,problem", [
    (np.zeros((2, 36, 16), np.float32), "does not match 20 captions (region sets come one per image: "
                                        "expected 4 rows)"),
    (np.zeros((4, 0, 16), np.float32), "a set of regions needs K >= 1 members of D >= 1"),
    (np.zeros((4, 36, 16, 2), np.float32), "not (rows, D) vectors nor (rows, K, D) sets of regions"),
    (np.zeros((4, 36, 16), np.int32), "regions must be a C-order float32 or float16 array, not int32"),
])
def test_bad_region_arrays_are_one_line_errors_and_nothing_is_written(tmp_path, array, problem):
    regions_folder(tmp_path / "precomp", sizes=(("test", 4),))
    np.save(tmp_path / "precomp" / "test_ims.npy", array)
    out = tmp_path / "regions.h5"
    result = vse("extract", "--dataset", "vsepp-precomp", "--root", tmp_path / "precomp", "--out", out)
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1
    assert result.output.startswith(f"error: {tmp_path / 'precomp' / 'test_ims.npy'}: ")
    assert problem in result.output
    assert not out.exists()


def test_a_split_file_missing_is_named(tmp_path):
    regions_folder(tmp_path / "precomp", sizes=(("test", 4),))
    (tmp_path / "precomp" / "test_ims.npy").unlink()
    result = vse("extract", "--dataset", "vsepp-precomp", "--root", tmp_path / "precomp",
                 "--out", tmp_path / "x.h5")
    assert (result.exit_code, result.output) == (1, f"error: {tmp_path / 'precomp' / 'test_ims.npy'}: "
                                                    "file not found\n")


# ---------------------------------------------------------------------------- CNN grids


def _extract(out, *extra, root=DEMO_DATA):
    return vse("extract", "--dataset", "flickr8k", "--root", root, "--out", out, "--quiet", "--device", "cpu",
               *extra)


@pytest.fixture(scope="module")
def few_images(tmp_path_factory) -> Path:
    """The first 10 demo images (real photos) in the flickr8k layout, all in the test split."""
    root = tmp_path_factory.mktemp("few")
    names = sorted(p.name for p in (DEMO_DATA / "images").iterdir())[:10]
    (root / "images").mkdir()
    for name in names:
        (root / "images" / name).symlink_to(DEMO_DATA / "images" / name)
    tokens = [line for line in (DEMO_DATA / "Flickr8k.token.txt").read_text().splitlines()
              if line.split("#")[0] in names]
    (root / "Flickr8k.token.txt").write_text("\n".join(tokens) + "\n")
    for split in ("train", "dev"):
        (root / f"Flickr_8k.{split}Images.txt").write_text("")
    (root / "Flickr_8k.testImages.txt").write_text("\n".join(names) + "\n")
    return root


@pytest.mark.slow
def test_a_grid_is_the_map_whose_mean_is_the_pooled_feature(few_images, tmp_path):
    pooled, grid = tmp_path / "pooled.h5", tmp_path / "grid.h5"
    assert _extract(pooled, root=few_images).exit_code == 0
    result = _extract(grid, "--grid", root=few_images)
    assert result.exit_code == 0, result.output
    assert "10 images × 49 × 1280 (sets)" in result.output
    with FeatureCache(pooled) as p, FeatureCache(grid) as g:
        assert g.is_set and g.set_size == 49 and g.attrs["grid"] == [7, 7] and g.dtype == np.float16
        mean = g.read(np.arange(10)).astype(np.float32).mean(axis=1)
        vectors = p.read(np.arange(10))
        # float16 members: their mean is the pooled feature to half precision (relative 1e-3)
        np.testing.assert_allclose(mean, vectors, rtol=1e-3, atol=1e-3)
        assert g.attrs["config_fingerprint"] != p.attrs["config_fingerprint"]
    info = vse("info", grid)
    assert "features: 10 × 49 × 1280 float16, 10 rows of sets of 49 × 1280 (grid 7 × 7)" in info.output
    again = _extract(grid, "--grid", root=few_images)  # resumable: the complete shard is reused
    assert "0 computed here, 1 reused" in again.output
    bigger = _extract(tmp_path / "x2.h5", "--grid", "--input-scale", "2", root=few_images)
    assert bigger.exit_code == 0 and "10 images × 196 × 1280 (sets)" in bigger.output


@pytest.mark.slow
def test_both_engines_give_the_same_grid(few_images, tmp_path):
    sets = {}
    for engine in ("torch", "onnxruntime"):
        result = _extract(tmp_path / f"{engine}.h5", "--grid", "--engine", engine, root=few_images)
        assert result.exit_code == 0, result.output
        with FeatureCache(tmp_path / f"{engine}.h5") as cache:
            sets[engine] = cache.read(np.arange(10)).astype(np.float32)
            assert cache.attrs["engine"] == engine
    # the engines' 1e-4, then float16 storage: a rounding step apart at most (2^-10 relative)
    np.testing.assert_allclose(sets["torch"], sets["onnxruntime"], rtol=2e-3, atol=1e-4)
    assert any(p.name.endswith("-224-grid.onnx") for p in (tmp_path / "onnx").iterdir())


def test_grid_refusals(tmp_path):
    result = _extract(tmp_path / "x.h5", "--grid", "--crops", "10", "--backbone", "tiny")
    assert result.exit_code == 1 and "--grid takes --crops 1" in result.output
    assert not (tmp_path / "x.h5").exists()
    result = _extract(tmp_path / "x.h5", "--input-scale", "0", "--backbone", "tiny")
    assert result.exit_code == 1 and "--input-scale must be a positive number, not 0.0" in result.output


def test_nan_in_a_set_is_named_by_vse_info(tmp_path):
    ids, captions = demo_captions(4)
    sets = np.random.default_rng(0).standard_normal((4, 6, 8)).astype(np.float32)
    sets[2, 5, 3] = np.nan
    cache = write_feature_cache(tmp_path / "nan.h5", sets, captions, np.repeat(np.arange(4), 5),
                                {"test": np.arange(4)}, image_ids=ids)
    result = vse("info", cache)
    assert result.exit_code == 1 and "broken cache" in result.output and "NaN" in result.output
    with FeatureCache(cache) as c:
        assert c.check().nan_rows.tolist() == [2] and c.dtype == np.float16  # write_cache stores sets in f16


# ---------------------------------------------------------------------------- training on sets

SET_TRAIN = ("--epochs", 1, "--embed-dim", 16, "--word-dim", 8, "--batch-size", 16, "--lr", 5e-3,
             "--min-word-count", 1, "--val-every", 0, "--workers", 0, "--device", "cpu")


@pytest.fixture(scope="module")
def set_cache(tmp_path_factory) -> Path:
    """40 real demo images' captions; each image a set of K = 6 members: its learnable vector
    (conftest.learnable_features) plus member noise, as a 2 × 3 grid."""
    from conftest import learnable_features

    ids, captions = demo_captions(40)
    caption_image = np.repeat(np.arange(40), 5)
    base = learnable_features(captions, caption_image, 40, dim=24)
    rng = np.random.default_rng(1)
    sets = base[:, None, :] + 0.3 * rng.standard_normal((40, 6, 24)).astype(np.float32)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    path = tmp_path_factory.mktemp("sets") / "sets.h5"
    return write_feature_cache(path, sets, captions, caption_image, splits, image_ids=ids, grid=[2, 3])


@pytest.fixture(scope="module")
def set_relevance(set_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rel") / "svd.h5"
    assert vse("relevance", "--features", set_cache, "--method", "svd", "--k", 8, "--out", out).exit_code == 0
    return out


def _records(run: Path) -> list[dict]:
    import json

    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("loss", ["sh", "mh", "order", "lseh", "ladder", "csn", "cmn", "mvn"])
def test_every_loss_trains_on_sets_and_keeps_its_pool_weights(set_cache, set_relevance, tmp_path, loss):
    import torch

    extra = ("--relevance", set_relevance) if loss in ("lseh", "ladder") else ()
    result = vse("train", "--features", set_cache, "--run-dir", tmp_path / "r", "--loss", loss,
                 "--image-pool", "gpo", *extra, *SET_TRAIN)
    assert result.exit_code == 0, result.output
    (record,) = _records(tmp_path / "r")
    assert np.isfinite(record["rsum"]) and record["epoch"] == 1
    weights = torch.load(tmp_path / "r" / "best.pt", weights_only=True)["pool_weights"]["image"]
    assert len(weights) == 6 and all(abs(sum(row) - 1) < 1e-5 for row in weights)  # one row per set size


def test_a_resumed_set_run_equals_an_uninterrupted_one(set_cache, tmp_path):
    """The size augmentation draws from the run's torch RNG, which a checkpoint restores."""
    import torch

    common = ("--image-pool", "gpo", "--loss", "mh", *SET_TRAIN[2:], "--seed", 3)
    straight = vse("train", "--features", set_cache, "--run-dir", tmp_path / "a", "--epochs", 3, *common)
    assert straight.exit_code == 0, straight.output
    first = vse("train", "--features", set_cache, "--run-dir", tmp_path / "b", "--epochs", 1, *common)
    assert first.exit_code == 0, first.output
    resumed = vse("train", "--run-dir", tmp_path / "b", "--resume", "--epochs", 3)
    assert resumed.exit_code == 0, resumed.output
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    a, b = (torch.load(tmp_path / r / "last.pt", weights_only=True)["model"] for r in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_augmentation_runs_in_training_only(set_cache):
    import torch

    from pipeline.data.cache import FeatureCache as Cache
    from pipeline.networks.vse_model import ModelConfig, VSEModel

    cfg = dict(feature_dim=24, embed_dim=8, vocab_size=0, text_dim=4, image_pool="gpo")
    model = VSEModel(ModelConfig(**cfg, size_augment="grid"))
    plain = VSEModel(ModelConfig(**cfg, size_augment=None))
    plain.load_state_dict(model.state_dict())
    with Cache(set_cache) as cache:
        x = torch.from_numpy(cache.read(np.arange(8))).float()
    model.eval(), plain.eval()
    assert torch.equal(model.image_encoder(x), plain.image_encoder(x))
    model.train(), plain.train()
    torch.manual_seed(0)
    assert not torch.allclose(model.image_encoder(x), plain.image_encoder(x))


def test_plugin_pool_text_pools_and_evaluation(set_cache, tmp_path):
    run = tmp_path / "attn"
    result = vse("train", "--features", set_cache, "--run-dir", run, "--image-pool",
                 "examples/attention_pool.py:AttentionPool", "--text-pool", "gpo", *SET_TRAIN)
    assert result.exit_code == 0, result.output  # a user's image pool and VSE∞'s BiGRU + GPO
    evaluated = vse("evaluate", "--checkpoint", run / "best.pt", "--features", set_cache, "--split", "test",
                    "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert '"rsum"' in evaluated.stdout
    import torch

    kept = torch.load(run / "best.pt", weights_only=True)["pool_weights"]
    assert set(kept) == {"text"}  # the user's attention pool has no rank weights; the BiGRU's GPO has
    plotted = vse("plot", "--runs", run, "--out", tmp_path / "figs")
    assert plotted.exit_code == 0, plotted.output
    assert (tmp_path / "figs" / "pool_weights.png").stat().st_size > 5000


def test_sets_and_vectors_are_never_taken_for_each_other(set_cache, tiny_cache, sh_run, tmp_path):
    wants_sets = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "a", "--image-pool", "gpo",
                     *SET_TRAIN)
    assert wants_sets.exit_code == 1 and "one vector per image" in wants_sets.stderr
    assert len(wants_sets.stderr.strip().splitlines()) == 1 and not (tmp_path / "a" / "last.pt").exists()
    wants_vectors = vse("train", "--features", set_cache, "--run-dir", tmp_path / "b", *SET_TRAIN)
    assert wants_vectors.exit_code == 1 and "--image-pool" in wants_vectors.stderr
    evaluated = vse("evaluate", "--checkpoint", sh_run / "best.pt", "--features", set_cache,
                    "--split", "test")
    assert evaluated.exit_code == 1 and "holds sets" in evaluated.stderr
