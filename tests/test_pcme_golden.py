"""``pcme`` and ``pcmepp`` against their authors' code: tests/golden/pcme_mc.npz and pcme_csd.npz
hold the loss and its gradients (means, variance outputs, the learned shift and scale) from
naver-ai/pcmepp's ``MCSoftContrastiveLoss`` and ``ClosedFormSampledDistanceLoss`` (made by
scripts/golden_pcme.py), in float64, at random points and a random shift and scale. Ours gives the
same to 1e-10 relative; PCME on the very draws their loss made (ours is handed them through
``PCMELoss.draws``). Their variance output is log σ for PCME and log σ² for PCME++; ours takes
log σ² for both, so a PCME input is ``[μ, 2·std]``. A deliberate slip in each (PCME reading the
log-variance as log σ; PCME++ without its pseudo-positives) makes the comparison fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import pipeline.losses.pcme as pcme_module
from pipeline.losses.base import build_loss

GOLDEN = Path(__file__).resolve().parent / "golden"
TOL = 1e-10  # relative, float64: the order of operations differs (one product for every sample pair)


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"pcme_{name}.npz") as data:
        return {k: data[k] for k in data.files}


MC, CSD = golden("mc"), golden("csd")
MC_CASES, CSD_CASES = json.loads(str(MC["cases"])), json.loads(str(CSD["cases"]))
SIDES = ("img_mean", "cap_mean", "img_std", "cap_std")


def ours(name: str, case: dict, monkeypatch=None) -> dict:
    """Our loss at the case's options, shift and scale: the value and the gradients by their names."""
    data = MC if name == "pcme" else CSD
    key = case["case"]
    leaves = {k: torch.from_numpy(data[f"{key}:{k}"]).clone().requires_grad_(True) for k in SIDES}
    if name == "pcme":
        loss = build_loss("pcme", num_samples=case["samples"], vib_beta=case["vib_beta"],
                          squared=case["prob_distance"] == "squared_l2").double()
        draws = [torch.from_numpy(data[f"{key}:noise_img"]), torch.from_numpy(data[f"{key}:noise_cap"])]
        monkeypatch.setattr(loss, "draws", lambda log_variance: draws.pop(0))
        to_log_variance = 2.0  # their std is log σ
    else:
        loss = build_loss("pcmepp", vib_beta=case["vib_beta"],
                          smoothness_alpha=case["smoothness_alpha"]).double()
        to_log_variance = 1.0  # their std is log σ²
    with torch.no_grad():
        loss.shift.fill_(case["shift"])
        loss.negative_scale.fill_(case["scale"])
    img = torch.cat([leaves["img_mean"], to_log_variance * leaves["img_std"]], dim=1)
    cap = torch.cat([leaves["cap_mean"], to_log_variance * leaves["cap_std"]], dim=1)
    value = loss(img, cap)
    value.backward()
    out = {"loss": value.item(), "grad_shift": loss.shift.grad.numpy(),
           "grad_negative_scale": loss.negative_scale.grad.numpy()}
    out.update({f"grad_{k}": v.grad.numpy() for k, v in leaves.items()})
    return out


def worst(name: str, case: dict, monkeypatch) -> float:
    """The largest relative difference of the value and of each gradient (max |Δ| / max |theirs|)."""
    data = MC if name == "pcme" else CSD
    mine = ours(name, case, monkeypatch)
    theirs = float(data[f"{case['case']}:loss"])
    diffs = [abs(mine["loss"] - theirs) / abs(theirs)]
    for k, v in mine.items():
        if k != "loss":
            theirs = data[f"{case['case']}:{k}"]
            diffs.append(float(np.abs(v - theirs).max() / np.abs(theirs).max()))
    return max(diffs)


def test_the_files_come_from_the_authors_commit():
    for data in (MC, CSD):
        assert str(data["repo"]) == "naver-ai/pcmepp"
        assert str(data["commit"]) == "8829c0d75b734e36c193b998b5963c1187fa59b2"
        assert set(json.loads(str(data["sha256"]))) == {"pcmepp/criterions/pcme.py",
                                                        "pcmepp/criterions/pcmepp.py"}
    assert {c["samples"] for c in MC_CASES} == {8, 3}
    assert {c["prob_distance"] for c in MC_CASES} == {"non_squared_l2", "squared_l2"}
    assert all(int(CSD[f"{c['case']}:n_pseudo_gts"]) > 0 for c in CSD_CASES if c["smoothness_alpha"])


@pytest.mark.parametrize("case", MC_CASES, ids=[c["case"] for c in MC_CASES])
def test_pcme_equals_theirs_on_the_same_draws(case, monkeypatch):
    assert worst("pcme", case, monkeypatch) <= TOL


@pytest.mark.parametrize("case", CSD_CASES, ids=[c["case"] for c in CSD_CASES])
def test_pcmepp_equals_theirs(case, monkeypatch):
    assert worst("pcmepp", case, monkeypatch) <= TOL


def test_a_slip_in_each_is_caught(monkeypatch):
    """PCME drawing with σ = exp(log σ²) (the log-variance not halved), and PCME++ without its
    pseudo-positives, each differ from theirs far beyond the tolerance."""
    halves = pcme_module.gaussian_halves
    with monkeypatch.context() as patch:
        patch.setattr(pcme_module, "gaussian_halves", lambda e: (halves(e)[0], 2 * halves(e)[1]))
        assert worst("pcme", MC_CASES[0], patch) > 1e-3
    with monkeypatch.context() as patch:
        patch.setattr(pcme_module.PCMEppLoss, "_pseudo_positives",
                      staticmethod(lambda logits, matched: matched))
        assert worst("pcmepp", CSD_CASES[0], patch) > 1e-3


def test_the_defaults_are_their_configs():
    """configs/others/pcme.yaml and configs/pcmepp.yaml (the criterion's start 5 and 5)."""
    pcme, pcmepp = build_loss("pcme"), build_loss("pcmepp")
    assert (pcme.num_samples, pcme.vib_beta, pcme.squared, pcme.mask_same_image) == (8, 0.001, False, False)
    assert (pcmepp.vib_beta, pcmepp.smoothness_alpha, pcmepp.mask_same_image) == (0.0001, 0.1, False)
    for loss in (pcme, pcmepp):
        assert (loss.shift.item(), loss.negative_scale.item(), loss.similarity) == (5.0, 5.0, "csd")


def test_the_vib_term_is_dropped_above_their_ceiling():
    """Their ``kl_divergence`` returns 0 when the KL exceeds 10000 (a variance near e^12 does)."""
    mean = torch.zeros(2, 3, dtype=torch.float64)
    assert pcme_module.vib_kl(mean, torch.full((2, 3), 12.0, dtype=torch.float64)).item() == 0.0
    log_sigma = torch.tensor([[0.5, -1.0, 2.0], [0.0, 1.0, -2.0]], dtype=torch.float64)
    expected = -0.5 * (1 + log_sigma - log_sigma.exp()).mean()
    assert pcme_module.vib_kl(mean, log_sigma).item() == pytest.approx(expected.item(), rel=1e-15)
