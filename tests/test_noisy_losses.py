"""The losses for noisy pairs (rcl, decl, ncr): hand-made cases, the batched formulas against
one-query-at-a-time loops of the papers' equations (tests/reference/noisy_loop.py, float64,
1e-9), NCR's GMM split and soft margins, the division metrics, and ncr's two networks through
train, kill + resume, and evaluate."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from conftest import QUIET, TINY_TRAIN, vse
from reference import noisy_loop

from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.data.cache import FeatureCache
from pipeline.models.losses import build_loss
from pipeline.models.ncr import gmm_clean_probability
from pipeline.models.noisy_losses import division_metrics

TOL = 1e-9  # float64, the batched formulas against the loops: only the order of sums differs
IDS = torch.tensor([0, 0, 1, 2, 3, 3])  # pairs 0 and 1, 4 and 5 show the same image


def random_case(seed: int, size: int = 6):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(size, size, generator=gen, dtype=torch.float64) * 1.6 - 0.6
    scores += torch.eye(size, dtype=torch.float64) * 0.3
    negative = (IDS[:, None] != IDS[None, :]).tolist()
    return scores, negative


# ---------------------------------------------------------------------------- rcl


def test_rcl_by_hand():
    # S = [[1, 0], [0, 1]], tau 1: p of the one negative is 1 / (e + 1) in every row and column
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    p = 1 / (math.e + 1)
    assert build_loss("rcl", tau=1.0).scored(scores).item() == pytest.approx(2 * -math.log(1 - p), abs=1e-12)
    assert build_loss("rcl", tau=1.0, variant="abs").scored(scores).item() == pytest.approx(2 * p, abs=1e-12)
    assert build_loss("rcl", tau=1.0, variant="infonce").scored(scores).item() == pytest.approx(
        2 * -math.log(1 - p), abs=1e-12)  # −log p_ii, and p_ii = 1 − p here
    # a pair of the same image is no negative: with both captions of one image, nothing is pushed
    assert build_loss("rcl", tau=1.0).scored(scores, image_ids=torch.tensor([7, 7])).item() == 0.0


@pytest.mark.parametrize("variant", ["log", "gce", "abs", "exp", "tan", "infonce"])
def test_rcl_matches_the_loop(variant):
    for seed in range(3):
        scores, negative = random_case(seed)
        loss = build_loss("rcl", tau=0.3, variant=variant, q=0.7)
        expected = noisy_loop.rcl(scores.tolist(), negative, 0.3, variant, 0.7)
        assert loss.scored(scores, image_ids=IDS).item() == pytest.approx(expected, rel=TOL)


def test_rcl_never_pulls_a_positive_up_on_its_own():
    """The complementary loss: its gradient on S_ii comes only through the negatives' softmax."""
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64, requires_grad=True)
    build_loss("rcl", tau=0.1).scored(scores).backward()
    assert (scores.grad.diagonal() < 0).all() and (scores.grad.fill_diagonal_(0) >= 0).all()


# ---------------------------------------------------------------------------- decl


@pytest.mark.parametrize("epoch,evidence", [(0, "log"), (1, "log"), (3, "digamma"), (12, "log")])
def test_decl_matches_the_loop(epoch, evidence):
    for seed in range(3):
        scores, negative = random_case(seed)
        loss = build_loss("decl", tau=0.5, margin=0.2, evidence_loss=evidence, anneal_epochs=10,
                          warmup_epochs=1, topk_decay=0.5)
        loss.set_epoch(epoch)
        expected = noisy_loop.decl(scores.tolist(), negative, 0.5, 0.2, epoch, 10, 1, 0.5, evidence)
        assert loss.scored(scores, image_ids=IDS).item() == pytest.approx(expected, rel=TOL)


def test_decl_by_hand_two_pairs():
    # S = 0 everywhere, tau 1: every evidence is e^0 = 1, α = 2, S = 4, u = 2 / 4: the log loss is
    # log 4 − log 2 per query and direction; epoch 0: no KL; the hinge: [0.2 − 0 + 0]_+ per query
    scores = torch.zeros(2, 2, dtype=torch.float64)
    loss = build_loss("decl", tau=1.0, margin=0.2, warmup_epochs=1)
    assert loss.scored(scores).item() == pytest.approx(2 * math.log(2) + 2 * 0.2, abs=1e-12)
    assert loss.topk(128) == 127
    loss.set_epoch(3)
    assert loss.topk(128) == 15 and loss.topk(2) == 1


# ---------------------------------------------------------------------------- ncr


def test_ncr_soft_margin_and_warm_up():
    loss = build_loss("ncr", margin=0.2, soft_margin_base=10.0, warmup_epochs=1)
    labels = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    expected = [noisy_loop.ncr_soft_margin(y, 0.2, 10.0) for y in labels.tolist()]
    assert loss.soft_margin(labels).tolist() == pytest.approx(expected, abs=1e-15)
    assert expected[0] == 0 and expected[2] == pytest.approx(0.2)
    # warm-up: each network's VSE++ max of hinges, added
    a, _ = random_case(0)
    b, _ = random_case(1)
    mh = build_loss("mh", margin=0.2)
    value = loss.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=torch.arange(6))
    assert value.item() == pytest.approx((mh.scored(a, image_ids=IDS) + mh.scored(b, image_ids=IDS)).item(),
                                         rel=TOL)
    # warmup_sum: each network's sum of hinges (VSE0) instead
    sh, summed = build_loss("sh", margin=0.2), build_loss("ncr", warmup_sum=True)
    value = summed.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=torch.arange(6))
    assert value.item() == pytest.approx((sh.scored(a, image_ids=IDS) + sh.scored(b, image_ids=IDS)).item(),
                                         rel=TOL)


def test_ncr_trains_each_network_on_the_other_ones_division():
    loss = build_loss("ncr", margin=0.2, warmup_epochs=0, p_threshold=0.5)
    loss.prepare(10)
    w = torch.tensor([[0.9, 0.2, 0.7, 0.1, 0.95, 0.6, 0, 0, 0, 0],    # network 0's division
                      [0.3, 0.8, 0.55, 0.99, 0.4, 0.05, 0, 0, 0, 0]], dtype=torch.float64)
    loss.clean_probability.copy_(w)
    a, negative = random_case(2)
    b, _ = random_case(3)
    ids = torch.tensor([0, 1, 2, 3, 4, 5])
    value = loss.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=ids).item()
    predicted = [(min(max(a[i, i].item(), 0), 1) + min(max(b[i, i].item(), 0), 1)) / 2 for i in range(6)]
    expected = 0.0
    for k, scores in enumerate((a, b)):
        other = w[1 - k, :6].tolist()
        labels = [o if o > 0.5 else predicted[i] for i, o in enumerate(other)]
        margins = [noisy_loop.ncr_soft_margin(y, 0.2, 10.0) for y in labels]
        expected += noisy_loop.ncr_network_loss(scores.tolist(), negative, margins)
    assert value == pytest.approx(expected, rel=TOL)


def test_the_gmm_split_finds_the_low_loss_mode():
    rng = np.random.default_rng(0)
    losses = np.concatenate([rng.normal(0.1, 0.03, 800), rng.normal(0.7, 0.1, 200)])
    w = gmm_clean_probability(losses, seed=[0, 1])
    assert (w[:800] > 0.5).mean() > 0.97 and (w[800:] < 0.5).mean() > 0.97
    assert np.array_equal(w, gmm_clean_probability(losses, seed=[0, 1]))  # seeded: the same split again
    assert np.all(gmm_clean_probability(np.full(5, 0.3), seed=[0]) == 1)  # equal losses: nothing to divide


def test_division_metrics_by_hand():
    truth = np.array([True, True, True, False, False])
    judged = np.array([True, True, False, True, False])
    score = np.array([0.9, 0.8, 0.3, 0.6, 0.1])
    m = division_metrics(score, judged, truth)
    assert m["division_precision"] == pytest.approx(2 / 3) and m["division_recall"] == pytest.approx(2 / 3)
    assert m["division_auc"] == pytest.approx(5 / 6)  # of 6 (clean, noisy) pairs, (0.3, 0.6) is misordered
    assert division_metrics(score, judged, np.ones(5, bool))["division_auc"] is None  # no noise: undefined


def test_a_two_network_loss_takes_stacked_scores_only():
    loss = build_loss("ncr")
    with pytest.raises(ValueError, match=r"\(2, B, B\)"):
        loss.scored(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="stacked scores"):
        loss(torch.zeros(3, 4), torch.zeros(3, 4))


def test_ncr_refuses_sample_ids_outside_its_per_sample_state():
    loss = build_loss("ncr", warmup_epochs=0)
    stacked = torch.stack([random_case(0)[0], random_case(1)[0]])
    with pytest.raises(ValueError, match=r"prepare\(num_captions\)"):
        loss.scored(stacked, sample_ids=torch.arange(6))  # no buffers yet
    loss.prepare(6)
    with pytest.raises(ValueError, match=r"caption ids in \[0, 6\)"):
        loss.scored(stacked, sample_ids=torch.arange(1, 7))
    with pytest.raises(ValueError, match=r"sample_ids must have shape \(6,\)"):
        loss.scored(stacked, sample_ids=torch.arange(5))


def test_a_call_keeps_no_state_from_the_one_before():
    """The ids and stacked scores travel in the call's Batch: a call without ids after one with
    them is the plain (fixed-margin) loss, never the last batch's labels."""
    loss = build_loss("ncr", warmup_epochs=0)
    loss.prepare(6)
    loss.clean_probability.fill_(0.0)  # every pair judged noisy: labels from the predictions
    a, b = random_case(0)[0], random_case(1)[0]
    with_ids = loss.scored(torch.stack([a, b]), image_ids=IDS, sample_ids=torch.arange(6)).item()
    without = loss.scored(torch.stack([a, b]), image_ids=IDS).item()
    mh = build_loss("mh", margin=0.2)
    plain = mh.scored(a, image_ids=IDS) + mh.scored(b, image_ids=IDS)
    assert without == pytest.approx(plain.item(), rel=TOL)
    assert with_ids != pytest.approx(without, rel=1e-3)


# ---------------------------------------------------------------------------- through the trainer


def _noisy_config(tiny_cache, run_dir, **over):
    return TrainConfig(features=str(tiny_cache), run_dir=str(run_dir), noise_rate=0.5, noise_mode="caption",
                       **{**TINY_TRAIN, "batch_size": 8, "epochs": 3, **over})


def test_ncr_co_trains_two_networks_divides_and_evaluates_their_mean(tiny_cache, tmp_path):
    from pipeline.evaluation.inference import encode_split, load_model
    from pipeline.models.cotrain import CoTrained
    from pipeline.training.build import build_trainer

    trainer = build_trainer(_noisy_config(tiny_cache, tmp_path / "ncr", loss="ncr",
                                          loss_options={"warmup_epochs": 1}), **QUIET)
    assert isinstance(trainer.model, CoTrained) and len(trainer.model.members) == 2
    a, b = (dict(m.named_parameters()) for m in trainer.model.members)
    assert not torch.equal(a["image_encoder.proj.weight"], b["image_encoder.proj.weight"])  # two inits
    trainer.fit()
    lines = (tmp_path / "ncr" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert "division_auc" not in records[0]  # epoch 1 is the warm-up: no division yet
    for record in records[1:]:
        assert 0 <= record["division_auc"] <= 1 and 0 <= record["division_precision"] <= 1
        assert record["noise_true_rate"] == pytest.approx(trainer.noise.true_rate())
    state = load_checkpoint(tmp_path / "ncr" / "last.pt")
    assert state["model_config"]["co_trained"] == 2
    assert state["loss"]["clean_probability"].shape == (2, 200)  # one entry per caption of the cache
    trained = state["loss"]["clean_probability"][:, trainer.train_captions]
    assert not torch.all(trained == 1)  # the division wrote the training captions' entries
    # evaluate: the mean of the two networks' scores
    loaded = load_model(tmp_path / "ncr" / "best.pt", torch.device("cpu"))
    cache = FeatureCache(tiny_cache)
    captions = loaded.captions(cache)
    split = encode_split(loaded.model, cache, captions, "test", torch.device("cpu"))
    assert split.pairwise
    members = []
    for member in loaded.model.members:
        member.eval()
        feats = torch.from_numpy(cache.read(split.image_rows)).float()
        with torch.no_grad():
            img = member.image_encoder(feats)
            cap = captions.embed(member.text_encoder, split.caption_rows, torch.device("cpu"))
        members.append((img @ cap.T).numpy())
    np.testing.assert_allclose(split.captions.T, (members[0] + members[1]) / 2, atol=1e-6)
    # evaluate --runs: the true rate and the division at the best epoch; report --columns noisy
    result = vse("evaluate", "--runs", tmp_path / "ncr", "--split", "test", "--out", tmp_path / "results.csv")
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
    best = max(records, key=lambda r: r["rsum"])
    assert float(row["noise_true_rate"]) == pytest.approx(trainer.noise.true_rate())
    assert row.get("division_auc", "") == ("" if "division_auc" not in best else str(best["division_auc"]))
    (tmp_path / "captions.txt").write_text("a dog runs on the grass\n")
    refused = vse("embed", tmp_path / "ncr" / "best.pt", "--captions", tmp_path / "captions.txt",
                  "--out", tmp_path / "e.h5")
    assert refused.exit_code == 1 and "2 networks trained together" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "e.h5").exists()
    table = vse("report", tmp_path / "results.csv", "--columns", "noisy")
    assert table.exit_code == 0 and "| rsum |" in table.output.splitlines()[0]
    assert ("| Division AUC |" in table.output.splitlines()[0]) == ("division_auc" in best)


@pytest.mark.parametrize("kill_at", [17, 22])
def test_ncr_killed_then_resumed_equals_the_uninterrupted_run(tiny_cache, tmp_path, monkeypatch, kill_at):
    """120 training captions / 8 = 15 steps per epoch, a checkpoint every 4 steps and at each epoch's
    end. Killed at step 17 (epoch 2, after the checkpoint at 16: the division made at epoch 2's start
    comes from the checkpoint) or at 22 (after the one at 20); resumed, it ends as the run that was
    never killed: both networks' weights, the per-sample state and the division."""
    from test_train import _kill_after

    from pipeline.training.build import build_trainer

    options = {"loss": "ncr", "loss_options": {"warmup_epochs": 1}, "val_every": 4}
    build_trainer(_noisy_config(tiny_cache, tmp_path / "a", **options), **QUIET).fit()
    with monkeypatch.context() as m:
        _kill_after(m, kill_at)
        with pytest.raises(KeyboardInterrupt):
            build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), **QUIET).fit()
    saved = load_checkpoint(tmp_path / "b" / "last.pt")
    assert saved["iteration"] == kill_at - kill_at % 4 and "division" in saved  # mid-epoch 2, divided
    build_trainer(_noisy_config(tiny_cache, tmp_path / "b", **options), resume=True, **QUIET).fit()
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["iteration"] == b["iteration"] == 45
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    assert torch.equal(a["loss"]["clean_probability"], b["loss"]["clean_probability"])
    assert a["division"] == b["division"]


@pytest.mark.parametrize("loss", ["rcl", "decl"])
def test_rcl_and_decl_train_a_dual_network_on_noisy_pairs(tiny_cache, tmp_path, loss):
    """Two epochs at 50% caption noise: every record states the true noise rate of the index the
    run kept; decl's division before epoch 1 is the one a fresh trainer (same seed, same weights)
    makes, measured against that saved index, and its loss on the first batch's clean pairs falls
    (10.9 → 3.7 here). rcl's is not checked so: at tau 0.05, lr 5e-3 and batches of 8 its loss on
    the first batch first rises (2.2 → 4.3 → 3.9 → 1.9 over 4 epochs; 2.2 → 2.9 → 2.0 without noise)."""
    from pipeline.data.noise import NOISE_FILE, NoiseIndex
    from pipeline.training.build import build_trainer

    fresh = build_trainer(_noisy_config(tiny_cache, tmp_path / "fresh", loss=loss, epochs=2), **QUIET)
    first = fresh.epoch_batches(0)[0]
    ids = first.caption_ids.numpy()
    clean = torch.from_numpy(fresh.train_caption_image[ids] == fresh.index.caption_image[ids])
    assert 3 <= int(clean.sum()) < len(ids)  # a batch with clean and noisy pairs

    def batch_loss(trainer) -> float:
        trainer.model.eval()
        with torch.no_grad():
            img, cap = trainer.model(first.images, *first.captions)
            return trainer.loss(img[clean], cap[clean], image_ids=first.image_ids[clean],
                                sample_ids=first.caption_ids[clean]).item()

    before = batch_loss(fresh)
    if loss == "decl":
        score, judged = fresh.loss.begin_epoch(0, fresh.train_captions, fresh.sample_statistics(), 0)
    trainer = build_trainer(_noisy_config(tiny_cache, tmp_path / loss, loss=loss, epochs=2), **QUIET)
    assert math.isfinite(trainer.fit()["best_rsum"])
    if loss == "decl":
        assert batch_loss(trainer) < 0.7 * before
    kept = NoiseIndex.read(tmp_path / loss / NOISE_FILE, trainer.noise.caption_image,
                           int(trainer.noise.caption_image.max()) + 1)
    assert 0.4 < kept.true_rate() < 0.5  # ⌊0.5 · 120⌋ captions drawn; a few keep their own image
    records = [json.loads(line) for line in (tmp_path / loss / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["noise_true_rate"] == kept.true_rate() for r in records)
    if loss == "rcl":  # no division
        assert not any(key.startswith("division") for key in records[0] | records[1])
        return
    expected = division_metrics(score, judged, ~kept.noisy())
    for name, value in expected.items():
        assert records[0][name] == pytest.approx(value, abs=1e-12), name
    assert records[1]["division_auc"] != records[0]["division_auc"]  # made again from the trained weights
