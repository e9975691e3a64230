"""``decl`` (pipeline/losses/noisy/decl.py) against the authors' DECL code: the bundles
tests/golden/decl_{sgraf,steps,correspondence}.npz hold their functions' values on small random
inputs (scripts/golden_decl.py made them from QinYang79/DECL); the raw scores of the bundles fed to
our loss give the same values, gradients and steps to 1e-9 relative (float64)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.losses.base import build_loss
from pipeline.losses.noisy.decl import _kl_to_uniform, robust_dynamic_hinge
from pipeline.training.trainer import clip_gradients

GOLDEN = Path(__file__).resolve().parent / "golden"
REL = 1e-9  # float64 on both sides: only the order of sums differs
COMMIT = "1b0a7756ed0b9c060834516ba7a733438be9af77"
WARMUP = 5  # their opts.py warmup_epochs, our default: epochs 0-4 are the warm-up


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"decl_{name}.npz") as data:
        return {k: data[k] for k in data.files}


def t(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=np.float64))


def close(ours, theirs, rel: float = REL) -> float:
    """The largest difference relative to the largest magnitude of theirs."""
    ours = ours.detach().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    theirs = np.asarray(theirs, dtype=np.float64)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    diff = float(np.abs(ours - theirs).max()) / max(float(np.abs(theirs).max()), 1e-300)
    assert diff <= rel, diff
    return diff


def test_the_bundles_come_from_the_authors_commit_and_our_defaults_are_their_opts():
    loss = build_loss("decl")
    for name in ("sgraf", "steps", "correspondence"):
        g = golden(name)
        assert str(g["repo"]) == "QinYang79/DECL" and str(g["commit"]) == COMMIT
        assert all(len(str(g[f"sha256:{f}"])) == 64 for f in ("model/DECL.py", "model/SGRAF.py", "train.py"))
    g = golden("sgraf")
    assert loss.tau == float(g["opts:tau"]) and loss.margin == float(g["opts:margin"])
    assert loss.hinge_weight == float(g["opts:lambda1"]) and loss.kl_weight == float(g["opts:lambda2"])
    assert loss.eta == float(g["opts:eta"]) and loss.mu == int(g["opts:mu"]) and loss.anneal_epochs == 0
    assert loss.warmup_epochs == int(g["opts:warmup_epochs"]) == int(g["script_warmup:f30k"]) == WARMUP
    assert loss.evidence_loss == "mse" and loss.clean_rule == "evidence" and not loss.mask_same_image
    assert loss.batch_size is None and int(g["opts:batch_size"]) == 128  # None: the run's batch


def test_evidence_alphas_uncertainty_kl_mse_and_rdh():
    g = golden("sgraf")
    loss = build_loss("decl")
    raw = t(g["raw"])
    size = len(raw)
    evidence = loss.evidence(raw)
    close(evidence, g["evidences"])
    close(torch.tanh(raw), g["sims_tanh"])
    close(evidence + 1, g["alpha_i2t"])
    close(evidence.T + 1, g["alpha_t2i"])
    all_pairs = torch.ones(size, size, dtype=torch.bool)
    close(_kl_to_uniform(evidence + 1, all_pairs), g["kl_i2t"])
    eye = torch.eye(size, dtype=torch.bool)
    noisy = eye & t(g["noisy_labels"]).bool()[:, None]
    for labels, name in ((eye, "clean"), (noisy, "noisy")):
        close(loss._evidence(evidence + 1, all_pairs, labels), g[f"mse_{name}_i2t"])
        close(loss._evidence(evidence.T + 1, all_pairs, labels), g[f"mse_{name}_t2i"])
    for row, neg in enumerate(g["rdh_neg"]):
        close(robust_dynamic_hinge(torch.tanh(raw), ~eye, loss.margin, int(neg)), g["rdh"][row])
    # the uncertainty of their get_correspondence: K / S of both directions
    statistic = build_loss("decl", clean_rule="uncertainty").sample_statistic(raw[None])
    close(-statistic[0], g["u_i2t"] + g["u_t2i"])


@pytest.mark.parametrize("evidence_loss", ["mse", "log"])
def test_the_log_and_digamma_variants_differ_from_theirs(evidence_loss):
    """A guard on the test above: the named variants give other values on the same alphas."""
    g = golden("sgraf")
    alpha = build_loss("decl").evidence(t(g["raw"])) + 1
    eye = torch.eye(len(alpha), dtype=torch.bool)
    ours = build_loss("decl", evidence_loss="digamma" if evidence_loss == "mse" else "log")
    value = ours._evidence(alpha, torch.ones_like(eye), eye)
    assert np.abs(value.numpy() - g["mse_clean_i2t"]).max() > 1e-2


def _step_loss(g, n, **options):
    """Our loss at their step n: the division from their preds, the step counter before it."""
    raw = t(g[f"step{n}:raw"]).requires_grad_(True)
    size = len(raw)
    loss = build_loss("decl", batch_size=128, **options)
    loss.prepare(size)
    loss.clean.copy_(torch.from_numpy(g[f"step{n}:preds"] > 0))
    loss.set_epoch(0 if str(g[f"step{n}:kind"]) == "warmup" else WARMUP)
    loss.step = int(g[f"step{n}:step"]) - 1
    return loss, raw, loss.scored(raw, sample_ids=torch.arange(size))


@pytest.mark.parametrize("n", range(5))
def test_their_warmup_batch_and_train_batch(n):
    """Their warmup_batch (step 0) and train_batch (mixed, all-noisy, neg = B and neg = mu
    predictions) on their SGRAF's raw scores: the loss, its EDL part, neg, the step counter after
    the call and the gradient with respect to the raw scores."""
    g = golden("sgraf")
    loss, raw, value = _step_loss(g, n)
    assert loss.step == int(g[f"step{n}:step"])
    assert loss.hardness(len(raw), loss.step) == int(g[f"step{n}:neg"])
    close(value, g[f"step{n}:loss"])
    value.backward()
    close(raw.grad, g[f"step{n}:grad"])
    close(_step_loss(g, n, hinge_weight=0.0)[2], g[f"step{n}:loss_edl"])


class Scorer(nn.Module):
    """The generator's bilinear stand-in for SGRAF: raw = fc(images) W fc(captions)ᵀ + b."""

    def __init__(self, g):
        super().__init__()
        self.img, self.cap = nn.Linear(6, 4), nn.Linear(5, 4)
        self.w, self.b = nn.Parameter(torch.zeros(4, 4)), nn.Parameter(torch.zeros(()))
        self.double()
        with torch.no_grad():
            for name, p in zip(g["names"], self.ordered()):
                p.copy_(t(g[f"before:{name}"]))

    def ordered(self):
        return [self.img.weight, self.img.bias, self.cap.weight, self.cap.bias, self.w, self.b]

    def forward(self, images, captions):
        return self.img(images) @ self.w @ self.cap(captions).T + self.b


def test_three_of_their_steps_with_clipping_and_adam():
    """warmup_batch, warmup_batch, train_batch: our loss on the scorer, the trainer's clipping
    (torch's clip_grad_norm_) and Adam end at their parameters; the step counter moves neg 7 → 6."""
    g = golden("steps")
    scorer = Scorer(g)
    params = scorer.ordered()
    optimizer = torch.optim.Adam(params, lr=float(g["lr"]))
    loss = build_loss("decl", batch_size=128)
    loss.prepare(8)
    loss.step = int(g["step0:step"]) - 1
    for n in range(int(g["steps"])):
        loss.set_epoch(0 if str(g[f"step{n}:kind"]) == "warmup" else WARMUP)
        loss.clean.copy_(torch.from_numpy(g[f"step{n}:preds"] > 0))
        raw = scorer(t(g[f"step{n}:images"]), t(g[f"step{n}:captions"]))
        close(raw, g[f"step{n}:raw"])
        value = loss.scored(raw, sample_ids=torch.arange(8))
        assert loss.step == int(g[f"step{n}:step"])
        assert loss.hardness(8, loss.step) == int(g[f"step{n}:neg"])
        close(value, g[f"step{n}:loss"])
        optimizer.zero_grad()
        value.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        close(norm, g[f"step{n}:norm"])
        assert float(norm) > float(g["grad_clip"])  # their clipping acts at every step here
        clip_gradients(params, float(g["grad_clip"]))
        before = [p.detach().clone() for p in params]
        optimizer.step()
        for name, p, b in zip(g["names"], params, before):
            close(p.grad, g[f"step{n}:grad:{name}"])
            close(p.detach() - b, g[f"step{n}:after:{name}"] - b.numpy())  # the update itself


@pytest.mark.parametrize("rule", ["evidence", "uncertainty"])
def test_their_clean_rule_get_correspondence(rule):
    """Their pass over two batches (eval mode): the verdict argmax(norm_e) == diagonal and the
    clean score norm_e_ii per pair, by id; begin_epoch keeps the verdicts per id. The
    ``uncertainty`` rule's clean score is −u of the same pass."""
    g = golden("correspondence")
    loss = build_loss("decl", clean_rule=rule)
    loss.prepare(13)
    ids = np.concatenate([g["ids0"], g["ids1"]])
    stats = np.concatenate([loss.sample_statistic(t(g[f"raw{b}"])[None]).numpy() for b in (0, 1)], axis=1)
    assert loss.begin_epoch(WARMUP - 1, ids, stats, 0) is None  # no division in the warm-up
    score, judged = loss.begin_epoch(WARMUP, ids, stats, 0)
    if rule == "evidence":
        close(score, g["norm_es_eye"][ids])
        assert (judged == (g["preds"][ids] > 0)).all() and 0 < judged.sum() < len(ids)
        assert (loss.clean.numpy() == (g["preds"] > 0)).all()
    else:
        close(-score, g["uncertainty"][ids])


def test_a_sigmoid_score_is_read_back_as_theirs():
    """sgr / saf here score σ(raw): ``score_is_sigmoid`` takes logit S, their raw score."""
    g = golden("sgraf")
    raw = t(g["step1:raw"])
    plain = _step_loss(g, 1)[2]
    loss = build_loss("decl", batch_size=128, score_is_sigmoid=True)
    loss.prepare(8)
    loss.clean.copy_(torch.from_numpy(g["step1:preds"] > 0))
    loss.set_epoch(WARMUP)
    loss.step = int(g["step1:step"]) - 1
    close(loss.scored(torch.sigmoid(raw), sample_ids=torch.arange(8)), plain.detach().numpy(), rel=1e-12)
