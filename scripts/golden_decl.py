"""Golden values of DECL (Qin et al., ACM MM 2022; github.com/QinYang79/DECL) for
tests/test_decl_golden.py: the authors' evidence and loss functions (``model/DECL.py``: ``KL``,
``mse_loss``, ``DECL.get_alpha``, ``RDH_loss``, ``warmup_batch``, ``train_batch``; ``model/SGRAF.py``:
``forward_sim``'s evidences and sims_tanh) and their clean rule (``train.py``: ``get_correspondence``),
run in float64 on small random inputs. Three bundles go to OUT:

- ``decl_sgraf.npz``: their SGRAF (SGR, tiny sizes, randomised biases, BatchNorm affine parameters
  and running statistics, dropout 0) on a batch of 8: the raw scores, evidences, sims_tanh, the
  alphas, norm_e, the uncertainties, KL, mse_loss (clean and noisy labels), RDH_loss at several
  neg; then one ``warmup_batch`` and three ``train_batch`` calls (mixed, all-noisy and all-clean
  predictions, step counters across the top-k schedule), each with the raw scores it saw, its
  logged loss terms and neg, and the gradient of its loss with respect to the raw scores.
- ``decl_steps.npz``: DECL's step on a tiny bilinear scorer in place of SGRAF's encoders (their
  forward_sim, losses, clip_grad_norm_ and Adam): warmup_batch, warmup_batch, train_batch on
  three batches; the scorer's parameters before and after each step, the gradients (after their
  clipping) and the total norm before it.
- ``decl_correspondence.npz``: get_correspondence over two batches (8 and 5 pairs, shuffled ids)
  in eval mode: each batch's raw scores and ids, and the preds, norm_es_eye and uncertainty.
Each bundle also holds their opts.py defaults (``opts:NAME``), the warm-up epochs of their
train_{f30k,coco,cc152k}.sh, ``repo``, ``commit`` and the sha256 of every file of theirs read.

Their code is imported at run time from the checkout given as argument and never enters this
repository. nltk and tensorboard_logger (imported by train.py, data.py, vocab.py, never run by
these cases) are empty stand-ins; ``torch.cuda.is_available`` is False and ``Tensor.cuda`` /
``Module.cuda`` are identities during the run; the default dtype is float64, so their
``torch.ones`` / ``torch.eye`` are float64 as well.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/QinYang79/DECL /tmp/DECL
    git -C /tmp/DECL checkout 1b0a7756ed0b9c060834516ba7a733438be9af77
    .venv/bin/python scripts/golden_decl.py /tmp/DECL --out tests/golden

(any folder holding their ``2022-ACMMM-DECL/`` works; --commit names the commit when it is not a
git work tree).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import re
import sys
import types
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, write_bundles
from torch import nn

CODE = "2022-ACMMM-DECL"
STUBBED = ("nltk", "tensorboard_logger")
READ = ("model/DECL.py", "model/SGRAF.py", "train.py", "opts.py", "data.py", "evaluation.py", "utils.py",
        "vocab.py", "train_f30k.sh", "train_coco.sh", "train_cc152k.sh")
OPTS = ("batch_size", "learning_rate", "grad_clip", "margin", "warmup_epochs", "lambda1", "lambda2", "tau",
        "eta", "mu", "num_epochs", "lr_update")


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def arrays(prefix: str, state: dict) -> dict:
    return {f"{prefix}:{k}": np_(v) for k, v in state.items()}


@contextlib.contextmanager
def their_code(code: Path):
    """Their modules importable (``model.DECL``, ``train``...) inside the block, on a machine
    without a GPU, in float64."""
    def stand_in(name):
        module = types.ModuleType(name)

        def attribute(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            def refuse(*args, **kwargs):
                raise RuntimeError(f"{name}.{attr} is a stand-in of golden_decl.py")
            return refuse

        module.__getattr__ = attribute
        return module

    names = ("model", "train", "data", "opts", "evaluation", "utils", "vocab")
    saved = {name: sys.modules.get(name) for name in STUBBED}
    patched = (torch.cuda.is_available, torch.Tensor.cuda, nn.Module.cuda, torch.get_default_dtype())
    sys.modules.update({name: stand_in(name) for name in STUBBED})
    sys.path.insert(0, str(code))
    torch.cuda.is_available = lambda: False
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.cuda.is_available, torch.Tensor.cuda, nn.Module.cuda = patched[:3]
        torch.set_default_dtype(patched[3])
        sys.path.remove(str(code))
        for name in [m for m in sys.modules if m.split(".")[0] in names]:
            del sys.modules[name]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def opts_defaults(code: Path) -> dict:
    """The defaults of their opts.py's arguments, read from its text (parse_opt makes folders)."""
    values = {}
    for node in ast.walk(ast.parse((code / "opts.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            name = node.args[0].value.lstrip("-")
            for keyword in node.keywords:
                if keyword.arg == "default" and isinstance(keyword.value, ast.Constant):
                    values[name] = keyword.value.value
    return {f"opts:{name}": np.array(values[name]) for name in OPTS}


def script_warmups(code: Path) -> dict:
    return {f"script_warmup:{name}": np.int64(re.search(r"^warmup_epoch=(\d+)", (code / f"train_{name}.sh")
                                                        .read_text(), re.M).group(1))
            for name in ("f30k", "coco", "cc152k")}


class Log:
    """Their LogCollector's ``update``: the last value of each name."""

    def __init__(self):
        self.values = {}

    def update(self, name, value, n=None):
        self.values[name] = float(value)


class Tap(nn.Module):
    """Wraps a similarity module: keeps each output (the raw scores), its gradient retained."""

    def __init__(self, inner, diagonal: float = 0.0):
        super().__init__()
        self.inner, self.outputs, self.diagonal = inner, [], diagonal

    def forward(self, *args):
        out = self.inner(*args)
        if self.diagonal:  # a scorer that favours the true pairs, so the clean rule splits a batch
            out = out + self.diagonal * torch.eye(len(out))
        if out.requires_grad:
            out.retain_grad()
        self.outputs.append(out)
        return out


def options(**over) -> types.SimpleNamespace:
    """Their opts at tiny sizes; the loss settings are their opts.py defaults."""
    base = dict(img_dim=6, word_dim=5, embed_size=8, sim_dim=6, vocab_size=20, num_layers=1, bi_gru=True,
                no_imgnorm=False, no_txtnorm=False, module_name="SGR", sgr_step=3, tau=0.1, grad_clip=2.0,
                margin=0.2, max_violation=True, learning_rate=0.0002, lambda1=0.8, lambda2=0.1, eta=0.025,
                mu=5, batch_size=128)
    return types.SimpleNamespace(**{**base, **over})


def randomise(module: nn.Module, gen: torch.Generator) -> None:
    """Nothing uniform: random biases, BatchNorm affine parameters and running statistics,
    dropout off (their train mode, deterministic)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=gen))
            elif isinstance(m, nn.BatchNorm1d):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=gen))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
                m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + 1.5 * torch.rand(m.running_var.shape, generator=gen))
            elif isinstance(m, nn.Dropout):
                m.p = 0.0
            elif isinstance(m, nn.Embedding):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen))


def calibrate(sgraf, images, captions, lengths, spread: float = 0.8) -> None:
    """Their score sim_eval_w · v (v an L2-normalised vector) barely varies between pairs at
    random weights: scale and shift it so the batch's raw scores are about N(0, spread²), on the
    slope of tanh, not saturated."""
    with torch.no_grad():
        raw = sgraf.sim_enc(*sgraf.forward_emb(images, captions, lengths))
        layer = sgraf.sim_enc.sim_eval_w
        scale = spread / float((raw - layer.bias).std())
        layer.weight.mul_(scale)
        layer.bias.copy_(-float((raw - layer.bias).mean()) * scale + 0.1)


def caption_batch(gen: torch.Generator, lengths: list[int], vocab: int) -> torch.Tensor:
    tokens = torch.randint(1, vocab, (len(lengths), max(lengths)), generator=gen)
    tokens[torch.arange(max(lengths))[None] >= torch.tensor(lengths)[:, None]] = 0
    return tokens


# ---------------------------------------------------------------------------- the cases


def sgraf_case(DECL, decl_mod) -> dict:
    gen = torch.Generator().manual_seed(11)
    torch.manual_seed(11)
    opt = options()
    model = DECL.DECL(opt)
    sgraf = model.similarity_model
    for part in (sgraf.img_enc, sgraf.txt_enc, sgraf.sim_enc):
        randomise(part, gen)

    def batch(size, lengths):
        images = torch.randn(size, 36, opt.img_dim, generator=gen)
        return images, caption_batch(gen, lengths, opt.vocab_size), lengths

    images, captions, lengths = batch(8, [7, 7, 6, 5, 4, 4, 3, 2])
    model.train_start()
    calibrate(sgraf, images, captions, lengths)
    sgraf.sim_enc = Tap(sgraf.sim_enc)
    model.logger = Log()
    out = {**arrays("img_enc", sgraf.img_enc.state_dict()), **arrays("txt_enc", sgraf.txt_enc.state_dict()),
           **arrays("sim_enc", sgraf.sim_enc.inner.state_dict()),
           "images": np_(images), "captions": np_(captions), "lengths": np.array(lengths)}
    with torch.no_grad():
        alpha_i2t, alpha_t2i, norm_e, sims_tanh, sims = model.get_alpha(images, captions, lengths)
        raw = sgraf.sim_enc.outputs[-1]
        _, evidences, _ = sgraf.forward_sim(*sgraf.forward_emb(images, captions, lengths), "not sims")
        k = len(raw)
        eye = torch.eye(k).long()
        noisy = eye.clone()
        noisy[[1, 4, 6], [1, 4, 6]] = 0  # their train_batch's labels: batch_labels[i][i] = 0 if noisy
        out.update(raw=np_(raw), evidences=np_(evidences), sims_tanh=np_(sims_tanh), sims=np_(sims),
                   alpha_i2t=np_(alpha_i2t), alpha_t2i=np_(alpha_t2i), norm_e=np_(norm_e),
                   u_i2t=np_(k / alpha_i2t.sum(1)), u_t2i=np_(k / alpha_t2i.sum(1)),
                   kl_i2t=np_(decl_mod.KL(alpha_i2t, k)[:, 0]),
                   noisy_labels=np_(noisy.diagonal()),
                   mse_clean_i2t=np_(decl_mod.mse_loss(eye, alpha_i2t, k, opt.lambda2)[:, 0]),
                   mse_clean_t2i=np_(decl_mod.mse_loss(eye, alpha_t2i, k, opt.lambda2)[:, 0]),
                   mse_noisy_i2t=np_(decl_mod.mse_loss(noisy, alpha_i2t, k, opt.lambda2)[:, 0]),
                   mse_noisy_t2i=np_(decl_mod.mse_loss(noisy, alpha_t2i, k, opt.lambda2)[:, 0]),
                   rdh_neg=np.array([7, 5, 3, 1]),
                   rdh=np.stack([np_(model.RDH_loss(sims_tanh, neg=n)) for n in (7, 5, 3, 1)]))

    # the steps: (kind, step before the call, batch size, preds); neg follows from step and size
    steps = [("warmup", 0, 8, None), ("train", 4840, 8, [1, 0, 1, 1, 0, 1, 0, 1]),
             ("train", 4700, 8, [0] * 8), ("train", 4845, 6, [1, 1, 0, 1, 1, 1]),
             ("train", 6000, 8, [1, 1, 1, 0, 1, 1, 1, 1])]
    for n, (kind, start, size, preds) in enumerate(steps):
        images, captions, lengths = batch(size, sorted(torch.randint(2, 8, (size,), generator=gen).tolist(),
                                                       reverse=True))
        model.step = start
        model.train_start()
        if kind == "warmup":
            model.warmup_batch(images, captions, lengths)
        else:
            model.train_batch(images, captions, lengths, preds=torch.tensor(preds, dtype=torch.float32))
        raw = sgraf.sim_enc.outputs[-1]
        log = model.logger.values
        out.update({f"step{n}:kind": np.array(kind), f"step{n}:step": np.int64(model.step),
                    f"step{n}:raw": np_(raw), f"step{n}:grad": np_(raw.grad),
                    f"step{n}:preds": np.array(preds if preds is not None else [1] * size),
                    f"step{n}:neg": np.int64(log["H_n"]), f"step{n}:loss": np.float64(log["Loss"]),
                    f"step{n}:loss_edl": np.float64(log["Loss_edl"]),
                    f"step{n}:loss_rdh": np.float64(log["Loss_rdh"])})
    out["steps"] = np.int64(len(steps))
    return out


class _Images(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 4)

    def forward(self, images):
        return self.fc(images)


class _Captions(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, captions, lengths):
        return self.fc(captions)


class _Bilinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(()))

    def forward(self, img, cap, lengths):
        return img @ self.w @ cap.T + self.b


def steps_case(DECL, decl_mod) -> dict:
    """Their steps with a bilinear scorer as the network (raw = fc(x) W fc(c)ᵀ + b)."""
    torch.manual_seed(21)
    gen = torch.Generator().manual_seed(21)
    opt = options()
    model = DECL.DECL(opt)
    sgraf = model.similarity_model
    sgraf.img_enc, sgraf.txt_enc, sgraf.sim_enc = _Images(), _Captions(), Tap(_Bilinear())
    with torch.no_grad():
        for p in (*sgraf.img_enc.parameters(), *sgraf.txt_enc.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.7)
        sgraf.sim_enc.inner.w.mul_(0.08)
        sgraf.sim_enc.inner.b.fill_(0.1)
    model.params = [*sgraf.img_enc.parameters(), *sgraf.txt_enc.parameters(), *sgraf.sim_enc.parameters()]
    model.optimizer = torch.optim.Adam(model.params, lr=opt.learning_rate)
    model.logger = Log()
    names = ["img.fc.weight", "img.fc.bias", "cap.fc.weight", "cap.fc.bias", "w", "b"]
    norms = []
    clip = decl_mod.clip_grad_norm_

    def recording_clip(params, max_norm, *args, **kwargs):
        norms.append(float(clip(params, max_norm, *args, **kwargs)))
        return norms[-1]

    decl_mod.clip_grad_norm_ = recording_clip
    out = {"names": np.array(names), "lr": np.float64(opt.learning_rate),
           "grad_clip": np.float64(opt.grad_clip),
           **{f"before:{n}": np_(p) for n, p in zip(names, model.params)}}
    model.step = 4838
    try:
        for n, (kind, preds) in enumerate([("warmup", None), ("warmup", None),
                                           ("train", [1, 1, 0, 1, 0, 1, 1, 1])]):
            images = torch.randn(8, 6, generator=gen)
            captions = images[:, :5] + 0.5 * torch.randn(8, 5, generator=gen)
            model.train_start()
            if kind == "warmup":
                model.warmup_batch(images, captions, [1] * 8)
            else:
                model.train_batch(images, captions, [1] * 8, preds=torch.tensor(preds, dtype=torch.float32))
            out.update({f"step{n}:kind": np.array(kind), f"step{n}:images": np_(images),
                        f"step{n}:captions": np_(captions), f"step{n}:step": np.int64(model.step),
                        f"step{n}:preds": np.array(preds if preds is not None else [1] * 8),
                        f"step{n}:raw": np_(sgraf.sim_enc.outputs[-1]),
                        f"step{n}:loss": np.float64(model.logger.values["Loss"]),
                        f"step{n}:neg": np.int64(model.logger.values["H_n"]),
                        f"step{n}:norm": np.float64(norms[-1]),
                        **{f"step{n}:grad:{k}": np_(p.grad) for k, p in zip(names, model.params)},
                        **{f"step{n}:after:{k}": np_(p) for k, p in zip(names, model.params)}})
    finally:
        decl_mod.clip_grad_norm_ = clip
    out["steps"] = np.int64(3)
    return out


class _Dataset:
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length


class _Loader:
    def __init__(self, batches, length, batch_size):
        self.batches, self.dataset, self.batch_size = batches, _Dataset(length), batch_size

    def __iter__(self):
        return iter(self.batches)


def correspondence_case(DECL, train_mod) -> dict:
    """get_correspondence in eval mode over two batches (8 and 5 pairs) with shuffled ids."""
    gen = torch.Generator().manual_seed(31)
    torch.manual_seed(31)
    opt = options(log_step=100)
    model = DECL.DECL(opt)
    sgraf = model.similarity_model
    for part in (sgraf.img_enc, sgraf.txt_enc, sgraf.sim_enc):
        randomise(part, gen)
    ids = torch.randperm(13, generator=gen).tolist()
    batches = []
    for part in (ids[:8], ids[8:]):
        lengths = sorted(torch.randint(2, 8, (len(part),), generator=gen).tolist(), reverse=True)
        images = torch.randn(len(part), 36, opt.img_dim, generator=gen)
        batches.append((images, caption_batch(gen, lengths, opt.vocab_size), lengths, part, [1] * len(part)))
    model.val_start()
    calibrate(sgraf, *batches[0][:3])
    sgraf.sim_enc = Tap(sgraf.sim_enc, diagonal=0.6)
    loader = _Loader(batches, 13, 8)
    train_mod.train_loader = loader
    train_mod.logger = types.SimpleNamespace(info=lambda *a, **k: None)
    preds, labels, norm_es_eye, uncertainty = train_mod.get_correspondence(opt, model, loader, 0)
    raws = sgraf.sim_enc.outputs
    return {"raw0": np_(raws[0]), "raw1": np_(raws[1]), "ids0": np.array(ids[:8]), "ids1": np.array(ids[8:]),
            "preds": np_(preds), "norm_es_eye": np_(norm_es_eye), "uncertainty": np_(uncertainty),
            "training": np.array(sgraf.img_enc.training)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a QinYang79/DECL checkout (holding 2022-ACMMM-DECL/)")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    code = args.checkout / CODE
    meta = {"repo": np.array("QinYang79/DECL"), "commit": np.array(commit_of(args.checkout, args.commit)),
            "torch": np.array(torch.__version__), **opts_defaults(code), **script_warmups(code),
            **{f"sha256:{name}": np.array(hashlib.sha256((code / name).read_bytes()).hexdigest())
               for name in READ}}
    with their_code(code):
        decl_mod = importlib.import_module("model.DECL")
        train_mod = importlib.import_module("train")
        cases = {"sgraf": sgraf_case(decl_mod, decl_mod), "steps": steps_case(decl_mod, decl_mod),
                 "correspondence": correspondence_case(decl_mod, train_mod)}
    write_bundles(args.out, "decl", cases, meta)


if __name__ == "__main__":
    main()
