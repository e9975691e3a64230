"""Golden values of PolyLoss (Wei et al., CVPR 2020; github.com/wayne980/PolyLoss) and SelHN
(Li et al., TCSVT 2024; github.com/AAA-Zheng/RVSEPP) for tests/test_poly_selhn_golden.py, run in
float64 on small random inputs. Two bundles go to OUT:

- ``poly_cases.npz``: their ``ContrastiveLoss.polyloss`` (polyloss.py) on score matrices of 5 to
  16 pairs at margins 0.2 (their train.py's default), 0.1 and 0.5: the loss and its gradient with
  respect to the scores; and on the inner products of two sets of unit embeddings, the gradient
  with respect to both. The matrices hold queries without an informative negative (left out),
  hardest negatives inside the band where their negative polynomial is clamped at 0, a positive
  just under their 1 − 1e-5, an image shown several times (theirs: only the diagonal is a
  positive) and a batch where no query counts (their ``torch.zeros([])``).
- ``selhn_cases.npz``: their ``TripletSelHNLoss`` (loss.py) on unit embeddings of 6 to 12 pairs,
  some captions and images planted near another pair's, so that in each direction some queries
  average their hinges (positive within epsilon of the hardest negative) and others take the
  hardest; at (margin, epsilon) = (0.2, 0.01) (their train.py's defaults), (0.2, 0.05),
  (0.1, 0), (0.2, 10): the loss and its gradient with respect to both embeddings; once with
  their ``opt.batch_size`` equal to the batch (their cached masks), else 128 (their default).
Each bundle holds ``opts:NAME``, their train.py defaults (margin; epsilon for SelHN), ``repo``,
``commit``, the sha256 of each file of theirs read and the cases as JSON.

Their code is read at run time from the checkouts given as arguments and never enters this
repository. polyloss.py is a fragment without its imports (the same class, with them, sits in
their model.py, which imports SCAN's whole model): it runs here with ``torch`` and ``nn`` given.
SelHN's loss.py is imported as it is (their vse.py imports three more classes from it that the
snapshot lacks and unpacks two values from its one; neither is read here). ``Tensor.cuda`` is an
identity during the run and the default dtype is float64, so their ``torch.eye`` masks are float64.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/wayne980/PolyLoss /tmp/src/PolyLoss
    git -C /tmp/src/PolyLoss checkout 05da0039d2419e066adc07f36769424b7816cee9
    git clone https://github.com/AAA-Zheng/RVSEPP /tmp/src/RVSEPP
    git -C /tmp/src/RVSEPP checkout 329625631db96b3a17f9d6a61a06276ef8670108
    .venv/bin/python scripts/golden_poly_selhn.py /tmp/src/PolyLoss /tmp/src/RVSEPP --out tests/golden

(--poly-commit / --selhn-commit name the commits when a checkout is not a git work tree).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import re
import types
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, cuda_as_identity, write_bundles
from torch import nn

POLY_REPO, POLY_FILES = "wayne980/PolyLoss", ("polyloss.py", "train.py")
SELHN_REPO, SELHN_FILES = "AAA-Zheng/RVSEPP", ("loss.py", "train.py")


@contextlib.contextmanager
def float64_cpu():
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with cuda_as_identity():
            yield
    finally:
        torch.set_default_dtype(saved)


def train_defaults(checkout: Path, names: tuple) -> dict:
    """{name: default} of their train.py's ``--name`` arguments (float ones)."""
    text = (checkout / "train.py").read_text()
    out = {}
    for name in names:
        found = re.search(rf"'--{name}',\s*default=([-0-9.e]+)", text)
        assert found, f"--{name} not in their train.py"
        out[f"opts:{name}"] = np.array(float(found.group(1)))
    return out


def provenance(repo: str, checkout: Path, files: tuple, commit: str | None) -> dict:
    hashes = {name: hashlib.sha256((checkout / name).read_bytes()).hexdigest() for name in files}
    return {"repo": np.array(repo), "commit": np.array(commit_of(checkout, commit)),
            "sha256": np.array(json.dumps(hashes)), "torch": np.array(torch.__version__)}


def unit(rows: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    return nn.functional.normalize(torch.randn(rows, dim, generator=gen, dtype=torch.float64), dim=1)


# ---------------------------------------------------------------------------- PolyLoss


def poly_inputs() -> dict:
    """name -> (scores (B, B) float64, image_ids (B,)); the scores of 'embedded' are img @ cap.T."""
    gen = torch.Generator().manual_seed(59)

    def uniform(size, low, high):
        return torch.rand(size, size, generator=gen, dtype=torch.float64) * (high - low) + low

    eye = {size: torch.eye(size, dtype=torch.float64) for size in (5, 8, 12, 16)}
    out = {"cosine5": (uniform(5, -0.6, 0.7) + 0.25 * eye[5], np.arange(5))}
    # hardest negatives in (0.0955, 0.349), where 0.9 n² − 0.4 n + 0.03 < 0 is clamped, and above
    # (row i's hardest negative sits in column i + 1; a positive just under their 1 − 1e-5)
    band = uniform(8, -0.3, 0.05)
    hardest = torch.tensor([0.15, 0.25, 0.33, 0.45, 0.05, 0.2, 0.3, 0.7], dtype=torch.float64)
    band[torch.arange(8), (torch.arange(8) + 1) % 8] = hardest
    band.diagonal()[:] = torch.tensor([0.3, 0.35, 0.9, 0.5, 0.2, 0.3, 0.99998, 0.6], dtype=torch.float64)
    out["band8"] = (band, np.arange(8))
    # an image shown twice and one three times, its captions high on it (theirs: negatives)
    ids = np.array([0, 0, 1, 2, 2, 2, 3, 4])
    same = torch.from_numpy(ids[:, None] == ids[None, :]).double()
    out["repeated8"] = (uniform(8, -0.4, 0.4) + 0.3 * same + 0.15 * eye[8], ids)
    # SCAN-like scores: positives high, most queries without an informative negative at margin 0.1
    out["scan16"] = (uniform(16, -0.1, 0.5) + 0.45 * eye[16], np.arange(16))
    # no query counts: every positive 0.9, every negative under 0.6
    out["easy5"] = (uniform(5, -0.5, 0.6) * (1 - eye[5]) + 0.9 * eye[5], np.arange(5))
    img, cap = unit(12, 16, gen), unit(12, 16, gen)
    cap = nn.functional.normalize(cap + 0.8 * img, dim=1)
    out["embedded"] = (img, cap)
    return out


def poly_cases() -> list[dict]:
    every = ("cosine5", "band8", "repeated8", "scan16", "easy5", "embedded")
    out = [dict(matrix=m, margin=0.2) for m in every]
    out += [dict(matrix=m, margin=0.1) for m in ("band8", "scan16")]
    out += [dict(matrix=m, margin=0.5) for m in ("cosine5", "scan16", "embedded")]
    return out


def load_poly(checkout: Path):
    """Their ContrastiveLoss from polyloss.py, run with the imports the fragment lacks."""
    source = (checkout / "polyloss.py").read_text()
    namespace = {"torch": torch, "nn": nn, "__name__": "polyloss"}
    exec(compile(source, str(checkout / "polyloss.py"), "exec"), namespace)
    return namespace["ContrastiveLoss"]


def run_poly(loss_class, inputs, case) -> dict:
    first, second = inputs[case["matrix"]]
    first = first.clone().requires_grad_(True)
    second = second.clone().requires_grad_(True) if case["matrix"] == "embedded" else None
    loss = loss_class(types.SimpleNamespace(cross_attn="t2i"), margin=case["margin"])
    with float64_cpu():
        value = loss.polyloss(first if second is None else first @ second.T)
        if value.requires_grad and value.grad_fn is not None:
            value.backward()
    out = {"loss": value.detach().double().reshape(()).numpy().copy()}  # theirs is of shape (1,)
    for key, tensor in (("grad", first), ("grad_cap", second)):
        if tensor is not None:
            grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
            out[key] = grad.numpy().copy()
    return out


# ---------------------------------------------------------------------------- SelHN


def selhn_inputs() -> dict:
    """name -> (img (B, D), cap (B, D)) unit rows; pairs planted near others give close queries."""
    gen = torch.Generator().manual_seed(2024)
    out = {}
    for name, size, dim, planted in (("plain6", 6, 8, ()), ("planted10", 10, 12, ((1, 2), (4, 5), (7, 8))),
                                     ("planted12", 12, 16, ((0, 3), (6, 9), (10, 11)))):
        img, cap = unit(size, dim, gen), unit(size, dim, gen)
        cap = nn.functional.normalize(cap + 0.6 * img, dim=1)
        for a, b in planted:  # caption b and image b near pair a's: S_ab ≈ S_aa and S_ba ≈ S_aa
            for side in (cap, img):
                noise = 0.01 * torch.randn(dim, generator=gen, dtype=torch.float64)
                side[b] = nn.functional.normalize(side[a] + noise, dim=0)
        out[name] = (img, cap)
    return out


def selhn_cases() -> list[dict]:
    out = [dict(batch=m, margin=0.2, epsilon=0.01, opt_batch=128)
           for m in ("plain6", "planted10", "planted12")]
    out += [dict(batch="planted10", margin=0.2, epsilon=0.01, opt_batch=10),
            dict(batch="planted12", margin=0.2, epsilon=0.05, opt_batch=128),
            dict(batch="planted12", margin=0.1, epsilon=0.0, opt_batch=128),
            dict(batch="planted10", margin=0.2, epsilon=10.0, opt_batch=128)]
    return out


def load_selhn(checkout: Path):
    spec = importlib.util.spec_from_file_location("rvsepp_loss", checkout / "loss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TripletSelHNLoss


def run_selhn(loss_class, inputs, case) -> dict:
    img, cap = (t.clone().requires_grad_(True) for t in inputs[case["batch"]])
    opt = types.SimpleNamespace(margin=case["margin"], epsilon=case["epsilon"], batch_size=case["opt_batch"])
    with float64_cpu():
        value = loss_class(opt)(img, cap)
        value.backward()
    scores = (img @ cap.T).detach()
    positive, off = scores.diagonal(), scores - 2 * torch.eye(len(scores))
    close = [((positive - off.amax(dim=d)).abs() < case["epsilon"]).numpy() for d in (1, 0)]
    return {"loss": value.detach().numpy().copy(), "grad_img": img.grad.numpy().copy(),
            "grad_cap": cap.grad.numpy().copy(), "close_images": close[0], "close_captions": close[1]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("polyloss", type=Path, help="a wayne980/PolyLoss checkout")
    parser.add_argument("rvsepp", type=Path, help="an AAA-Zheng/RVSEPP checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--poly-commit")
    parser.add_argument("--selhn-commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    inputs, table, values = poly_inputs(), poly_cases(), {}
    for name, (first, second) in inputs.items():
        keys = ("img", "cap") if name == "embedded" else ("scores", "image_ids")
        values[f"{name}:{keys[0]}"] = first.numpy()
        values[f"{name}:{keys[1]}"] = np.asarray(second)
    loss_class = load_poly(args.polyloss)
    for index, case in enumerate(table):
        values.update({f"{index}:{k}": v for k, v in run_poly(loss_class, inputs, case).items()})
    meta = provenance(POLY_REPO, args.polyloss, POLY_FILES, args.poly_commit)
    meta.update(train_defaults(args.polyloss, ("margin",)), cases=np.array(json.dumps(table)))
    write_bundles(args.out, "poly", {"cases": values}, meta)

    inputs, table, values = selhn_inputs(), selhn_cases(), {}
    for name, (img, cap) in inputs.items():
        values[f"{name}:img"], values[f"{name}:cap"] = img.numpy(), cap.numpy()
    loss_class = load_selhn(args.rvsepp)
    for index, case in enumerate(table):
        values.update({f"{index}:{k}": v for k, v in run_selhn(loss_class, inputs, case).items()})
    meta = provenance(SELHN_REPO, args.rvsepp, SELHN_FILES, args.selhn_commit)
    meta.update(train_defaults(args.rvsepp, ("margin", "epsilon")), cases=np.array(json.dumps(table)))
    write_bundles(args.out, "selhn", {"cases": values}, meta)


if __name__ == "__main__":
    main()
