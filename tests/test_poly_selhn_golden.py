"""``poly`` and ``selhn`` against their authors' code: tests/golden/poly_cases.npz holds the loss
and its gradient from PolyLoss's ``ContrastiveLoss.polyloss`` (wayne980/PolyLoss, polyloss.py),
with respect to score matrices of 5 to 16 pairs and to the embeddings of an inner-product batch;
tests/golden/selhn_cases.npz from SelHN's ``TripletSelHNLoss`` (AAA-Zheng/RVSEPP, loss.py), with
respect to both embeddings; both made by scripts/golden_poly_selhn.py. Ours, float64, at their
train.py's defaults but the options each case names, gives the same to 1e-12 relative; a
deliberate slip in each (poly: the polynomials unclamped; selhn: the mean over B, not B − 1)
makes the comparison fail. Then what differs from theirs by design, and `vse check-loss`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cli.main import cli
from pipeline.losses import poly, selhn
from pipeline.losses.base import build_loss

GOLDEN = Path(__file__).resolve().parent / "golden"
TOL = 1e-12  # relative, float64: only the order of operations differs (Horner, a mean for a sum)


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"{name}_cases.npz") as data:
        return {k: data[k] for k in data.files}


POLY, SELHN = golden("poly"), golden("selhn")
POLY_CASES, SELHN_CASES = json.loads(str(POLY["cases"])), json.loads(str(SELHN["cases"]))


def relative(ours, theirs) -> float:
    theirs = np.asarray(theirs)
    return float(np.abs(np.asarray(ours) - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def poly_difference(index: int, **options) -> float:
    """The largest relative difference of the loss and each gradient from theirs."""
    case = POLY_CASES[index]
    name, loss = case["matrix"], build_loss("poly", margin=case["margin"], **options)
    if name == "embedded":
        img, cap = (torch.from_numpy(POLY[f"{name}:{k}"]).requires_grad_(True) for k in ("img", "cap"))
        value = loss(img, cap)
        value.backward()
        grads = {"grad": img.grad, "grad_cap": cap.grad}
    else:
        scores = torch.from_numpy(POLY[f"{name}:scores"]).requires_grad_(True)
        value = loss.scored(scores, image_ids=torch.from_numpy(POLY[f"{name}:image_ids"]))
        value.backward()
        grads = {"grad": scores.grad}
    theirs = float(POLY[f"{index}:loss"])
    return max([abs(value.item() - theirs) / max(abs(theirs), 1e-300) if theirs else abs(value.item())]
               + [relative(g.numpy(), POLY[f"{index}:{k}"]) if POLY[f"{index}:{k}"].any()
                  else float(np.abs(g.numpy()).max()) for k, g in grads.items()])


def selhn_difference(index: int, **options) -> float:
    case = SELHN_CASES[index]
    img, cap = (torch.from_numpy(SELHN[f"{case['batch']}:{k}"]).requires_grad_(True) for k in ("img", "cap"))
    value = build_loss("selhn", margin=case["margin"], epsilon=case["epsilon"], **options)(img, cap)
    value.backward()
    return max(relative(value.item(), SELHN[f"{index}:loss"]),
               relative(img.grad.numpy(), SELHN[f"{index}:grad_img"]),
               relative(cap.grad.numpy(), SELHN[f"{index}:grad_cap"]))


def test_the_files_come_from_the_authors_commits():
    assert (str(POLY["repo"]), str(POLY["commit"])) == ("wayne980/PolyLoss",
                                                        "05da0039d2419e066adc07f36769424b7816cee9")
    assert set(json.loads(str(POLY["sha256"]))) == {"polyloss.py", "train.py"}
    assert (str(SELHN["repo"]), str(SELHN["commit"])) == ("AAA-Zheng/RVSEPP",
                                                          "329625631db96b3a17f9d6a61a06276ef8670108")
    assert set(json.loads(str(SELHN["sha256"]))) == {"loss.py", "train.py"}
    for bundle in ("poly", "selhn"):
        assert (GOLDEN / f"{bundle}_cases.npz").stat().st_size < 200_000


def test_the_defaults_are_theirs():
    """Their train.py's --margin (and --epsilon), the constants of their code, and only the
    diagonal as a positive."""
    loss = build_loss("poly")
    assert (loss.margin, loss.epsilon, loss.mask_same_image) == (float(POLY["opts:margin"]), 1e-5, False)
    assert (loss.positive, loss.negative) == ((0.2, -0.7, 0.5), (0.9, -0.4, 0.03))
    loss = build_loss("selhn")
    assert (loss.margin, loss.epsilon, loss.mask_same_image) == \
        (float(SELHN["opts:margin"]), float(SELHN["opts:epsilon"]), False)


def test_the_bundles_reach_every_branch():
    """poly: queries left out and counted, hardest negatives in the clamped band of N, a batch
    where none counts (loss 0); selhn: in both directions, queries that average and queries that
    take the hardest, at the default epsilon."""
    losses = [float(POLY[f"{i}:loss"]) for i in range(len(POLY_CASES))]
    assert 0.0 in losses and min(x for x in losses if x) > 0.1
    band = POLY["band8:scores"]
    hardest = (band - 10 * np.eye(8)).max(axis=1)
    counted = hardest + 0.2 > np.diag(band)
    assert (counted & (hardest > 0.0955) & (hardest < 0.349)).any() and not counted.all()
    default = [i for i, c in enumerate(SELHN_CASES) if c["epsilon"] == 0.01]
    for direction in ("close_images", "close_captions"):
        close = np.concatenate([SELHN[f"{i}:{direction}"] for i in default])
        assert close.any() and not close.all()


@pytest.mark.parametrize("index", range(len(POLY_CASES)),
                         ids=[f"{c['matrix']}-margin{c['margin']}" for c in POLY_CASES])
def test_poly_equals_theirs(index):
    assert poly_difference(index) <= TOL


@pytest.mark.parametrize("index", range(len(SELHN_CASES)),
                         ids=[f"{c['batch']}-margin{c['margin']}-eps{c['epsilon']}-opt{c['opt_batch']}"
                              for c in SELHN_CASES])
def test_selhn_equals_theirs(index):
    assert selhn_difference(index) <= TOL


def _unclamped(coefficients, x):
    value = torch.zeros_like(x)
    for coefficient in coefficients:
        value = value * x + coefficient
    return value


def _mean_over_batch(hinges, negatives, close, dim):
    return torch.where(close, hinges.mean(dim=dim), hinges.amax(dim=dim))


SLIPS = {  # name: (module, attribute, the slipped replacement, the comparison)
    "poly: the polynomials not clamped at 0": (poly, "polynomial", _unclamped, poly_difference, POLY_CASES),
    "selhn: the mean over B, not the B - 1 negatives": (selhn, "chosen", _mean_over_batch, selhn_difference,
                                                        SELHN_CASES),
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_a_slip_fails_the_golden_comparison(slip, monkeypatch):
    module, attribute, replacement, difference, cases = SLIPS[slip]
    assert max(difference(i) for i in range(len(cases))) <= TOL
    monkeypatch.setattr(module, attribute, replacement)
    assert max(difference(i) for i in range(len(cases))) > 1e-3, f"{slip}: the golden values did not notice"


# ---------------------------------------------------------------------------- by design


def test_their_same_image_captions_are_negatives():
    """repeated8 shows image 0 twice and image 2 three times: theirs (and our default) count those
    captions as negatives; mask_same_image=true does not, and the value changes."""
    index = next(i for i, c in enumerate(POLY_CASES) if c["matrix"] == "repeated8")
    assert poly_difference(index) <= TOL
    assert poly_difference(index, mask_same_image=True) > 0.01


def test_poly_leaves_out_a_query_whose_positive_is_one():
    """Theirs stops (min() of an empty tensor) when a positive is >= 1 - 1e-5; ours leaves that
    query out: a collapsed batch (every score 1) costs 0, and a row and column of such a positive
    add nothing."""
    loss = build_loss("poly")
    scores = torch.ones(4, 4, dtype=torch.float64, requires_grad=True)
    value = loss.scored(scores)
    value.backward()
    assert value.item() == 0.0 and not scores.grad.any()
    band = torch.from_numpy(POLY["band8:scores"]).clone()
    before = loss.scored(band).item()
    assert band[3, 3] == 0.5
    band[3, 3] = 1.0  # query 3, counted as a row (hardest 0.45) and a column (0.33), now left out
    negatives = band - 10 * torch.eye(8, dtype=torch.float64)
    row, column = (poly.polynomial(loss.negative, x) for x in (negatives[3].max(), negatives[:, 3].max()))
    assert row > 0 and column == 0  # 0.45, then 0.33: in N's clamped band
    both = 2 * poly.polynomial(loss.positive, torch.tensor(0.5, dtype=torch.float64)) + row + column
    assert loss.scored(band).item() == pytest.approx(before - both.item() / 8, abs=1e-12)


def test_selhn_a_collapsed_batch_costs_the_margin():
    """Equal embeddings: every hinge is the margin and every gap 0, so every query averages: the
    value is the margin, the trainer's collapse warning (collapse_value)."""
    loss = build_loss("selhn", margin=0.3)
    same = torch.nn.functional.normalize(torch.ones(5, 8, dtype=torch.float64), dim=1)
    assert loss(same, same).item() == pytest.approx(0.3, abs=1e-12)
    assert loss.collapse_value(5) == 0.3


def test_poly_coefficients_are_checked():
    assert build_loss("poly", positive=[1, 0]).positive == (1.0, 0.0)
    with pytest.raises(ValueError, match="negative must hold at least one coefficient"):
        build_loss("poly", negative=[])
    with pytest.raises(ValueError, match="positive"):
        build_loss("poly", positive=[0.2, float("nan")])


@pytest.mark.parametrize("name", ["poly", "selhn"])
def test_check_loss_passes(name):
    result = CliRunner().invoke(cli, ["check-loss", name, "--no-distributed", "--loss-option",
                                      "mask_same_image=true"])
    assert result.exit_code == 0, result.output
    assert "same-image pairs never negatives      ok" in result.output


@pytest.mark.parametrize("name, options", [("poly", {"positive": [0.3, -0.8, 0.5], "margin": 0.1}),
                                           ("selhn", {"epsilon": 0.05})])
def test_a_run_trains_and_records_its_options(name, options, tiny_cache, tmp_path):
    """One epoch on the tiny cache, every loss finite, and config.json holds the options as given, which
    build the same loss again (poly's coefficients come back as a list and build the same tuple)."""
    from conftest import TINY_TRAIN

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    config = TrainConfig(features=str(tiny_cache), run_dir=str(tmp_path / "run"), loss=name,
                         loss_options=options, epochs=1, **TINY_TRAIN)
    trainer = build_trainer(config, echo=lambda *a: None)
    result = trainer.fit()  # a non-finite loss would stop it with an error
    assert result["iterations"] > 0 and np.isfinite(result["best_rsum"])
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert recorded["loss"] == name and recorded["loss_options"] == options
    assert build_loss(name, **recorded["loss_options"]).options == trainer.loss.options
