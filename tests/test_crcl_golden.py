"""``crcl`` against the authors' code: tests/golden/crcl_steps.npz holds, call after call over the
epochs of one round, the loss, its gradient with respect to the scores and the per-sample labels
(their ``move_gt``) of their ``CRCL.train_self`` (QinYang79/CRCL, CRCL_NeurIPS23/model/CRCL.py;
made by scripts/golden_crcl.py) at their defaults and at other tau / alpha / warm_epoch, without
--confident, without --mc, and with labels under the 0.1 floor. Ours, float64, gives the same to
1e-9 relative (the labels to 1e-12); a deliberate slip of the formula fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.losses.base import build_loss
from pipeline.losses.noisy import crcl

GOLDEN = Path(__file__).resolve().parent / "golden" / "crcl_steps.npz"
TOL = 1e-9     # relative, float64: ours runs in log space, theirs divides exp(S / tau)
LABEL_TOL = 1e-12


def golden() -> dict:
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


G = golden()
CASES = json.loads(str(G["cases"]))


def options_of(opt: dict) -> dict:
    """Their options as ours (names: pipeline/losses/noisy/crcl.py)."""
    return {"tau": opt["tau"], "alpha": opt["alpha"], "warmup_epochs": opt["warm_epoch"],
            "moving_labels": opt["mc"], "floor": 0.1 if opt["confident"] else 0.0}


def worst_differences(case: str) -> tuple[float, float, float]:
    """Over the case's calls: the largest relative difference of the loss, of the gradient
    (max |Δ| / max |theirs|) and the largest absolute difference of the labels."""
    loss = build_loss("crcl", **options_of(json.loads(str(G[f"{case}/opt"]))))
    labels = G[f"{case}/0:move_gt"]
    loss.prepare(len(labels))
    worst = [0.0, 0.0, 0.0]
    for k in range(int(G[f"{case}/calls"])):
        scores = torch.from_numpy(G[f"{case}/{k}:scores"]).clone().requires_grad_(True)
        loss.set_epoch(int(G[f"{case}/{k}:epoch"]))
        value = loss.scored(scores, image_ids=torch.arange(len(scores)),
                            sample_ids=torch.from_numpy(G[f"{case}/{k}:ids"]))
        value.backward()
        theirs, their_grad = float(G[f"{case}/{k}:loss"]), G[f"{case}/{k}:grad"]
        worst[0] = max(worst[0], abs(value.item() - theirs) / abs(theirs))
        worst[1] = max(worst[1], float(np.abs(scores.grad.numpy() - their_grad).max()
                                       / np.abs(their_grad).max()))
        worst[2] = max(worst[2], float(np.abs(loss.labels.numpy() - G[f"{case}/{k}:move_gt"]).max()))
    return tuple(worst)


def test_the_file_comes_from_the_authors_commit():
    assert str(G["repo"]) == "QinYang79/CRCL"
    assert str(G["commit"]) == "4a964067681d78ef2a1534e12f26247bd55a52b2"
    assert set(json.loads(str(G["sha256"]))) == {"CRCL_NeurIPS23/model/CRCL.py", "CRCL_NeurIPS23/utils.py",
                                                 "CRCL_NeurIPS23/opts.py"}
    assert set(CASES) == {"defaults", "tau_alpha_warm1", "not_confident", "no_mc", "floored"}


def test_the_defaults_are_their_opts():
    loss = build_loss("crcl")
    theirs = {k.removeprefix("opts:"): json.loads(str(G[k])) for k in G if k.startswith("opts:")}
    assert options_of(theirs) == {"tau": loss.tau, "alpha": loss.alpha, "warmup_epochs": loss.warmup_epochs,
                                  "moving_labels": loss.moving_labels, "floor": loss.floor}
    assert (loss.negative_weight, loss.eps, loss.mask_same_image) == (5.0, 1e-10, False)


@pytest.mark.parametrize("case", CASES)
def test_loss_gradient_and_labels_equal_theirs(case):
    value, grad, labels = worst_differences(case)
    assert value <= TOL and grad <= TOL and labels <= LABEL_TOL, (value, grad, labels)


def test_the_sequences_reach_every_part_of_the_method():
    """The cases are able to fail: labels refined after the warm-up (not 1, not p̂ alone), some
    floored to 0, the last warm-up epoch storing p̂."""
    final = G[f"defaults/{int(G['defaults/calls']) - 1}:move_gt"]
    assert (final == 0).any() and ((final > 0) & (final < 1)).any()
    assert (G[f"floored/{int(G['floored/calls']) - 1}:move_gt"] == 0).sum() >= 5
    warm_end = [k for k in range(int(G["defaults/calls"])) if int(G[f"defaults/{k}:epoch"]) == 1][-1]
    stored = G[f"defaults/{warm_end}:move_gt"]
    assert ((stored > 0) & (stored < 0.1)).any()  # p̂ stored unfloored in the last warm-up epoch


def test_a_slip_in_the_complementary_term_is_caught(monkeypatch):
    """The denominator's exponent 1 − y read as y: the comparison fails."""
    def slipped(log_p, negatives, counted, y):
        tan = torch.tan(log_p.exp().masked_fill(~counted, 0.0))
        return tan.masked_fill(~negatives, 0.0).sum(1) / tan.sum(1) ** y

    monkeypatch.setattr(crcl, "complementary", slipped)
    assert worst_differences("defaults")[0] > 1e-3


def test_a_slip_in_the_label_refinement_is_caught(monkeypatch):
    """alpha on p̂ instead of on the stored label: the labels and the loss differ."""
    original = crcl.ActiveComplementaryLoss.refine

    def slipped(self, sample_ids, p_hat, training):
        self.alpha = 1 - self.options.alpha
        try:
            return original(self, sample_ids, p_hat, training)
        finally:
            self.alpha = self.options.alpha

    monkeypatch.setattr(crcl.ActiveComplementaryLoss, "refine", slipped)
    value, _, labels = worst_differences("defaults")
    assert labels > 1e-3 and value > 1e-6


def test_no_sample_ids_or_no_gradient_stores_nothing():
    loss = build_loss("crcl")
    loss.prepare(14)
    loss.set_epoch(3)
    scores = torch.from_numpy(G["defaults/0:scores"])
    loss.scored(scores, sample_ids=torch.from_numpy(G["defaults/0:ids"]))  # no gradient: a validation
    loss.scored(scores.clone().requires_grad_(True))                       # no ids
    assert torch.equal(loss.labels, torch.ones(14, dtype=torch.float64))


def test_a_tiny_noisy_run_through_the_command_line(tiny_cache, tmp_path):
    """`vse train --loss crcl` at 50% caption noise, 3 epochs (warm-up 1): the run finishes, and its
    checkpoint holds the refined labels of the training captions: in [0, 1], some floored to 0,
    those of the noisy pairs lower on average than the clean ones'."""
    from conftest import vse

    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.data.noise import NOISE_FILE, NoiseIndex

    run = tmp_path / "crcl"
    result = vse("train", "--features", tiny_cache, "--run-dir", run, "--loss", "crcl", "--epochs", 3,
                 "--loss-option", "warmup_epochs=1", "--noise-rate", 0.5, "--noise-mode", "caption",
                 "--embed-dim", 16, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
                 "--val-every", 0, "--workers", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    labels = load_checkpoint(run / "last.pt")["loss"]["labels"].numpy()
    assert len(labels) == 200 and (labels[120:] == 1).all()  # the tiny cache: captions 0-119 train
    labels = labels[:120]
    noisy = NoiseIndex.read(run / NOISE_FILE, np.repeat(np.arange(24), 5), 24).noisy()
    assert (labels >= 0).all() and (labels <= 1).all() and (labels == 0).any() and (labels < 1).all()
    assert labels[noisy].mean() < labels[~noisy].mean()
