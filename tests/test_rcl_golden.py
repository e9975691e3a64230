"""``rcl`` against the authors' code: tests/golden/rcl_ccl.npz holds the loss and its gradient
with respect to the scores from their ``CCL`` (penghu-cs/RCL, RCL-SGRAF/model.py; made by
scripts/golden_rcl.py), for every method, tau, q and ratio their scripts use, on score matrices
of 2 to 24 pairs. Ours, float64, at its defaults but those options, gives the same to 1e-9
relative."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.losses.base import build_loss

GOLDEN = Path(__file__).resolve().parent / "golden" / "rcl_ccl.npz"
TOL = 1e-9  # relative, float64: only the order of operations differs
VARIANT = {"log": "log", "gce": "gce", "abs": "abs", "exp": "exp", "tan": "tan", "infoNCE": "infonce"}


def golden() -> dict:
    with np.load(GOLDEN) as data:
        return {k: data[k] for k in data.files}


G = golden()
CASES = json.loads(str(G["cases"]))


def ours(case: dict, **options) -> tuple[float, np.ndarray]:
    scores = torch.from_numpy(G[f"{case['matrix']}:scores"]).clone().requires_grad_(True)
    ids = torch.from_numpy(G[f"{case['matrix']}:image_ids"])
    loss = build_loss("rcl", tau=case["tau"], variant=VARIANT[case["method"]], q=case["q"],
                      ratio=case["ratio"], **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case["seed"])  # their --ratio draw: torch.rand_like on the global RNG
        value = loss.scored(scores, image_ids=ids)
    value.backward()
    return value.item(), scores.grad.numpy()


def difference(case: dict, index: int, **options) -> tuple[float, float]:
    """(relative difference of the loss, of the gradient: max |Δ| / max |theirs|)."""
    value, grad = ours(case, **options)
    theirs, their_grad = float(G[f"{index}:loss"]), G[f"{index}:grad"]
    return (abs(value - theirs) / abs(theirs),
            float(np.abs(grad - their_grad).max() / np.abs(their_grad).max()))


def test_the_file_comes_from_the_authors_commit():
    assert str(G["repo"]) == "penghu-cs/RCL"
    assert str(G["commit"]) == "1096a24107a7d7e41cc7a61d37ac358bfd03842c"
    assert set(json.loads(str(G["sha256"]))) == {"RCL-SGRAF/model.py"}
    assert {c["method"] for c in CASES} == set(VARIANT)
    assert {(c["tau"], c["q"]) for c in CASES} >= {(0.05, 0.2), (0.1, 0.5)}
    assert {c["ratio"] for c in CASES} == {-1.0, 0.5, 0.3}


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{c['matrix']}-{c['method']}-tau{c['tau']}-q{c['q']}-ratio{c['ratio']}"
                              for c in CASES])
def test_loss_and_gradient_equal_theirs(index):
    value, grad = difference(CASES[index], index)
    assert value <= TOL and grad <= TOL, (value, grad)


def test_the_defaults_are_their_scripts():
    loss = build_loss("rcl")
    assert (loss.tau, loss.variant, loss.q, loss.ratio, loss.eps, loss.mask_same_image) == \
        (0.05, "log", 0.2, -1.0, 1e-10, False)


def test_their_same_image_captions_are_negatives():
    """The batch of 8 shows image 0 twice and image 2 three times: their loss pushes those
    captions apart (only the diagonal is a positive); ``mask_same_image=true`` does not."""
    index = next(i for i, c in enumerate(CASES) if c["matrix"] == "repeated8" and c["method"] == "log"
                 and c["ratio"] < 0 and c["tau"] == 0.05)
    value, _ = difference(CASES[index], index, mask_same_image=True)
    assert value > 0.05  # 25% here


@pytest.mark.parametrize("matrix", ["negative6", "dominant6"])
def test_their_1e10_terms_show_in_the_bundle(matrix):
    """Without them (eps=0, the clean form) these two matrices give another value: the softmax's
    + 1e-10 when every score is low, the log's 1 − p + 1e-10 when a negative takes almost all."""
    index = next(i for i, c in enumerate(CASES) if c["matrix"] == matrix and c["method"] == "log")
    assert difference(CASES[index], index)[0] <= TOL
    assert difference(CASES[index], index, eps=0.0)[0] > 100 * TOL


def test_ratio_draws_per_row_as_theirs():
    """--ratio 0.5: each row counts ⌊B/2⌋ drawn negatives, the same draw in both directions; with
    another seed the value changes."""
    index = next(i for i, c in enumerate(CASES) if c["ratio"] == 0.5 and c["matrix"] == "sgraf24")
    case = dict(CASES[index], seed=CASES[index]["seed"] + 10)
    assert difference(case, index)[0] > 100 * TOL
