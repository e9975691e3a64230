"""Golden values of BiCro (Yang et al., CVPR 2023; github.com/xu5zhao/BiCro) for
tests/test_bicro_golden.py, run in float64 from the authors' files. One bundle,
OUT/bicro_parts.npz:

- ``loss/*``: their ``ContrastiveLoss`` (model.py) on score matrices in (0, 1) (SGRAF's sigmoid)
  of 8, 12 and 20 pairs: mode ``warmup_sele`` at warmup_rate 0.5 (run.py) and 0.3 (their scripts),
  its value and gradient; ``eval_loss`` (the per-pair losses of the division); ``predict_clean``
  (the anchors and the rest, in their order); ``train`` with (B,) labels under each soft margin
  (exponential, linear, sin), value and gradient.
- ``predict/*``: their ``SGRAF.predict`` on a clean batch and a noisy batch: the labels c_y and n_y
  from given scores and given image / caption vectors (their ``glo_emb``'s), under
  ``--noise_train train`` and ``noise_soft`` (``--noise_tem`` 0.5 and 0.9); the vectors are random
  ones, or the score matrix's rows and columns less their means (what ``bicro`` hands its labels,
  so the test can check its ``phase_targets`` whole).
- ``train/*``: the order of co_train.py's ``train`` for one epoch in each half (before and from
  ``num_epochs // 2``): which network predicts which batches and which updates follow, with
  which labels (their networks are recording stand-ins here).
- ``split/*``: their ``split_prob`` on probabilities with and without one under the threshold.
- ``bmm/*``: their ``BetaMixture1D`` (co_train.py, ``--fit_type bmm``) on per-pair losses of two
  shapes, as their ``eval_train`` runs it: parameters and the posterior of component 0.
Also run.py's defaults (``opts:NAME``), ``repo``, ``commit`` and the sha256 of every file read.

How their code runs here: model.py is imported whole. ``SGRAF.predict`` is called on an object
made without ``__init__`` (which builds the networks on CUDA): ``forward_emb``, ``forward_sim`` and
``sim_enc.glo_emb`` hand back the given scores and vectors. co_train.py is imported with its
evaluation, data and vocab modules as empty stand-ins (never run by these cases); its loaders are
lists whose iterators have the ``.next()`` their code calls (old torch DataLoader iterators did).
``Tensor.cuda`` is an identity during the run; the default dtype is float64.

Rerun (a CPU is enough; torch, numpy and scikit-learn from this project's .venv):

    git clone https://github.com/xu5zhao/BiCro /tmp/BiCro
    git -C /tmp/BiCro checkout 02316315d8be3da798f150e51c3d6315bb1b9234
    .venv/bin/python scripts/golden_bicro.py /tmp/BiCro --out tests/golden

(--commit names the commit when the folder is not a git work tree.)
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

REPO = "xu5zhao/BiCro"
READ = ("model.py", "co_train.py", "run.py")
OPTS = ("margin", "warmup_epoch", "p_threshold", "soft_margin", "noise_train", "noise_tem", "warmup_type",
        "fit_type", "warmup_rate", "num_epochs", "learning_rate", "lr_update", "grad_clip", "batch_size")
STUBBED = ("evaluation", "data", "vocab")


def load(code: Path, name: str, stubs: dict | None = None):
    """Their NAME.py as a module, imported with ``stubs`` in sys.modules (as it was afterwards)."""
    with mock.patch.dict(sys.modules, stubs or {}):
        spec = importlib.util.spec_from_file_location(name, code / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def their_modules(code: Path):
    """model.py and co_train.py (with utils.py and the stand-ins). What their files import from
    elsewhere is imported first, so that it stays in sys.modules (``load`` restores it)."""
    import matplotlib.pyplot  # noqa: F401  (their utils.py)
    import scipy.stats  # noqa: F401
    import sklearn.mixture  # noqa: F401

    model = load(code, "model")
    stubs = {name: types.ModuleType(name) for name in STUBBED}
    stubs["evaluation"].__dict__.update(evalrank=None, i2t=None, t2i=None, encode_data=None,
                                        shard_attn_scores=None)
    stubs["data"].__dict__.update(get_loader=None, get_dataset=None)
    stubs["vocab"].__dict__.update(Vocabulary=None, deserialize_vocab=None)
    stubs["model"] = model
    stubs["utils"] = load(code, "utils")
    return model, load(code, "co_train", stubs)


def run_defaults(code: Path) -> dict:
    out = {}
    for node in ast.walk(ast.parse((code / "run.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            name = node.args[0].value.lstrip("-")
            keywords = {k.arg: k.value for k in node.keywords}
            if name in OPTS and "default" in keywords:
                out[name] = ast.literal_eval(keywords["default"])
    return out


def sigmoid_scores(gen, size: int) -> torch.Tensor:
    return torch.sigmoid(3 * torch.rand(size, size, generator=gen) - 1.5 + 1.5 * torch.eye(size))


def loss_cases(model, gen) -> dict:
    out = {}
    for size in (8, 12, 20):
        scores = sigmoid_scores(gen, size)
        out[f"{size}:scores"] = scores.numpy()
        labels = torch.rand(size, generator=gen)
        out[f"{size}:labels"] = labels.numpy()
        for rate in (0.5, 0.3):
            leaf = scores.clone().requires_grad_(True)
            with cuda_as_identity():
                value = model.ContrastiveLoss(margin=0.2, warmup_rate=rate)(leaf, mode="warmup_sele")
            value.backward()
            out[f"{size}:warmup_sele:{rate}"] = value.detach().numpy()
            out[f"{size}:warmup_sele:{rate}:grad"] = leaf.grad.numpy()
        criterion = model.ContrastiveLoss(margin=0.2)
        out[f"{size}:eval_loss"] = criterion(scores.clone(), mode="eval_loss").numpy()
        clean, rest = criterion(scores.clone(), mode="predict_clean")
        out[f"{size}:anchors"], out[f"{size}:rest"] = clean.numpy(), rest.numpy()
        for margin in ("exponential", "linear", "sin"):
            leaf = scores.clone().requires_grad_(True)
            value = criterion(leaf, labels=labels, soft_margin=margin, mode="train", hard_negative=True)
            value.backward()
            out[f"{size}:train:{margin}"] = value.detach().numpy()
            out[f"{size}:train:{margin}:grad"] = leaf.grad.numpy()
    return out


def their_predictor(model, scores, images, captions, noisy_images, noisy_captions, noise_train, noise_tem):
    net = object.__new__(model.SGRAF)
    net.noise_train, net.noise_tem = noise_train, noise_tem
    net.criterion = model.ContrastiveLoss(margin=0.2)
    batches = {"clean": (scores, images, captions), "noisy": (None, noisy_images, noisy_captions)}
    net.forward_emb = lambda which, c, lengths: (which, which, lengths)
    net.forward_sim = lambda which, c, lengths: batches[which][0]
    net.sim_enc = types.SimpleNamespace(glo_emb=lambda which, c, lengths: batches[which][1:])
    return net


def predict_cases(model, gen) -> dict:
    out, index = {}, 0
    for group, (size, noisy_size, dim) in enumerate(((12, 9, 5), (20, 20, 7), (31, 17, 6))):
        scores = sigmoid_scores(gen, size)
        out[f"{group}:scores"] = scores.numpy()

        def vectors(count):  # mostly positive cosines, as of mean region / word embeddings
            return torch.randn(count, dim, generator=gen) + 0.7

        features = {
            "random": (vectors(size), vectors(size), vectors(noisy_size), vectors(noisy_size)),
            "profiles": (scores - scores.mean(1, keepdim=True), scores.T - scores.T.mean(1, keepdim=True),
                         None, None),  # what bicro hands its labels: each row / column, centred
        }
        for kind, (images, captions, noisy_images, noisy_captions) in features.items():
            for noise_train, tem in (("train", 0.9), ("noise_soft", 0.5), ("noise_soft", 0.9)):
                net = their_predictor(model, scores, images, captions, noisy_images, noisy_captions,
                                      noise_train, tem)
                lengths = [1] * size
                clean, noisy = _Tag("clean", size), _Tag("noisy", noisy_size)
                with cuda_as_identity():
                    if noisy_images is None:
                        c_y, n_y = net.predict(clean, None, lengths)
                    else:
                        c_y, n_y = net.predict(clean, None, lengths, noisy, None, lengths, epoch=1)
                case = {"c_y": c_y} if kind == "profiles" else {"images": images, "captions": captions,
                                                                "c_y": c_y}
                if noisy_images is not None:
                    case.update(noisy_images=noisy_images, noisy_captions=noisy_captions, n_y=n_y)
                for key, value in case.items():
                    out[f"{index}:{key}"] = value.numpy()
                out[f"{index}:kind"], out[f"{index}:noise_train"] = np.array(kind), np.array(noise_train)
                out[f"{index}:group"] = np.array(group)
                out[f"{index}:noise_tem"] = np.array(tem)
                index += 1
    out["count"] = np.array(index)
    return out


class Loader(list):
    class Iterator:
        def __init__(self, items):
            self._it = iter(items)

        def __next__(self):
            return next(self._it)

        next = __next__

    def __iter__(self):
        return Loader.Iterator(list.__iter__(self)) if self.cycling else list.__iter__(self)

    cycling = False


def train_order(co_train) -> dict:
    """Their ``train`` for one epoch before and one from ``num_epochs // 2``: the calls in order."""
    out = {}
    for epoch in (0, 2):
        calls = []

        class Net:
            def __init__(self, name):
                self.name = name

            def train_start(self):
                calls.append(f"{self.name}.train_start")

            def val_start(self):
                calls.append(f"{self.name}.val_start")

            def predict(self, images, text, lengths, images_n="", text_n="", lengths_n="", epoch=0):
                calls.append(f"{self.name}.predict({images},{images_n or '-'})")
                return f"c_y[{self.name}:{images}]", (f"n_y[{self.name}:{images_n}]" if epoch else "")

            def train(self, images, text, lengths, labels=None, **kwargs):
                calls.append(f"{self.name}.train({images},{labels},{kwargs.get('mode')})")
                return 0.0

        def pairs(tag, count, labeled):
            return [((_Tag(f"{tag}{i}", 2), None, None, None, torch.zeros(2), torch.zeros(2), None) if labeled
                     else (_Tag(f"{tag}{i}", 2), None, None, None, None)) for i in range(count)]

        labeled, unlabeled = Loader(pairs("L", 3, True)), Loader(pairs("U", 2, False))
        unlabeled.cycling = True
        opt = types.SimpleNamespace(num_epochs=4, soft_margin="exponential", noise_train="train",
                                    log_step=1000)
        with cuda_as_identity():
            import contextlib
            import io

            with contextlib.redirect_stdout(io.StringIO()):
                co_train.train(opt, Net("A"), Net("B"), labeled, unlabeled, epoch)
        out[f"epoch{epoch}"] = np.array(json.dumps(calls))
    out["num_epochs"] = np.array(4)
    return out


class _Tag(str):
    """A batch's name standing for its images: answers ``.size()`` as a batch of ``count``."""

    def __new__(cls, name, count):
        tag = super().__new__(cls, name)
        tag.count = count
        return tag

    def size(self, dim=None):
        return (self.count,) if dim is None else self.count


def split_cases(co_train, gen) -> dict:
    out = {}
    low = torch.rand(300, generator=gen).numpy()
    high = 0.6 + 0.4 * torch.rand(300, generator=gen).numpy()
    for name, prob in (("mixed", low), ("all_above", high)):
        out[f"{name}:prob"] = prob
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            out[f"{name}:pred"] = co_train.split_prob(prob, 0.5)
    return out


def bmm_cases(co_train) -> dict:
    """Their eval_train under --fit_type bmm on per-pair losses of two shapes: the losses min-max
    normalised (as theirs), BetaMixture1D(max_iters=10).fit, its parameters, and the posterior of
    component 0 at the normalised losses (theirs) and at them clipped as the fit clips them."""
    rng, out = np.random.RandomState(0), {}
    shapes = {"two_modes": np.concatenate([rng.beta(1.5, 8, 280), rng.beta(5, 2, 120)]) * 3 + 0.2,
              "skewed": rng.exponential(0.3, 500) + 0.05 * rng.beta(2, 2, 500)}
    for name, losses in shapes.items():
        x = (losses - losses.min()) / (losses.max() - losses.min())
        bmm = co_train.BetaMixture1D(max_iters=10).fit(x)
        out[f"{name}:losses"], out[f"{name}:alphas"], out[f"{name}:betas"] = losses, bmm.alphas, bmm.betas
        out[f"{name}:weight"] = bmm.weight
        with np.errstate(all="ignore"):
            out[f"{name}:posterior"] = bmm.posterior(x, 0)
            out[f"{name}:posterior_clipped"] = bmm.posterior(np.clip(x, 1e-4, 1 - 1e-4), 0)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a xu5zhao/BiCro checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    model, co_train = their_modules(args.checkout)
    gen = torch.Generator().manual_seed(0)
    values = {}
    for part, made in (("loss", loss_cases(model, gen)), ("predict", predict_cases(model, gen)),
                       ("train", train_order(co_train)), ("split", split_cases(co_train, gen)),
                       ("bmm", bmm_cases(co_train))):
        values.update({f"{part}/{k}": v for k, v in made.items()})
    hashes = {name: hashlib.sha256((args.checkout / name).read_bytes()).hexdigest() for name in READ}
    meta = {"repo": np.array(REPO), "commit": np.array(commit_of(args.checkout, args.commit)),
            "sha256": np.array(json.dumps(hashes)), "torch": np.array(torch.__version__),
            **{f"opts:{k}": np.array(json.dumps(v)) for k, v in run_defaults(args.checkout).items()}}
    write_bundles(args.out, "bicro", {"parts": values}, meta)


if __name__ == "__main__":
    main()
