"""Golden values of PCME's and PCME++'s losses (Chun et al., CVPR 2021; Chun, ICLR 2024;
github.com/naver-ai/pcmepp) for tests/test_pcme_golden.py: the authors' ``MCSoftContrastiveLoss``
(pcmepp/criterions/pcme.py) and ``ClosedFormSampledDistanceLoss`` (pcmepp/criterions/pcmepp.py),
run in float64 on random Gaussian embeddings (unit means, as their encoders give, and
log-variances of several scales) with a random learned shift and scale (not their start, 5 and 5):
the loss and its gradients with respect to the means, the variance outputs (their ``std``), the
shift and the scale. PCME++ at its config's options (vib_beta 1e-4, smoothness_alpha 0.1) and at
larger ones, with batches whose negatives outscore positives (pseudo-positives); PCME at K = 8 and
K = 3 samples, non-squared and squared distances.

PCME samples: their ``sample_gaussian_tensors`` draws ``torch.randn(B, K, E)`` for the images, then
for the captions. Here ``torch.randn`` is wrapped while their loss runs, and every draw it returns
is kept (``{case}:noise_img``, ``{case}:noise_cap``); the test hands ours the same draws (it
replaces ``PCMELoss.draws``), so both compute on the same samples.

Both are given ``matched``, their default ``torch.eye(B)``, in float64: their float32 one makes
PCME++'s cross-entropy round to float32.

Their code is imported at run time from the checkout given as argument (the two criterion files,
loaded by path: torch and numpy are all they import) and never enters this repository.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/naver-ai/pcmepp /tmp/src/pcmepp
    git -C /tmp/src/pcmepp checkout 8829c0d75b734e36c193b998b5963c1187fa59b2
    .venv/bin/python scripts/golden_pcme.py /tmp/src/pcmepp --out tests/golden

The files (pcme_mc.npz, pcme_csd.npz) record the commit (of the checkout when it is a git work
tree, or --commit) and the sha256 of the two criterion files read.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, write_bundles

REPO = "naver-ai/pcmepp"
FILES = {"pcme": "pcmepp/criterions/pcme.py", "pcmepp": "pcmepp/criterions/pcmepp.py"}


def load(checkout: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"pcmepp_criterion_{name}", checkout / FILES[name])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gaussians(gen, size: int, dim: int, log_sigma: tuple[float, float], near: float) -> dict:
    """Unit image means, caption means near them (``near``: the noise's scale), variance outputs
    uniform in ``log_sigma``."""
    def normal():
        return torch.randn(size, dim, generator=gen, dtype=torch.float64)

    img = torch.nn.functional.normalize(normal(), dim=1)
    cap = torch.nn.functional.normalize(img + near * normal(), dim=1)
    low, high = log_sigma

    def spread():
        return torch.rand(size, dim, generator=gen, dtype=torch.float64) * (high - low) + low

    return {"img_mean": img, "cap_mean": cap, "img_std": spread(), "cap_std": spread()}


@contextlib.contextmanager
def recorded_randn(kept: list):
    """``torch.randn`` keeps a copy of every draw it returns."""
    original = torch.randn

    def randn(*args, **kwargs):
        out = original(*args, **kwargs)
        kept.append(out.detach().clone())
        return out

    torch.randn = randn
    try:
        yield
    finally:
        torch.randn = original


def run(criterion, inputs: dict, shift: float, scale: float, kept: list | None = None) -> dict:
    criterion = criterion.double()
    with torch.no_grad():
        criterion.shift.fill_(shift)
        criterion.negative_scale.fill_(scale)
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    img = {"mean": leaves["img_mean"], "std": leaves["img_std"]}
    cap = {"mean": leaves["cap_mean"], "std": leaves["cap_std"]}
    matched = torch.eye(len(img["mean"]), dtype=torch.float64)  # their default, in float64 (see above)
    with recorded_randn(kept if kept is not None else []):
        loss, logged = criterion(img, cap, matched=matched)
    loss.backward()
    out = {"loss": np.float64(loss.item()), "grad_shift": criterion.shift.grad.numpy().copy(),
           "grad_negative_scale": criterion.negative_scale.grad.numpy().copy()}
    for k, v in leaves.items():
        out[k], out[f"grad_{k}"] = inputs[k].numpy().copy(), v.grad.numpy().copy()
    if "loss/n_pseudo_gts" in logged:
        out["n_pseudo_gts"] = np.int64(logged["loss/n_pseudo_gts"])
    return out


def csd_cases(module) -> tuple[dict, list]:
    """PCME++: (arrays by ``{case}:{name}``, the cases' options)."""
    gen = torch.Generator().manual_seed(59)
    specs = [
        dict(case="config", size=8, dim=6, log_sigma=(-4.0, -1.0), near=0.9, shift=3.1, scale=7.3,
             vib_beta=1e-4, smoothness_alpha=0.1),
        dict(case="heavy", size=6, dim=5, log_sigma=(-2.0, 0.5), near=1.4, shift=-1.7, scale=2.2,
             vib_beta=0.05, smoothness_alpha=0.5),
        dict(case="plain", size=5, dim=4, log_sigma=(-6.0, -3.0), near=0.4, shift=6.4, scale=4.1,
             vib_beta=0.0, smoothness_alpha=0.0),
    ]
    arrays = {}
    for spec in specs:
        inputs = gaussians(gen, spec["size"], spec["dim"], spec["log_sigma"], spec["near"])
        criterion = module.ClosedFormSampledDistanceLoss(vib_beta=spec["vib_beta"],
                                                          smoothness_alpha=spec["smoothness_alpha"])
        out = run(criterion, inputs, spec["shift"], spec["scale"])
        if spec["smoothness_alpha"]:
            assert out["n_pseudo_gts"] > 0, spec  # the pseudo-positive rule must act
        arrays.update({f"{spec['case']}:{k}": v for k, v in out.items()})
    return arrays, specs


def mc_cases(module) -> tuple[dict, list]:
    """PCME: (arrays by ``{case}:{name}``, the cases' options); the draws their loss made kept."""
    gen = torch.Generator().manual_seed(2021)
    specs = [
        dict(case="config", size=6, dim=5, samples=8, log_sigma=(-3.0, -0.5), near=0.8, shift=2.6,
             scale=6.1, vib_beta=0.001, prob_distance="non_squared_l2", seed=1),
        dict(case="squared", size=5, dim=4, samples=3, log_sigma=(-2.0, 0.3), near=1.2, shift=-0.8,
             scale=3.3, vib_beta=0.04, prob_distance="squared_l2", seed=2),
        dict(case="few", size=4, dim=6, samples=3, log_sigma=(-1.5, -0.2), near=0.5, shift=4.4,
             scale=1.9, vib_beta=0.0, prob_distance="non_squared_l2", seed=3),
    ]
    arrays = {}
    for spec in specs:
        inputs = gaussians(gen, spec["size"], spec["dim"], spec["log_sigma"], spec["near"])
        criterion = module.MCSoftContrastiveLoss(num_samples=spec["samples"], vib_beta=spec["vib_beta"],
                                                 prob_distance=spec["prob_distance"])
        kept: list = []
        torch.manual_seed(spec["seed"])
        out = run(criterion, inputs, spec["shift"], spec["scale"], kept)
        assert len(kept) == 2 and all(k.shape == (spec["size"], spec["samples"], spec["dim"]) for k in kept)
        out["noise_img"], out["noise_cap"] = (k.numpy() for k in kept)
        arrays.update({f"{spec['case']}:{k}": v for k, v in out.items()})
    return arrays, specs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a naver-ai/pcmepp checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    hashes = {path: hashlib.sha256((args.checkout / path).read_bytes()).hexdigest()
              for path in FILES.values()}
    meta = {"repo": np.str_(REPO), "commit": np.str_(commit_of(args.checkout, args.commit)),
            "sha256": np.str_(json.dumps(hashes))}
    mc, mc_specs = mc_cases(load(args.checkout, "pcme"))
    csd, csd_specs = csd_cases(load(args.checkout, "pcmepp"))
    write_bundles(args.out, "pcme", {"mc": {**mc, "cases": np.str_(json.dumps(mc_specs))},
                                     "csd": {**csd, "cases": np.str_(json.dumps(csd_specs))}}, meta)


if __name__ == "__main__":
    main()
