"""Golden values of CRCL (Qin et al., NeurIPS 2023; github.com/QinYang79/CRCL) for
tests/test_crcl_golden.py: the authors' ``CRCL.train_self`` (CRCL_NeurIPS23/model/CRCL.py), run in
float64 on score matrices, call after call over the epochs of one round (their ``schedule`` 0): the
loss, its gradient with respect to the scores and their per-sample labels ``move_gt`` after every
call. Sequences: their opts.py defaults (tau 0.05, alpha 0.8, warm_epoch 2, --mc and --confident
on) over epochs 0-4 with captions seen again; tau 0.1 / alpha 0.5 / warm_epoch 1; --confident off;
--mc off; one batch whose pairs' labels fall under their 0.1 floor. One bundle goes to
OUT/crcl_steps.npz, with their opts.py defaults (``opts:NAME``), ``repo``, ``commit`` and the sha256
of every file of theirs read.

How their method runs here: ``train_self`` is called on a ``CRCL`` object made without its
``__init__`` (which builds their SGRAF or VSE∞ on CUDA): ``forward_emb`` hands back the given score
matrix as a leaf tensor and ``forward_sims`` returns it, so their loss reads exactly these scores;
``optimizer`` and ``logger`` are stand-ins that record (no step is taken: the gradient is read from
the leaf after their ``loss.backward()``). Their model/VSEinfty.py and model/SGRAF.py (imported by
CRCL.py, never run by these cases; VSEinfty.py imports tkinter.tix, gone from Python 3.13) are
empty stand-ins. ``Tensor.cuda`` is an identity during the run and the default dtype is float64,
so their ``torch.eye`` and ``torch.Tensor(move_gt[ids])`` are float64 as well.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/QinYang79/CRCL /tmp/CRCL
    git -C /tmp/CRCL checkout 4a964067681d78ef2a1534e12f26247bd55a52b2
    .venv/bin/python scripts/golden_crcl.py /tmp/CRCL --out tests/golden

(any folder holding their ``CRCL_NeurIPS23/`` works; --commit names the commit when it is not a
git work tree; their noisy_index.zip is not read, and is missing from the stored snapshot).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from golden_common import commit_of, cuda_as_identity, write_bundles

REPO = "QinYang79/CRCL"
CODE = "CRCL_NeurIPS23"
READ = ("model/CRCL.py", "utils.py", "opts.py")
OPTS = ("tau", "alpha", "warm_epoch", "mc", "confident", "schedules", "grad_clip", "learning_rate",
        "batch_size", "lr_update")


def their_class(code: Path):
    """Their ``CRCL`` class, CRCL.py loaded with its utils.py; the base models stubbed (sys.modules
    as it was afterwards)."""
    package = types.ModuleType("model")
    package.__path__ = []
    vse, sgraf = types.ModuleType("model.VSEinfty"), types.ModuleType("model.SGRAF")
    vse.VSEModel, sgraf.SGRAF = object, object
    spec = importlib.util.spec_from_file_location("utils", code / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    with mock.patch.dict(sys.modules, {"model": package, "model.VSEinfty": vse, "model.SGRAF": sgraf,
                                       "utils": utils}):
        spec.loader.exec_module(utils)
        spec = importlib.util.spec_from_file_location("model.CRCL", code / "model/CRCL.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.CRCL


def opts_defaults(code: Path) -> dict:
    """Their argparse defaults (store_false flags: True), read from opts.py's source."""
    out = {}
    for node in ast.walk(ast.parse((code / "opts.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            name = node.args[0].value.lstrip("-")
            keywords = {k.arg: k.value for k in node.keywords}
            if name not in OPTS:
                continue
            if "default" in keywords:
                out[name] = ast.literal_eval(keywords["default"])
            elif "action" in keywords:
                out[name] = ast.literal_eval(keywords["action"]) == "store_false"
    return out


class Recorder:
    """Their ``logger`` and ``optimizer``: records what they are told, steps nothing."""

    def __init__(self):
        self.logged, self.param_groups = {}, [{"lr": 0.0}]

    def update(self, name, value, n=None):
        self.logged[name] = value

    def zero_grad(self):
        pass

    def step(self):
        pass


def their_model(CRCL, num_samples: int, **opt):
    model = object.__new__(CRCL)
    model.opt = types.SimpleNamespace(grad_clip=0.0, **opt)
    model.tau, model.alpha, model.module_name = opt["tau"], opt["alpha"], "VSEinfty"
    model.move_gt, model.step, model.params = np.ones(num_samples), 0, []
    model.logger = model.optimizer = Recorder()
    holder = {}

    def forward_emb(images, image_lengths, captions, caption_lengths):
        holder["scores"] = images.clone().requires_grad_(True)
        return holder["scores"], None

    model.forward_emb = forward_emb
    model.forward_sims = lambda img, cap, lengths: img
    return model, holder


def scores_of(gen: torch.Generator, size: int, low: float, high: float, diagonal: float) -> torch.Tensor:
    """Cosine-like scores in [low, high], the positives ``diagonal`` higher."""
    s = torch.rand(size, size, generator=gen) * (high - low) + low
    return (s + diagonal * torch.eye(size)).clamp(-1, 1)


def sequence(CRCL, gen, opt: dict, calls: list, num_samples: int) -> dict:
    """Their train_self over ``calls`` [(epoch, ids, scores)] on one model: per call its loss,
    the gradient of the scores, and move_gt after it."""
    model, holder = their_model(CRCL, num_samples, **opt)
    out = {}
    for k, (epoch, ids, scores) in enumerate(calls):
        lengths = torch.full((len(ids),), 3, dtype=torch.int64)
        with cuda_as_identity():
            model.train_self(scores, None, None, lengths, np.asarray(ids), epoch=epoch, schedule=0)
        out[f"{k}:epoch"] = np.array(epoch)
        out[f"{k}:ids"] = np.asarray(ids, np.int64)
        out[f"{k}:scores"] = scores.numpy()
        out[f"{k}:loss"] = np.array(model.logger.logged["loss"])
        out[f"{k}:grad"] = holder["scores"].grad.numpy().copy()
        out[f"{k}:move_gt"] = model.move_gt.copy()
    out["calls"] = np.array(len(calls))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a QinYang79/CRCL checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    code = args.checkout / CODE
    CRCL = their_class(code)
    defaults = opts_defaults(code)
    gen = torch.Generator().manual_seed(0)
    n = 14  # captions in the "cache"; batches of 6 and 8 drawn from them, seen again over epochs

    def calls(epochs, spread=(-0.4, 0.6), diagonal=0.35):
        out = []
        for epoch in epochs:
            for size in (6, 8):
                ids = torch.randperm(n, generator=gen)[:size].numpy()
                out.append((epoch, ids, scores_of(gen, size, *spread, diagonal)))
        return out

    base = {"tau": defaults["tau"], "alpha": defaults["alpha"], "warm_epoch": defaults["warm_epoch"],
            "mc": defaults["mc"], "confident": defaults["confident"]}
    cases = {
        "defaults": (base, calls(range(5))),
        "tau_alpha_warm1": (dict(base, tau=0.1, alpha=0.5, warm_epoch=1), calls(range(4))),
        "not_confident": (dict(base, confident=False), calls(range(4), diagonal=0.1)),
        "no_mc": (dict(base, mc=False), calls(range(3))),
        # scores that make most p̂ small: labels fall under their 0.1 floor after the warm-up
        "floored": (base, calls(range(4), spread=(-0.2, 0.8), diagonal=-0.1)),
    }
    values = {}
    for name, (opt, sequence_calls) in cases.items():
        for key, value in sequence(CRCL, gen, opt, sequence_calls, n).items():
            values[f"{name}/{key}"] = value
        values[f"{name}/opt"] = np.array(json.dumps(opt))
    hashes = {name: hashlib.sha256((code / name).read_bytes()).hexdigest() for name in READ}
    meta = {"repo": np.array(REPO), "commit": np.array(commit_of(args.checkout, args.commit)),
            "sha256": np.array(json.dumps({f"{CODE}/{k}": v for k, v in hashes.items()})),
            "cases": np.array(json.dumps(list(cases))), "torch": np.array(torch.__version__),
            **{f"opts:{k}": np.array(json.dumps(v)) for k, v in defaults.items()}}
    write_bundles(args.out, "crcl", {"steps": values}, meta)


if __name__ == "__main__":
    main()
