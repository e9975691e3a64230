"""Golden values of RCL's complementary contrastive loss (Hu et al., TPAMI 2023;
github.com/penghu-cs/RCL) for tests/test_rcl_golden.py: the authors' ``CCL`` of
RCL-SGRAF/model.py, every ``--loss`` method (log, gce, abs, exp, tan, infoNCE), at the tau, q
(their ``--margin``) and ``--ratio`` their scripts and class use, run in float64 on score
matrices of a few sizes: the loss and its gradient with respect to the scores. One batch shows
an image several times (their loss: only the diagonal is a positive); one has every score
negative and one a dominant negative, so that their two 1e-10 terms change the value.
Inputs and outputs go to OUT/rcl_ccl.npz.

Their code is imported at run time from the checkout given as argument and never enters this
repository. Their ``.cuda()`` calls are made no-ops and ``torch.cuda.is_available`` returns
False while it runs. ``--ratio`` draws with ``torch.rand_like``: each such case seeds torch's
global RNG first (its ``seed``), and the test seeds it the same before calling ours.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/penghu-cs/RCL /tmp/RCL
    git -C /tmp/RCL checkout 1096a24107a7d7e41cc7a61d37ac358bfd03842c
    .venv/bin/python scripts/golden_rcl.py /tmp/RCL --out tests/golden

The file records the commit (of the checkout when it is a git work tree, or --commit) and the
sha256 of RCL-SGRAF/model.py, the one file read.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, cuda_as_identity

REPO = "penghu-cs/RCL"
MODEL_FILE = "RCL-SGRAF/model.py"
METHODS = ("log", "gce", "abs", "exp", "tan", "infoNCE")


def load_model(checkout: Path):
    spec = importlib.util.spec_from_file_location("rcl_sgraf_model", checkout / MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- the score matrices


def score_matrices() -> dict:
    """name -> (scores (B, B) float64, image_ids (B,))."""
    gen = torch.Generator().manual_seed(0)

    def uniform(size, low, high):
        return torch.rand(size, size, generator=gen, dtype=torch.float64) * (high - low) + low

    out = {}
    # cosine-like scores, the positive a little higher
    out["pair"] = (uniform(2, -0.5, 0.8) + 0.2 * torch.eye(2, dtype=torch.float64), np.arange(2))
    out["cosine5"] = (uniform(5, -1.0, 1.0) + 0.3 * torch.eye(5, dtype=torch.float64), np.arange(5))
    # a batch of 8 pairs over 5 images: pairs (0, 1) and (3, 4, 5) show one image each; their
    # captions score high on their image, as captions of one image do
    ids = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    same = torch.from_numpy(ids[:, None] == ids[None, :])
    repeated = uniform(8, -0.6, 0.6) + 0.35 * same.double() + 0.1 * torch.eye(8, dtype=torch.float64)
    out["repeated8"] = (repeated, ids)
    # SGRAF's scores: a sigmoid, in (0, 1)
    out["sgraf24"] = (torch.sigmoid(4 * uniform(24, -1.0, 1.0) + 2 * torch.eye(24, dtype=torch.float64)),
                      np.arange(24))
    # every score negative: at tau 0.05 a row's Σ exp(S / tau) is ~1e-4, so their + 1e-10 in the
    # softmax's denominator moves p by ~1e-6
    out["negative6"] = (uniform(6, -1.0, -0.4), np.arange(6))
    # a dominant negative: 1 − p ≈ 1e-6 for (0, 1), so their 1 − p + 1e-10 moves its −log by 1e-4
    dominant = uniform(6, -0.3, 0.3)
    dominant[0, 1] = dominant[0].max() + 0.05 * 14.0  # 14 / tau(0.05) above the row's others
    out["dominant6"] = (dominant, np.arange(6))
    return out


def cases() -> list[dict]:
    """(matrix, method, tau, q, ratio, seed): every method at their scripts' tau 0.05 and q 0.2
    on every matrix; tau 0.1 (their class's default) and q 0.5 (the class's) on some; --ratio 0.5
    (a draw of ⌊B/2⌋ negatives per row) and 0.3 on the larger batches."""
    out = []
    for matrix in ("pair", "cosine5", "repeated8", "sgraf24", "negative6", "dominant6"):
        for method in METHODS:
            out.append(dict(matrix=matrix, method=method, tau=0.05, q=0.2, ratio=-1.0, seed=0))
    for matrix in ("cosine5", "repeated8"):
        for method in METHODS:
            out.append(dict(matrix=matrix, method=method, tau=0.1, q=0.5, ratio=-1.0, seed=0))
    for matrix, ratio, seed in (("repeated8", 0.5, 1), ("sgraf24", 0.5, 2), ("sgraf24", 0.3, 3)):
        for method in METHODS:
            out.append(dict(matrix=matrix, method=method, tau=0.05, q=0.2, ratio=ratio, seed=seed))
    return out


def run(model, scores: torch.Tensor, case: dict) -> tuple[np.ndarray, np.ndarray]:
    ccl = model.CCL(tau=case["tau"], method=case["method"], q=case["q"], ratio=case["ratio"])
    scores = scores.clone().requires_grad_(True)
    torch.manual_seed(case["seed"])
    with cuda_as_identity():
        loss = ccl(scores)
    loss.backward()
    return loss.detach().numpy().copy(), scores.grad.numpy().copy()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a penghu-cs/RCL checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.checkout)
    matrices = score_matrices()
    values = {}
    for name, (scores, ids) in matrices.items():
        values[f"{name}:scores"], values[f"{name}:image_ids"] = scores.numpy(), ids.astype(np.int64)
    table = cases()
    for index, case in enumerate(table):
        values[f"{index}:loss"], values[f"{index}:grad"] = run(model, matrices[case["matrix"]][0], case)
    source = (args.checkout / MODEL_FILE).read_bytes()
    meta = {"repo": np.array(REPO), "commit": np.array(commit_of(args.checkout, args.commit)),
            "sha256": np.array(json.dumps({MODEL_FILE: hashlib.sha256(source).hexdigest()})),
            "cases": np.array(json.dumps(table)), "torch": np.array(torch.__version__)}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "rcl_ccl.npz"
    np.savez_compressed(path, **values, **meta)
    print(f"{path}: {len(table)} cases, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
