"""Hard edges of the newest commands (issue 40): a user's plug-in that breaks is one line naming its
file (a bug of vse keeps its traceback); `vse evaluate --keep-evaluated` keeps only rows that are
still true and complete; a noisy run never trains on other noise than the index it kept, and an
index drawn for another split is refused; `vse sweep --name` is one folder and a sweep run again
with other options is refused; a loss option outside its range is refused; `--shortlist` names the
checkpoint at fault."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import demo_captions, learnable_features, train_run, vse, write_feature_cache

from pipeline.core.errors import VseError

TINY = ("--embed-dim", 8, "--word-dim", 8, "--batch-size", 16, "--min-word-count", 1, "--val-every", 0,
        "--workers", 0, "--device", "cpu", "--epochs", 1)


def one_line(result) -> str:
    """The stderr of a refused command: exit status 1 and exactly one line (no traceback)."""
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> Path:
    """40 demo images' captions, each image a set of 6 learnable members (as tests/test_networks.py)."""
    ids, captions = demo_captions(40)
    caption_image = np.repeat(np.arange(40), 5)
    base = learnable_features(captions, caption_image, 40, dim=24)
    noise = np.random.default_rng(1).standard_normal((40, 6, 24)).astype(np.float32)
    members = base[:, None, :] + 0.3 * noise
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    return write_feature_cache(tmp_path_factory.mktemp("sets") / "sets.h5", members, captions, caption_image,
                               splits, image_ids=ids, grid=[2, 3])


# ---------------------------------------------------------------------------- 1. plug-ins that break
NETWORK = '''
import torch
from torch import nn
from pipeline.networks.network import PairwiseNetwork


class Net(PairwiseNetwork):
    def __init__(self, config):
        super().__init__(config)
        self.img = nn.Linear(config.feature_dim, config.embed_dim)
        self.txt = nn.Embedding(config.vocab_size, config.embed_dim)

    def encode_images(self, images):
        return self.img(images).mean(1)

    def encode_captions(self, captions, lengths):
        mask = (torch.arange(captions.shape[1])[None] < lengths[:, None]).float()
        return (self.txt(captions) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)

    def score(self, image_block, caption_block):
        return image_block @ caption_block.T


class Typo(Net):
    def __init__(self, config):
        super().__init__(config)
        self.width = config.embed_dimm  # a typo: AttributeError


class OneColumn(Net):
    def forward(self, images, captions, lengths):
        return super().forward(images, captions, lengths)[:, :1]  # (B, 1)


class RaisesInScore(Net):
    def score(self, image_block, caption_block):
        return image_block @ caption_block  # no .T: torch raises inside the user's score
'''


def test_a_network_whose_init_raises_any_error_is_one_line_naming_the_file(sets, tmp_path):
    path = tmp_path / "my_net.py"
    path.write_text(NETWORK)
    for result in (vse("check-network", f"{path}:Typo", "--words"),
                   vse("train", "--features", sets, "--run-dir", tmp_path / "r", "--network", f"{path}:Typo",
                       *TINY)):
        line = one_line(result)
        assert line.startswith(f"error: {path}: cannot build network {path}:Typo: AttributeError")
        assert "embed_dimm" in line and "line 27, in __init__" in line
    assert not (tmp_path / "r" / "last.pt").exists()


def test_a_network_whose_scores_are_not_b_by_b_is_one_line_naming_it_and_the_shape(sets, tmp_path):
    path = tmp_path / "my_net.py"
    path.write_text(NETWORK)
    line = one_line(vse("train", "--features", sets, "--run-dir", tmp_path / "r", "--network",
                        f"{path}:OneColumn", *TINY))
    assert f"network {path}:OneColumn returned scores of shape (16, 1) for a batch of 16 pairs" in line


def test_an_error_inside_a_plugins_code_while_training_is_one_line_naming_its_line(sets, tmp_path):
    path = tmp_path / "my_net.py"
    path.write_text(NETWORK)
    line = one_line(vse("train", "--features", sets, "--run-dir", tmp_path / "r", "--network",
                        f"{path}:RaisesInScore", *TINY))
    assert line.startswith(f"error: {path}: RuntimeError: ") and "(line 37, in score)" in line


LOSS = '''
import torch
from torch import nn


class Typo(nn.Module):
    def __init__(self, margin=0.2):
        super().__init__()
        self.margin = margn  # NameError


class PerPair(nn.Module):
    def forward(self, img, cap, image_ids=None, relevance=None):
        return 1 - (img * cap).sum(1)  # (B,), not a scalar
'''

POOL = '''
import torch
from torch import nn


class Typo(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = {"dim": dim}["dimension"]  # KeyError


class Halves(nn.Module):
    def __init__(self, dim):
        super().__init__()

    def forward(self, x, lengths):
        return x.mean(1)[:, ::2]  # (B, E / 2)
'''


def test_a_loss_or_pool_plugin_that_breaks_is_one_line_naming_the_file(tiny_cache, tmp_path):
    from pipeline.losses.plugins import make_loss
    from pipeline.networks.heads import build_pool

    loss, pool = tmp_path / "my_loss.py", tmp_path / "my_pool.py"
    loss.write_text(LOSS)
    pool.write_text(POOL)
    with pytest.raises(VseError, match=rf"^{loss}: cannot build {loss}:Typo with options {{}}: NameError"):
        make_loss(f"{loss}:Typo")
    with pytest.raises(VseError, match=rf"^{pool}: cannot build the pool {pool}:Typo .*KeyError: 'dim"):
        build_pool(f"{pool}:Typo", 8)
    halves = build_pool(f"{pool}:Halves", 8)
    with pytest.raises(VseError, match=r"returned shape \(3, 4\) for 3 sets of members of size 8"):
        halves(torch.zeros(3, 5, 8), torch.tensor([5, 2, 1]))
    line = one_line(vse("check-loss", f"{loss}:Typo"))
    assert line.startswith(f"error: {loss}: cannot build") and "NameError" in line
    line = one_line(vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "r", "--loss",
                        f"{loss}:PerPair", *TINY))
    assert f"loss {loss}:PerPair returned shape (16,), not a 0-d tensor" in line
    checked = vse("check-pool", f"{pool}:Halves")
    assert checked.exit_code == 1 and f"{pool}: the pool {pool}:Halves returned shape" in checked.output


def test_only_an_exception_raised_in_a_plugins_code_is_the_users(tmp_path):
    """Raised in the plug-in, or in torch called by it: the user's (file and line); raised in vse's own
    code (a bug of vse, e.g. a check of vse called with a wrong value): None, the traceback stays."""
    from pipeline.core.plugin_import import plugin_class, user_code_error
    from pipeline.core.values import finite

    path = tmp_path / "my_net.py"
    path.write_text(NETWORK)
    cls = plugin_class(f"{path}:RaisesInScore", "network")
    with pytest.raises(RuntimeError) as torch_error:
        cls.score(None, torch.zeros(2, 3), torch.zeros(2, 3))
    error = user_code_error(torch_error.value)
    assert str(error).startswith(f"{path}: RuntimeError: ") and "(line 37, in score)" in str(error)
    with pytest.raises(ValueError) as ours:
        finite("x", "margin")
    assert user_code_error(ours.value) is None


def test_a_sweep_run_whose_plugin_breaks_fails_alone_in_one_line(tiny_cache, tmp_path):
    loss = tmp_path / "my_loss.py"
    loss.write_text(LOSS)
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(f"base: {{features: {tiny_cache}, epochs: 1, embed_dim: 8, word_dim: 8, batch_size: 16, "
                     f"min_word_count: 1, val_every: 0, workers: 0, device: cpu}}\n"
                     f"grid: {{loss: ['{loss}:PerPair', sh]}}\n")
    result = vse("sweep", sweep, "--runs-dir", tmp_path / "runs")
    assert result.exit_code == 1
    assert "failed: loss=" in result.output and "PerPair" in result.output
    assert "returned shape (16,), not a 0-d tensor" in result.output and "trained: loss=sh" in result.output


# ---------------------------------------------------------------------------- 2. --keep-evaluated
@pytest.fixture(scope="module")
def two_runs(tiny_cache, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keep") / "runs"
    for name, loss in (("sh", "sh"), ("mh", "mh")):
        train_run(tiny_cache, root / name, loss=loss, epochs=1)
    return root


def _evaluate(pattern, out, *extra):
    result = vse("evaluate", "--runs", pattern, "--split", "test", "--out", out, "--keep-evaluated", *extra)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _rows(out):
    from pipeline.reports.report import read_results

    return read_results(out)


def _edit(out, change):
    from pipeline.reports.report import write_results

    rows = _rows(out)
    for row in rows:
        change(row)
    write_results(rows, out)


def test_a_relevance_file_rebuilt_in_place_is_evaluated_again(two_runs, tiny_cache, tmp_path):
    from pipeline.relevance import build_relevance

    relevance, out = tmp_path / "svd.h5", tmp_path / "results.csv"
    build_relevance(tiny_cache, "svd", relevance, k=20, device="cpu")
    pattern = str(two_runs / "*")
    first = _evaluate(pattern, out, "--relevance", relevance, "--cs", "3,8")
    assert "0 kept" in first.stderr
    cs = {row["run"]: row["i2t_cs@3"] for row in _rows(out)}
    assert "2 kept" in _evaluate(pattern, out, "--relevance", relevance, "--cs", "3,8").stderr
    build_relevance(tiny_cache, "svd", relevance, k=2, device="cpu", overwrite=True)  # the same path
    again = _evaluate(pattern, out, "--relevance", relevance, "--cs", "3,8")
    assert "0 kept" in again.stderr
    assert {row["run"]: row["i2t_cs@3"] for row in _rows(out)} != cs


def test_a_cache_rebuilt_in_place_is_evaluated_again(tiny_cache, tmp_path):
    """The cache a run trained on (not given to evaluate) is an input too: known by its stored identity."""
    cache = tmp_path / "tiny.h5"
    shutil.copy(tiny_cache, cache)
    shutil.copytree(Path(f"{tiny_cache}.shards"), Path(f"{cache}.shards"))
    train_run(cache, tmp_path / "runs" / "sh", loss="sh", epochs=1)
    out = tmp_path / "results.csv"
    _evaluate(str(tmp_path / "runs" / "*"), out)
    assert "1 kept" in _evaluate(str(tmp_path / "runs" / "*"), out).stderr
    time.sleep(1.05)  # ``created`` counts seconds
    ids, captions = demo_captions(40)
    features = learnable_features(captions, np.repeat(np.arange(40), 5), 40, seed=7)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    write_feature_cache(cache, features, captions, np.repeat(np.arange(40), 5), splits, image_ids=ids,
                        overwrite=True)
    assert "0 kept" in _evaluate(str(tmp_path / "runs" / "*"), out).stderr


def test_a_row_missing_a_column_or_a_value_is_evaluated_again(two_runs, tmp_path):
    out, pattern = tmp_path / "results.csv", str(two_runs / "*")
    _evaluate(pattern, out)
    true = {row["run"]: row["t2i_r5"] for row in _rows(out)}
    _edit(out, lambda row: row.pop("t2i_r5"))  # the column removed from the table
    again = _evaluate(pattern, out)
    assert "0 kept" in again.stderr and {row["run"]: row["t2i_r5"] for row in _rows(out)} == true
    _edit(out, lambda row: row.update(rsum=None) if row["run"] == "sh" else None)  # one cell emptied
    again = _evaluate(pattern, out)
    assert "1 kept" in again.stderr and all(row["rsum"] is not None for row in _rows(out))


# ---------------------------------------------------------------------------- 3. noise
NOISY = ("--loss", "sh", "--embed-dim", 8, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
         "--val-every", 0, "--workers", 0, "--device", "cpu")


def test_a_resume_never_trains_on_other_noise_than_the_index_it_kept(tiny_cache, tmp_path):
    index, run = tmp_path / "idx.npy", tmp_path / "run"
    drawn = vse("noise-index", "--features", tiny_cache, "--rate", 0.4, "--seed", 1, "--out", index)
    assert drawn.exit_code == 0
    first = vse("train", "--features", tiny_cache, "--run-dir", run, "--epochs", 1, "--noise-index", index,
                *NOISY)
    assert first.exit_code == 0, first.output
    kept = (run / "noise_index.npy").read_bytes()
    (run / "noise.json").unlink()  # the note gone, and the source drawn again in place
    assert vse("noise-index", "--features", tiny_cache, "--rate", 0.4, "--seed", 2, "--out", index,
               "--overwrite").exit_code == 0
    line = one_line(vse("train", "--run-dir", run, "--resume", "--epochs", 2))
    assert "is not the one this run trained on" in line and str(run / "noise_index.npy") in line
    assert (run / "noise_index.npy").read_bytes() == kept
    assert json.loads((run / "config.json").read_text())["epochs"] == 1


def test_an_index_drawn_for_another_split_is_refused_whatever_its_length(tiny_cache, tmp_path):
    """A caption-level file of a cache with 8 training images has 40 entries: the length of the
    image-level file of a cache with 40 training images. Its note (FILE.npy.json) tells them apart."""
    ids, captions = demo_captions(48)
    caption_image = np.repeat(np.arange(48), 5)
    wide = write_feature_cache(tmp_path / "wide.h5", learnable_features(captions, caption_image, 48),
                               captions, caption_image, {"train": np.arange(40), "dev": np.arange(40, 44),
                                                         "test": np.arange(44, 48)}, image_ids=ids)
    small_splits = {"train": np.arange(8), "dev": np.arange(8, 10), "test": np.arange(10, 12)}
    small_features = learnable_features(captions[:60], caption_image[:60], 12)
    small = write_feature_cache(tmp_path / "small.h5", small_features, captions[:60], caption_image[:60],
                                small_splits, image_ids=ids[:12])
    index = tmp_path / "small_caption.npy"
    made = vse("noise-index", "--features", small, "--mode", "caption", "--rate", 0.5, "--out", index)
    assert made.exit_code == 0 and (tmp_path / "small_caption.npy.json").is_file(), made.output
    assert len(np.load(index)) == 40
    line = one_line(vse("train", "--features", wide, "--run-dir", tmp_path / "r", "--epochs", 1,
                        "--noise-index", index, *NOISY))
    assert f"{index}: a caption-level index of 40 entries" in line
    shutil.copy(index, tmp_path / "bare.npy")  # no note: read by its length, with a note
    bare = vse("train", "--features", wide, "--run-dir", tmp_path / "b", "--epochs", 1, "--noise-index",
               tmp_path / "bare.npy", *NOISY)
    assert bare.exit_code == 0 and "note: bare.npy is a bare index: read as image-level" in bare.output
    (tmp_path / "bare.npy.json").write_text((tmp_path / "small_caption.npy.json").read_text()
                                            .replace('"caption"', '"image"', 1))
    line = one_line(vse("train", "--features", wide, "--run-dir", tmp_path / "c", "--epochs", 1,
                        "--noise-index", tmp_path / "bare.npy", *NOISY))
    assert "drawn for another training split (split 'train': 40 captions, 8 images" in line


def test_the_noise_index_command_and_a_run_record_what_the_index_was_drawn_for(tiny_cache, tmp_path):
    from pipeline.data.cache import FeatureCache
    from pipeline.data.caption_index import caption_fingerprint

    index = tmp_path / "idx.npy"
    assert vse("noise-index", "--features", tiny_cache, "--rate", 0.2, "--out", index).exit_code == 0
    note = json.loads((tmp_path / "idx.npy.json").read_text())
    with FeatureCache(tiny_cache) as cache:
        train = [c for c, i in zip(cache.captions, cache.caption_image) if i < 24]
    assert note["drawn_for"] == {"split": "train", "training_captions": 120, "training_images": 24,
                                 "caption_fingerprint": caption_fingerprint(train)}
    assert note["layout"] == "caption" and note["sha256"]
    trained = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "r", "--epochs", 1,
                  "--noise-index", index, *NOISY)
    assert trained.exit_code == 0 and "bare index" not in trained.output
    kept = json.loads((tmp_path / "r" / "noise.json").read_text())
    assert kept["drawn_for"] == note["drawn_for"] and kept["sha256"] == note["sha256"]


def test_noise_mode_or_seed_with_a_noise_index_is_refused(tiny_cache, tmp_path):
    index = tmp_path / "idx.npy"
    assert vse("noise-index", "--features", tiny_cache, "--rate", 0.2, "--out", index).exit_code == 0
    for extra in (("--noise-mode", "image"), ("--noise-seed", 3)):
        line = one_line(vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "r", "--noise-index",
                            index, *extra, *NOISY))
        assert f"{extra[0]} describe the draw of --noise-rate" in line


# ---------------------------------------------------------------------------- 4. sweep
def test_a_sweep_name_is_one_plain_folder_and_a_sweep_with_other_options_is_refused(tiny_cache, tmp_path):
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(f"base: {{features: {tiny_cache}, epochs: 1, embed_dim: 8, word_dim: 8, batch_size: 16, "
                     "min_word_count: 1, val_every: 0, workers: 0, device: cpu, loss: sh}\n"
                     "grid: {seed: [0]}\n")
    for name in ("..", "."):
        line = one_line(vse("sweep", sweep, "--runs-dir", tmp_path / "runs", "--name", name, "--dry-run"))
        assert f"sweep name '{name}'" in line
    assert vse("sweep", sweep, "--runs-dir", tmp_path / "runs").exit_code == 0
    again = vse("sweep", sweep, "--runs-dir", tmp_path / "runs", "--epochs", 2, "--dry-run")
    assert again.exit_code == 0 and "unfinished" in again.output  # more epochs: the same runs, continued
    line = one_line(vse("sweep", sweep, "--runs-dir", tmp_path / "runs", "--lr", 0.01))
    assert "1 of its runs were made with other options than this sweep's (first: seed=0: lr 0.01" in line
    listed = vse("sweep", sweep, "--runs-dir", tmp_path / "runs", "--lr", 0.01, "--dry-run")
    assert listed.output.startswith("changed")


# ---------------------------------------------------------------------------- 5. ranges, --shortlist
@pytest.mark.parametrize("loss, options, words", [
    ("infonce", {"max_scale": 0.5}, "max_scale must be >= 1, got 0.5"),
    ("siglip", {"max_scale": 0.99}, "max_scale must be >= 1"),
    ("infonce", {"init_scale": 200.0}, "init_scale must be in [1, 100], got 200.0"),
    ("infonce", {"init_scale": 0.5}, "init_scale must be in [1, 100]"),
    ("mh", {"margin": -0.1}, "margin must be >= 0, got -0.1"),
    ("cmn", {"margin": -0.1}, "margin must be >= 0"),
    ("lseh", {"lambda_": -1.0}, "lambda_ must be >= 0"),
    ("ladder", {"betas": [1.0, -0.25]}, "betas must be >= 0"),
    ("ladder", {"thetas": [1.5]}, "thetas must be in [-1, 1]"),
])
def test_a_loss_option_outside_its_range_is_refused(loss, options, words):
    from pipeline.losses.plugins import make_loss

    with pytest.raises(VseError, match=words.replace("[", r"\[").replace("(", r"\(")):
        make_loss(loss, options)


def test_loss_option_flags_outside_the_range_stop_train_in_one_line(tiny_cache, tmp_path):
    line = one_line(vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "r", "--loss", "infonce",
                        "--loss-option", "max_scale=0.5", *TINY))
    assert "max_scale must be >= 1" in line and not (tmp_path / "r").exists()


def test_shortlist_names_the_checkpoint_of_the_wrong_kind(sets, tmp_path):
    dual, pairwise = tmp_path / "dual", tmp_path / "sgr"
    assert vse("train", "--features", sets, "--run-dir", dual, "--image-pool", "mean", *TINY).exit_code == 0
    trained = vse("train", "--features", sets, "--run-dir", pairwise, "--network", "sgr", "--network-option",
                  "sim_dim=8", *TINY)
    assert trained.exit_code == 0, trained.output
    for checkpoint, shortlist, at_fault in ((dual, dual, dual), (pairwise, pairwise, pairwise)):
        line = one_line(vse("evaluate", "--checkpoint", checkpoint / "best.pt", "--features", sets,
                            "--shortlist", shortlist / "best.pt", "--split", "test"))
        assert line.startswith(f"error: {at_fault / 'best.pt'}: ") and str(sets) not in line


def test_a_resume_refuses_a_file_of_the_run_rewritten_in_place(tiny_cache, tmp_path):
    """The same class as the noise index: the relevance file (or the cache) rebuilt at the same path."""
    from pipeline.relevance import build_relevance

    relevance, run = tmp_path / "svd.h5", tmp_path / "run"
    build_relevance(tiny_cache, "svd", relevance, k=20, device="cpu")
    first = vse("train", "--features", tiny_cache, "--run-dir", run, "--loss", "lseh", "--relevance",
                relevance, *TINY)
    assert first.exit_code == 0, first.output
    assert vse("train", "--run-dir", run, "--resume", "--epochs", 2).exit_code == 0  # unchanged: goes on
    build_relevance(tiny_cache, "svd", relevance, k=2, device="cpu", overwrite=True)
    line = one_line(vse("train", "--run-dir", run, "--resume", "--epochs", 3))
    assert line.startswith(f"error: {relevance}: changed since the run began (its --relevance")
