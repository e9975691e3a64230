"""Chance (issue 58): the rsum of random scores and its noise, checked against a brute-force
simulation; a result within that noise, and a split under 100 images, never pass in silence
(`vse train`, `vse evaluate`, `vse report`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import TINY_TRAIN, train_run, vse

from pipeline.evaluation import chance
from pipeline.evaluation.chance import chance_note, chance_rsum, row_at_chance, small_split_note
from pipeline.evaluation.metrics import evaluate_embeddings


def simulated_rsums(images: int, per_image: int, draws: int, seed: int = 0) -> np.ndarray:
    """rsum of ``draws`` score matrices of independent uniform scores, ranked by brute force: image
    i's captions are i·C … i·C+C−1 (its best caption's rank among the others), a caption's image
    its own (its rank among the images)."""
    rng = np.random.default_rng(seed)
    m = images * per_image
    owner = np.repeat(np.arange(images), per_image)
    out = []
    for start in range(0, draws, 200):
        scores = rng.random((min(200, draws - start), images, m))
        truth = scores[:, owner, np.arange(m)]                                     # (draws, M)
        best = truth.reshape(len(scores), images, per_image).max(axis=2)           # (draws, N)
        i2t = (scores > best[:, :, None]).sum(axis=2)                              # others above
        t2i = (scores > truth[:, None, :]).sum(axis=1)
        out.append(sum(100 * (i2t < k).mean(axis=1) + 100 * (t2i < k).mean(axis=1) for k in (1, 5, 10)))
    return np.concatenate(out)


def test_the_brute_force_ranks_as_vse_evaluate_does():
    """The simulation's rsum is the protocol's (``metrics.evaluate_embeddings`` on the same scores:
    images = I_N, captions = Sᵀ, so each pair's score is S itself)."""
    rng = np.random.default_rng(1)
    for _ in range(3):
        scores = rng.random((12, 24))
        ours = evaluate_embeddings(np.eye(12), scores.T.copy(), np.repeat(np.arange(12), 2))["rsum"]
        owner = np.repeat(np.arange(12), 2)
        best = scores[owner, np.arange(24)].reshape(12, 2).max(axis=1)
        i2t = (scores > best[:, None]).sum(axis=1)
        t2i = (scores > scores[owner, np.arange(24)][None, :]).sum(axis=0)
        brute = sum(100 * (i2t < k).mean() + 100 * (t2i < k).mean() for k in (1, 5, 10))
        assert ours == pytest.approx(brute, abs=1e-9)


@pytest.mark.parametrize("images, per_image, draws", [(100, 5, 2000), (20, 2, 4000), (12, 1, 4000)])
def test_chance_matches_a_simulation_of_random_scores(images, per_image, draws):
    """Mean within 4 standard errors of the simulated mean; the spread within 5 % of the simulated
    one (its standard error is about 1.5 % at these draws). The spread without the covariances of
    image and caption queries would be 10-20 % low: this test would catch it."""
    sim = simulated_rsums(images, per_image, draws)
    ours = chance_rsum(images, images * per_image)
    assert abs(ours.mean - sim.mean()) <= 4 * sim.std(ddof=1) / math.sqrt(draws)
    assert ours.sd == pytest.approx(sim.std(ddof=1), rel=0.05)
    p = {k: chance._i2t_hit(images * per_image, per_image, k) for k in (1, 5, 10)}
    q = {k: k / images for k in (1, 5, 10)}
    independent = 100 * math.sqrt(chance._nested_variance(p) / images
                                  + chance._nested_variance(q) / (images * per_image))
    assert independent < 0.92 * sim.std(ddof=1)  # what the covariances add is larger than the tolerance


def test_exact_values_and_folds():
    assert chance_rsum(100).mean == pytest.approx(31.5654, abs=1e-3)  # 100 Σ (p_K + K/N), hypergeometric
    assert chance_rsum(100, 100).mean == pytest.approx(32.0, abs=1e-9)  # one caption each: 2 · (1+5+10)
    one, five = chance_rsum(1000), chance_rsum(1000, folds=5)
    assert five.mean == one.mean and five.sd == pytest.approx(one.sd / math.sqrt(5), rel=1e-12)
    with pytest.raises(ValueError):
        chance_rsum(1)


def test_the_notes_say_what_they_measure():
    note = chance_note(33.8, "test rsum", 100)
    assert note == ("note: test rsum 33.8 is within the noise of chance (31.6 ± 6.8 for 100 images, 5 "
                    "captions each; mean ± sd of random scores): this run learnt nothing measurable")
    assert chance_note(31.6 + 3 * 6.83, "test rsum", 100) is None  # above mean + 3 sd: something learnt
    assert chance_note(float("-inf"), "dev rsum", 100) is None      # no validation happened
    assert small_split_note(10, "test") == (
        "note: the test split has 10 images, under 100: one R@1 step is then 10.0 points, so its recalls "
        "and rsum move in coarse steps")
    assert small_split_note(100, "test") is None
    row = {"run": "a", "rsum": 4.0, "images": 1000, "protocol": "single"}
    assert row_at_chance(row) is not None and row_at_chance({**row, "rsum": 40.0}) is None
    assert row_at_chance({**row, "images": ""}) is None and row_at_chance({"rsum": 1.0}) is None


# ---------------------------------------------------------------------------- the commands
@pytest.fixture(scope="module")
def split_cache(tmp_path_factory):
    """120 demo images, learnable features: 100 train, 10 dev, 10 test (a CSV-sized split)."""
    from conftest import demo_captions, learnable_features, write_feature_cache

    n = 120
    ids, captions = demo_captions(n)
    caption_image = np.repeat(np.arange(n), 5)
    splits = {"train": np.arange(100), "dev": np.arange(100, 110), "test": np.arange(110, 120)}
    return write_feature_cache(tmp_path_factory.mktemp("split") / "c.h5", learnable_features(
        captions, caption_image, n), captions, caption_image, splits, image_ids=ids)


@pytest.fixture(scope="module")
def untrained_and_learnt(split_cache, tmp_path_factory):
    """An untrained run (lr 1e-12: its weights stay the random initial ones) and a learnt one, both
    validated on the whole train split (100 images), so that chance is well above zero noise."""
    root = tmp_path_factory.mktemp("chance_runs")
    common = {**TINY_TRAIN, "val_split": "train", "val_images": 100, "loss": "sh", "embed_dim": 32}
    train_run(split_cache, root / "untrained", **{**common, "lr": 1e-12, "epochs": 1})
    train_run(split_cache, root / "learnt", **{**common, "epochs": 8, "lr_decay_epoch": 6})
    return root


def test_evaluate_notes_an_untrained_model_and_not_a_learnt_one(untrained_and_learnt, split_cache):
    def evaluate(name):
        return vse("evaluate", "--checkpoint", untrained_and_learnt / name / "best.pt", "--features",
                   split_cache, "--split", "train", "--device", "cpu")

    untrained, learnt = evaluate("untrained"), evaluate("learnt")
    assert untrained.exit_code == 0 and learnt.exit_code == 0, untrained.output + learnt.output
    last = untrained.output.strip().splitlines()[-1]
    assert last.startswith("note: train rsum ") and "within the noise of chance (31.6 ± 6.8 for 100 " \
        "images, 5 captions each" in last and last.endswith("learnt nothing measurable")
    assert "noise of chance" not in learnt.output and "coarse steps" not in learnt.output
    runs = vse("evaluate", "--runs", f"{untrained_and_learnt}/*", "--split", "train", "--device", "cpu")
    assert runs.exit_code == 0, runs.output
    line = runs.output.strip().splitlines()[-1]
    assert line.startswith("note: 1 of 2 runs have an rsum within the noise of chance")
    assert "untrained (" in line and "learnt (" not in line


def test_train_notes_a_dev_rsum_at_chance_and_a_small_validation_split(split_cache, tmp_path):
    result = vse("train", "--features", split_cache, "--run-dir", tmp_path / "run", "--loss", "sh",
                 "--epochs", 1, "--lr", 1e-12, "--embed-dim", 8, "--word-dim", 8, "--batch-size", 16,
                 "--min-word-count", 1, "--val-every", 0, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    small = [n for n, line in enumerate(lines) if line.startswith("note: the dev (validation) split has 10")]
    assert small and small[0] < next(n for n, line in enumerate(lines) if line.startswith("[epoch"))
    assert "one R@1 step is then 10.0 points" in lines[small[0]]
    assert lines[-1].startswith("note: dev rsum ") and "for 10 images, 5 captions each" in lines[-1]


def test_evaluate_says_a_10_image_split_is_small(untrained_and_learnt, split_cache):
    result = vse("evaluate", "--checkpoint", untrained_and_learnt / "learnt" / "best.pt", "--features",
                 split_cache, "--split", "test", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "note: the test split has 10 images, under 100: one R@1 step is then 10.0 points" in result.output


def test_report_marks_a_row_at_chance(untrained_and_learnt, tmp_path):
    from pipeline.reports.report import AT_CHANCE, format_results, read_results

    out = tmp_path / "results.csv"
    assert vse("evaluate", "--runs", f"{untrained_and_learnt}/*", "--split", "train", "--device", "cpu",
               "--out", out).exit_code == 0
    table = format_results(read_results(out))
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert f"untrained{AT_CHANCE}" in rows and "learnt" in rows
    assert "untrained: rsum " in table and "is within the noise of chance (31.6 ± 6.8 for 100 images" in table
    assert "learnt: rsum" not in table
