"""The HDF5 feature cache: sharded writing, validation on open, row reads, checks."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from pipeline.core.errors import VseError
from pipeline.data.cache import FORMAT, FeatureCache, ShardedWriter, shards_dir, write_cache
from pipeline.data.caption_index import CaptionIndex

N, D = 23, 6


def _contents(seed=0):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((N, D)).astype(np.float32)
    ids = [f"img{i:03d}.jpg" for i in range(N)]
    # a variable number of captions per image (0..3), grouped by image
    counts = rng.integers(0, 4, N)
    caption_image = np.repeat(np.arange(N), counts)
    captions = [f"caption {j} of image {i} – ünïcode" for j, i in enumerate(caption_image)]
    splits = {"train": np.arange(15), "test": np.array([22, 16, 18, 15, 20])}
    return features, ids, captions, caption_image, splits


@pytest.fixture
def cache_path(tmp_path):
    features, ids, captions, caption_image, splits = _contents()
    return write_cache(tmp_path / "c.h5", features, ids, captions, caption_image, splits,
                       attrs={"backbone": "synthetic", "mean": [0.5, 0.5, 0.5]}, shard_size=5)


def test_round_trip_through_shards(cache_path):
    features, ids, captions, caption_image, splits = _contents()
    assert sorted(p.name for p in shards_dir(cache_path).iterdir()) == [
        f"shard-{i:05d}.h5" for i in range(5)]  # 23 rows / 5 per shard
    with FeatureCache(cache_path) as cache:
        assert cache.features.is_virtual
        np.testing.assert_array_equal(cache.features[...], features)
        assert cache.image_ids == ids and cache.captions == captions
        np.testing.assert_array_equal(cache.caption_image, caption_image)
        np.testing.assert_array_equal(cache.split("test"), splits["test"])
        assert cache.feature_dim == D and cache.num_images == N
        assert cache.attrs["format"] == FORMAT and cache.attrs["format_version"] == 1
        assert cache.attrs["backbone"] == "synthetic" and cache.attrs["mean"] == [0.5, 0.5, 0.5]
        assert cache.attrs["num_captions"] == len(captions)
        assert len(cache.bad_images) == 0


def test_read_rows_in_any_order_sparse_and_dense(cache_path):
    features = _contents()[0]
    with FeatureCache(cache_path) as cache:
        for rows in ([7, 3, 3, 22], np.arange(N)[::-1], np.r_[0:N, 5, 5, 0]):
            np.testing.assert_array_equal(cache.read(rows), features[np.asarray(rows)])
        with pytest.raises(IndexError):
            cache.read([N])


def test_split_captions_match_a_slow_loop(cache_path):
    with FeatureCache(cache_path) as cache:
        for name in cache.split_names:
            expected = [j for i in cache.split(name) for j in range(len(cache.captions))
                        if cache.caption_image[j] == i]
            assert cache.split_captions(name).tolist() == expected
        with pytest.raises(VseError, match=r"no split 'val' \(splits: train, test\)"):
            cache.split("val")


def test_moved_folder_still_reads(cache_path, tmp_path):
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(cache_path, moved / cache_path.name)
    shutil.move(shards_dir(cache_path), shards_dir(moved / cache_path.name))
    with FeatureCache(moved / cache_path.name) as cache:
        np.testing.assert_array_equal(cache.features[...], _contents()[0])


def _expect_error(path, pattern):
    with pytest.raises(VseError, match=pattern) as info:
        FeatureCache(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_missing_incomplete_or_foreign_shards_are_refused(cache_path, tmp_path):
    shard = shards_dir(cache_path) / "shard-00002.h5"
    backup = tmp_path / "backup.h5"
    shutil.copy(shard, backup)

    shard.unlink()
    _expect_error(cache_path, r"missing shard c\.h5\.shards/shard-00002\.h5 \(rows 10\.\.14\)")

    shutil.copy(backup, shard)
    with h5py.File(shard, "r+") as f:
        f.attrs["complete"] = False
    _expect_error(cache_path, "incomplete shard")

    shutil.copy(backup, shard)
    with h5py.File(shard, "r+") as f:
        f.attrs["config_fingerprint"] = "another run"
    _expect_error(cache_path, "comes from a different run")

    shard.write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    _expect_error(cache_path, "unreadable shard")


def test_broken_combined_files_are_refused(cache_path, tmp_path):
    _expect_error(tmp_path / "absent.h5", "feature cache not found")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5 at all")
    _expect_error(junk, "not a readable HDF5 file")
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(cache_path.read_bytes()[:2000])
    _expect_error(truncated, "not a readable HDF5 file")
    with h5py.File(cache_path, "r+") as f:
        f.attrs["num_images"] = N + 1
    _expect_error(cache_path, "num_images attribute is 24, expected 23")
    with h5py.File(cache_path, "r+") as f:
        f.attrs["format"] = "something-else"
    _expect_error(cache_path, "not a vse feature cache")


def test_check_reports_nan_inf_and_unexplained_zero_rows(tmp_path):
    features, ids, captions, caption_image, splits = _contents()
    features[4, 2] = np.nan
    features[9, 0] = np.inf
    features[[11, 17]] = 0.0  # row 17 is a recorded unreadable image, row 11 is not
    path = write_cache(tmp_path / "c.h5", features, ids, captions, caption_image, splits,
                       shard_size=5, bad_images=[17])
    with FeatureCache(path) as cache:
        report = cache.check()
        assert report.nan_rows.tolist() == [4] and report.inf_rows.tolist() == [9]
        assert report.zero_rows.tolist() == [11, 17] and report.bad_images.tolist() == [17]
        assert report.missing_rows.tolist() == []
        assert not report.ok and len(report.problems) == 3
        assert "1 all-zero rows that are not recorded bad images (first rows: 11)" in report.summary()

    clean = write_cache(tmp_path / "ok.h5", _contents()[0], ids, captions, caption_image, splits)
    with FeatureCache(clean) as cache:
        assert cache.check().ok


def _writer(tmp_path, **config):
    return ShardedWriter(tmp_path / "w.h5", num_rows=7, feature_dim=3, shard_size=3,
                         config={"run": 1, **config})


def test_a_shard_counts_only_when_complete_right_sized_and_of_this_config(tmp_path):
    writer = _writer(tmp_path)
    assert writer.bounds == [(0, 3), (3, 6), (6, 7)]
    assert not writer.is_complete(0)
    writer.write_shard(0, np.ones((3, 3)))
    assert writer.is_complete(0)
    assert not _writer(tmp_path, run=2).is_complete(0)  # another configuration
    assert not ShardedWriter(tmp_path / "w.h5", 7, 3, 2, {"run": 1}).is_complete(0)  # other rows
    writer.shard_path(1).write_bytes(b"half a file")
    assert not writer.is_complete(1)
    with pytest.raises(ValueError):
        writer.write_shard(2, np.ones((2, 3)))
    with pytest.raises(VseError, match="shard is missing or incomplete"):
        writer.finish(CaptionIndex([f"i{k}" for k in range(7)], [], [], {}), {})
    assert not writer.out.exists()  # the combined file appears only when every shard is there


def test_finish_removes_leftovers_and_stale_combined_files(tmp_path):
    big = ShardedWriter(tmp_path / "w.h5", 9, 3, 3, {"run": 0})
    for i in range(3):
        big.write_shard(i, np.zeros((3, 3)) + i, bad_rows=[3 * i])
    big.finish(CaptionIndex([f"i{k}" for k in range(9)], [], [], {}), {})
    (shards_dir(big.out) / ".shard-00001.h5.1234.tmp").write_bytes(b"killed mid-write")

    writer = _writer(tmp_path)
    writer.discard_stale_combined()
    assert not writer.out.exists()  # from another configuration
    for i, (start, stop) in enumerate(writer.bounds):
        writer.write_shard(i, np.full((stop - start, 3), i + 1.0))
    writer.finish(CaptionIndex([f"i{k}" for k in range(7)], ["a", "b"], [0, 6],
                             {"all": np.arange(7)}), {"backbone": "x"})
    assert sorted(p.name for p in shards_dir(writer.out).iterdir()) == [
        "shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]
    with FeatureCache(writer.out) as cache:
        assert cache.features[:, 0].tolist() == [1, 1, 1, 2, 2, 2, 3]
        assert cache.bad_images.tolist() == []
    writer.discard_stale_combined()
    assert writer.out.exists()  # same configuration: kept
