"""``bicro`` against the authors' code: tests/golden/bicro_parts.npz (scripts/golden_bicro.py, from
xu5zhao/BiCro's model.py, co_train.py and run.py) holds their warm-up selection, per-pair losses,
anchors and soft-margin hinges (value and gradient), their labels (``SGRAF.predict``: clean and noisy
batches, every --noise_train), the order of their co-training step and their ``split_prob``. Ours,
float64, gives the same (1e-12), and their Beta mixture division; a deliberate slip of the
consistency fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.losses.base import build_loss
from pipeline.losses.noisy import bicro
from pipeline.losses.noisy.base import Phase
from pipeline.losses.noisy.ncr import split_prob

GOLDEN = Path(__file__).resolve().parent / "golden" / "bicro_parts.npz"
TOL = 1e-12  # float64; only the order of operations differs


def golden() -> dict:
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


G = golden()
SIZES = (8, 12, 20)
PREDICTS = range(int(G["predict/count"]))


def t(key: str) -> torch.Tensor:
    return torch.from_numpy(G[key])


def negatives(size: int) -> torch.Tensor:
    return ~torch.eye(size, dtype=torch.bool)


def close(ours, theirs, tol=TOL) -> bool:
    ours = ours.detach().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    return np.abs(ours - theirs).max() <= tol * max(1.0, np.abs(theirs).max())


def test_the_file_comes_from_the_authors_commit():
    assert str(G["repo"]) == "xu5zhao/BiCro"
    assert str(G["commit"]) == "02316315d8be3da798f150e51c3d6315bb1b9234"
    assert set(json.loads(str(G["sha256"]))) == {"model.py", "co_train.py", "run.py"}


def test_the_defaults_are_their_run_py():
    theirs = {k.removeprefix("opts:"): json.loads(str(G[k])) for k in G if k.startswith("opts:")}
    loss = build_loss("bicro")
    assert (loss.margin, loss.warmup_epochs, loss.p_threshold, loss.soft_margin, loss.warmup_rate) == \
        (theirs["margin"], theirs["warmup_epoch"], theirs["p_threshold"], theirs["soft_margin"],
         theirs["warmup_rate"])
    assert theirs["noise_train"] == "train" and loss.noise_threshold == 0  # noise_soft: off
    assert theirs["warmup_type"] == "warmup_sele" and theirs["fit_type"] == loss.division == "gmm"
    assert (loss.schedule, loss.per_pair_labels, loss.own_consistency, loss.mask_same_image) == \
        ("alternate", False, False, False)


@pytest.mark.parametrize("size", SIZES)
def test_warm_up_selection_equals_theirs(size):
    for rate in (0.5, 0.3):
        scores = t(f"loss/{size}:scores").clone().requires_grad_(True)
        loss = build_loss("bicro", warmup_rate=rate)
        value = loss.phase_loss(Phase(0, "warmup"), scores, None)
        value.backward()
        assert close(value, G[f"loss/{size}:warmup_sele:{rate}"])
        assert close(scores.grad, G[f"loss/{size}:warmup_sele:{rate}:grad"])


@pytest.mark.parametrize("size", SIZES)
def test_per_pair_losses_anchors_and_soft_margin_hinges_equal_theirs(size):
    scores, labels = t(f"loss/{size}:scores"), t(f"loss/{size}:labels")
    loss = build_loss("bicro")
    assert close(loss.per_pair_loss(scores, negatives(size)), G[f"loss/{size}:eval_loss"])
    anchor, rest = loss.anchors(scores, negatives(size))
    assert anchor.tolist() == G[f"loss/{size}:anchors"].tolist()
    assert rest.tolist() == G[f"loss/{size}:rest"].tolist()
    for margin in ("exponential", "linear", "sin"):
        leaf = scores.clone().requires_grad_(True)
        loss = build_loss("bicro", soft_margin=margin)
        value = loss.phase_loss(Phase(0, "clean"), leaf, loss.margin_labels(labels))
        value.backward()
        assert close(value, G[f"loss/{size}:train:{margin}"]), margin
        assert close(leaf.grad, G[f"loss/{size}:train:{margin}:grad"]), margin


def options_of(index: int) -> dict:
    soft = str(G[f"predict/{index}:noise_train"]) == "noise_soft"
    return {"noise_threshold": float(G[f"predict/{index}:noise_tem"]) if soft else 0.0}


def our_labels(index: int, **options):
    scores = t(f"predict/{int(G[f'predict/{index}:group'])}:scores")
    loss = build_loss("bicro", **options_of(index), **options)
    noisy = (t(f"predict/{index}:noisy_images"), t(f"predict/{index}:noisy_captions")) \
        if f"predict/{index}:n_y" in G else (None, None)
    return loss.labels_of(scores, negatives(len(scores)), t(f"predict/{index}:images"),
                          t(f"predict/{index}:captions"), *noisy)


RANDOM = [i for i in PREDICTS if str(G[f"predict/{i}:kind"]) == "random"]
PROFILES = [i for i in PREDICTS if str(G[f"predict/{i}:kind"]) == "profiles"]


@pytest.mark.parametrize("index", RANDOM)
def test_labels_from_given_vectors_equal_theirs(index):
    clean, noisy = our_labels(index)
    assert close(clean, G[f"predict/{index}:c_y"]) and close(noisy, G[f"predict/{index}:n_y"])


@pytest.mark.parametrize("index", PROFILES)
def test_phase_targets_label_a_clean_batch_as_theirs_from_its_scores(index):
    """Our step's labels (the other network's scores, their rows and columns as the vectors) are
    theirs given those vectors; caption j's label in column j of both directions."""
    scores = t(f"predict/{int(G[f'predict/{index}:group'])}:scores")
    loss = build_loss("bicro", **options_of(index))
    asked = []

    def predict(member, stream):
        asked.append((member, stream))
        return scores

    ids = torch.arange(len(scores))
    updates = loss.phase_targets(Phase(0, "clean"), [(ids, ids)], predict)
    assert asked == [(1, 0)] and [stream for stream, _ in updates] == [0]
    rows, columns = updates[0][1]
    assert rows.shape == columns.shape == (1, len(scores))
    assert close(columns[0], G[f"predict/{index}:c_y"]) and close(rows[0], G[f"predict/{index}:c_y"])


def test_the_labels_are_not_trivial():
    """The cases are able to fail: anchors at 1, other labels strictly between 0 and 1, some 0
    under noise_soft, and noisy labels of both kinds."""
    for index in RANDOM:
        c_y = G[f"predict/{index}:c_y"]
        assert (c_y == 1).any() and ((c_y > 0) & (c_y < 1)).any() or str(G[f"predict/{index}:noise_train"]) \
            == "noise_soft"
    assert sum(((G[f"predict/{i}:n_y"] > 0) & (G[f"predict/{i}:n_y"] < 1)).sum() for i in RANDOM) >= 10


def test_their_step_order_is_ours():
    """Their train(): before num_epochs // 2 the other network labels the clean batch and one update
    follows; from then on it labels both batches first, and the noisy batch's update comes first."""
    before, after = (json.loads(str(G[f"train/epoch{e}"])) for e in (0, 2))
    first = [c for c in before if "predict" in c or ".train(" in c][:2]
    assert first == ["B.predict(L0,-)", "A.train(L0,c_y[B:L0],train)"]
    first = [c for c in after if "predict" in c or ".train(" in c][:3]
    assert first == ["B.predict(L0,U0)", "A.train(U0,n_y[B:U0],train)", "A.train(L0,c_y[B:L0],train)"]
    scores = t("predict/0:scores")
    ids = torch.arange(len(scores))
    loss = build_loss("bicro")
    asked = []

    def predict(member, stream):
        asked.append((member, stream))
        return scores

    updates = loss.phase_targets(Phase(0, "clean+noisy", ()), [(ids, ids), (ids, ids)], predict)
    assert [s for s, _ in updates] == [1, 0] and {m for m, _ in asked} == {1}


def test_the_schedule_is_ncrs_with_their_half_way_noisy_start():
    """Warm-up phases for warmup_epochs, then each network on the other's clean pairs; the noisy
    stream from co-training epoch (epochs - warmup) // 2 (theirs: epoch >= num_epochs // 2)."""
    num_epochs = int(G["train/num_epochs"])
    loss = build_loss("bicro", warmup_epochs=1)
    loss.prepare(6)
    ids = np.arange(6)
    kinds = [[p.kind for p in loss.epoch_plan(e, 1 + num_epochs, ids)] for e in range(1 + num_epochs)]
    assert kinds == [["warmup"] * 2] + [["clean"] * 2] * (num_epochs // 2) + \
        [["clean+noisy"] * 2] * (num_epochs - num_epochs // 2)


@pytest.mark.parametrize("name", ["mixed", "all_above"])
def test_split_prob_is_theirs(name):
    assert split_prob(G[f"split/{name}:prob"], 0.5).tolist() == G[f"split/{name}:pred"].tolist()


@pytest.mark.parametrize("shape", ["two_modes", "skewed"])
def test_their_beta_mixture_division_is_ours(shape):
    """division=bmm: their BetaMixture1D's posterior of component 0, read at the clipped losses as
    their fit reads them (theirs reads the unclipped ones: there the lowest-loss pair, at x = 0,
    gets 0 and is judged noisy; PROTOCOL)."""
    losses = G[f"bmm/{shape}:losses"]
    ours = bicro.bmm_clean_probability(losses)
    assert close(ours, G[f"bmm/{shape}:posterior_clipped"])
    x = (losses - losses.min()) / (losses.max() - losses.min())
    ends = (x <= 1e-4) | (x >= 1 - 1e-4)
    theirs = G[f"bmm/{shape}:posterior"]
    assert close(ours[~ends], theirs[~ends]) and ends.sum() <= 3
    lowest = np.argmin(losses)  # their cleanest pair: both densities 0 at x = 0, posterior 0
    assert theirs[lowest] == 0 and ours[lowest] > 0.9


def test_division_bmm_divides_before_each_co_training_epoch():
    losses = G["bmm/two_modes:losses"]
    loss = build_loss("bicro", division="bmm", warmup_epochs=0)
    loss.prepare(len(losses))
    w, judged = loss.begin_epoch(0, np.arange(len(losses)), np.stack([losses, losses]), seed=0)
    assert close(w, bicro.bmm_clean_probability(losses)) and np.array_equal(judged, split_prob(w, 0.5))
    gmm = build_loss("bicro", warmup_epochs=0)
    gmm.prepare(len(losses))
    assert not close(gmm.begin_epoch(0, np.arange(len(losses)), np.stack([losses, losses]), seed=0)[0], w,
                     1e-3)


def test_a_slip_in_the_consistency_is_caught(monkeypatch):
    """The ratio taken as is (no smaller-over-larger): the labels differ from theirs."""
    def slipped(nearest_by, other):
        top, at = nearest_by.max(dim=1, keepdim=True)
        return (top / other.gather(1, at)).squeeze(1)

    monkeypatch.setattr(bicro, "_ratio_at_nearest", slipped)
    worst = max(float(np.abs(our_labels(i)[0].numpy() - G[f"predict/{i}:c_y"]).max()) for i in RANDOM)
    assert worst > 1e-3


def test_their_scatter_by_position_shows_in_the_bundle():
    """Each non-anchor pair its own consistency (own_consistency) is not their code."""
    worst = max(float(np.abs(our_labels(i, own_consistency=True)[0].numpy() - G[f"predict/{i}:c_y"]).max())
                for i in RANDOM)
    assert worst > 1e-2


def test_ncrs_warm_up_sum_is_refused():
    with pytest.raises(ValueError, match="warmup_rate"):
        build_loss("bicro", warmup_sum=True)


def test_a_tiny_noisy_run_through_the_command_line(tiny_cache, tmp_path):
    """`vse train --loss bicro` at 50% caption noise, 3 epochs (warm-up 1, then a clean-only
    co-training epoch and one with the noisy stream): the run finishes with two co-trained
    networks and a division measured against the noise index after the warm-up."""
    from conftest import vse

    from pipeline.core.checkpoint import load_checkpoint

    run = tmp_path / "bicro"
    result = vse("train", "--features", tiny_cache, "--run-dir", run, "--loss", "bicro", "--epochs", 3,
                 "--loss-option", "warmup_epochs=1", "--noise-rate", 0.5, "--noise-mode", "caption",
                 "--embed-dim", 16, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
                 "--val-every", 0, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and "division_auc" not in records[0]
    assert all(0 <= r["division_auc"] <= 1 for r in records[1:])
    model = load_checkpoint(run / "last.pt")["model"]
    assert any(k.startswith("members.0.") for k in model) and any(k.startswith("members.1.") for k in model)
