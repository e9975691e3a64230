"""Golden values of NCR (Huang et al., NeurIPS 2021; github.com/XLearning-SCU/2021-NeurIPS-NCR) for
tests/test_ncr_golden.py: the authors' co_train.py (``warmup``, ``eval_train``, ``split_prob``,
``train``), data.py (``get_loader``'s 'warmup' and 'train' loaders, ``collate_fn``) and model.py
(``ContrastiveLoss``, ``SGRAF.train``/``predict``, Adam and gradient clipping), run in float64 on
20 captions of 4 images with two tiny scorers (tests/ncr_tiny.py) in their ``SGRAF`` class.

- OUT/ncr_schedule.npz, one chain: A's warm-up pass, then B's; the per-pair losses of both
  (``eval_train``) and the GMM split with the random state each GMM drew from; A's co-training
  pass on B's division (a clean and a noisy loader, the noisy one cycled, from epoch
  num_epochs // 2), B's on A's (ends at a noisy batch of one pair), A's again before
  num_epochs // 2 (clean pairs only). Every step: the pairs, the targets, the loss, the clipped
  gradients, the weights and BatchNorm statistics after Adam's step.
- OUT/ncr_formulas.npz: ``ContrastiveLoss`` in mode "train" with (B, B) and (B, 1) labels for
  each soft margin (value, gradient), ``predict``, and ``split_prob`` with its fallback.

Their code is imported at run time from the checkout given as the argument and never enters this
repository. Patched around, not edited: ``torch.cuda.is_available`` is False (their ``.cuda()``
calls are skipped), DataLoader iterators get Python 2's ``.next()`` (torch 1.7 had it), nltk is a
stand-in, the default dtype is float64 (their ``torch.zeros``/``torch.Tensor`` then hold float64),
``data.collate_fn`` and ``co_train.GaussianMixture`` are wrapped to record the batches' ids and
numpy's global random state before each GMM (theirs passes no random_state).

Rerun (a CPU is enough; torch, numpy and scikit-learn from this project's .venv):

    git clone https://github.com/XLearning-SCU/2021-NeurIPS-NCR /tmp/ncr
    git -C /tmp/ncr checkout 60256ba1095798319099af6c93e8e2b4edf563fa
    .venv/bin/python scripts/golden_ncr.py /tmp/ncr --out tests/golden
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from golden_common import commit_of

ROOT = Path(__file__).resolve().parents[1]
READ = ("NCR/co_train.py", "NCR/data.py", "NCR/model.py", "NCR/utils.py", "NCR/evaluation.py", "NCR/vocab.py")
MODULES = ("co_train", "data", "model", "utils", "evaluation", "vocab")
B, CAPTIONS, IMAGES, MARGIN, LR, CLIP = 6, 20, 4, 0.2, 0.01, 0.05
NUM_EPOCHS = 4  # their opt.num_epochs: noisy pairs train from epoch 2


def tiny():
    spec = importlib.util.spec_from_file_location("ncr_tiny", ROOT / "tests" / "ncr_tiny.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def reference_code(checkout: Path):
    """Their NCR/ modules importable inside the block, with the stand-ins above."""
    saved = {name: sys.modules.get(name) for name in (*MODULES, "nltk")}
    sys.modules["nltk"] = types.ModuleType("nltk")  # tokenising text files: never run here
    sys.path.insert(0, str(checkout / "NCR"))
    iterator = torch.utils.data.dataloader._BaseDataLoaderIter
    had_next = hasattr(iterator, "next")
    iterator.next = iterator.__next__  # `unlabeled_train_iter.next()` (torch <= 1.x had it)
    cuda, torch.cuda.is_available = torch.cuda.is_available, lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = cuda
        if not had_next:
            del iterator.next
        sys.path.remove(str(checkout / "NCR"))
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def np_(t) -> np.ndarray:
    return t.detach().cpu().numpy().copy() if isinstance(t, torch.Tensor) else np.asarray(t).copy()


def randomised(net: torch.nn.Module, gen: torch.Generator) -> torch.nn.Module:
    """Nothing uniform: random weights and biases, BatchNorm affine and running statistics."""
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.8 if p.ndim > 1 else 0.3))
        net.score.scale.fill_(4.0 + float(torch.rand((), generator=gen)))
        net.image.bn.running_mean.copy_(torch.randn(net.image.bn.num_features, generator=gen) * 0.3)
        net.image.bn.running_var.copy_(0.5 + torch.rand(net.image.bn.num_features, generator=gen))
    return net


def sgraf(model_module, net, opt):
    """Their ``SGRAF`` object (its train, predict, Adam and clipping) around a tiny scorer: the
    attributes their ``__init__`` sets, with the scorer's parts as img_enc, txt_enc, sim_enc."""
    obj = model_module.SGRAF.__new__(model_module.SGRAF)
    obj.grad_clip = opt.grad_clip
    obj.img_enc, obj.txt_enc, obj.sim_enc = net.image, net.text, net.score
    obj.criterion = model_module.ContrastiveLoss(margin=opt.margin)
    obj.params = [*obj.txt_enc.parameters(), *obj.img_enc.parameters(), *obj.sim_enc.parameters()]
    obj.optimizer = torch.optim.Adam(obj.params, lr=opt.learning_rate)
    obj.Eiters = 0
    return obj


class Recorder:
    """Every ``train`` call of one of their SGRAF objects: mode, labels, loss; for a step, the
    clipped gradients and the weights and buffers after Adam's step."""

    def __init__(self, obj, net):
        self.calls, self.net, pending = [], net, {}
        train, step = obj.train, obj.optimizer.step

        def recorded_step(*args, **kwargs):
            pending["grads"] = {n: np_(p.grad) for n, p in net.named_parameters()}
            out = step(*args, **kwargs)
            pending["after"] = {n: np_(v) for n, v in net.state_dict().items()}
            return out

        def recorded_train(images, captions, lengths, hard_negative=True, labels=None, soft_margin=None,
                           mode="train"):
            pending.clear()
            out = train(images, captions, lengths, hard_negative=hard_negative, labels=labels,
                        soft_margin=soft_margin, mode=mode)
            self.calls.append({"mode": mode, "labels": None if labels is None else np_(labels),
                               "loss": np_(out) if isinstance(out, torch.Tensor) else np.array(out),
                               **pending})
            return out

        obj.optimizer.step, obj.train = recorded_step, recorded_train


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a 2021-NeurIPS-NCR checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    meta = {"repo": np.array("XLearning-SCU/2021-NeurIPS-NCR"), "commit": np.array(commit_of(args.checkout)),
            "torch": np.array(torch.__version__)}
    import sklearn

    meta["sklearn"] = np.array(sklearn.__version__)
    for path in READ:
        meta[f"sha256:{path}"] = np.array(hashlib.sha256((args.checkout / path).read_bytes()).hexdigest())
    with reference_code(args.checkout):
        modules = {name: importlib.import_module(name) for name in ("data", "model", "co_train")}
        schedule = schedule_case(modules)
        formulas = formulas_case(modules)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, values in (("schedule", schedule), ("formulas", formulas)):
        path = args.out / f"ncr_{name}.npz"
        np.savez_compressed(path, **values, **meta)
        print(f"{path}: {len(values)} arrays, {path.stat().st_size} bytes")


def schedule_case(m) -> dict:
    data, model, co_train = m["data"], m["model"], m["co_train"]
    nets = tiny()
    rng = np.random.default_rng(0)
    images = rng.normal(size=(IMAGES, nets.FEATURE_DIM))
    captions = [[int(t) for t in rng.integers(1, nets.VOCAB, size=rng.integers(3, 8))]
                for _ in range(CAPTIONS)]
    gen = torch.Generator().manual_seed(0)
    net_a, net_b = randomised(nets.TinyScorer(), gen), randomised(nets.TinyScorer(), gen)
    out = {"images": images, "lengths": np.array([len(c) for c in captions]),
           "tokens": np.array([c + [0] * (7 - len(c)) for c in captions]),
           "image_of_caption": np.arange(CAPTIONS) // 5}
    out.update({f"init_a:{k}": np_(v) for k, v in net_a.state_dict().items()})
    out.update({f"init_b:{k}": np_(v) for k, v in net_b.state_dict().items()})
    opt = SimpleNamespace(grad_clip=CLIP, margin=MARGIN, learning_rate=LR, log_step=10 ** 6,
                          num_epochs=NUM_EPOCHS, soft_margin="exponential", batch_size=B, workers=0,
                          p_threshold=0.5)
    a, b = sgraf(model, net_a, opt), sgraf(model, net_b, opt)
    rec_a, rec_b = Recorder(a, net_a), Recorder(b, net_b)

    loaded = []  # (kind, ids) of every batch their loaders made, in order
    collate = data.collate_fn

    def recorded_collate(batch):
        loaded.append((len(batch[0]), [int(item[2]) for item in batch]))
        return collate(batch)

    data.collate_fn = recorded_collate
    states = []
    gmm = co_train.GaussianMixture

    def recorded_gmm(**kwargs):
        states.append(np.random.get_state())
        return gmm(**kwargs)

    co_train.GaussianMixture = recorded_gmm
    torch.manual_seed(1)  # their loaders' shuffles
    # warm-up: A's pass, then B's (co_train.main)
    noisy_loader, size, clean = data.get_loader(captions, images, "warmup", B, 0)
    co_train.warmup(opt, noisy_loader, a, 0)
    co_train.warmup(opt, noisy_loader, b, 0)
    out.update(calls("warmup_a", rec_a, loaded, 0))
    out.update(calls("warmup_b", rec_b, loaded, len(rec_a.calls)))
    del loaded[:], rec_a.calls[:], rec_b.calls[:]
    # co-divide
    np.random.seed(5)
    prob_a, prob_b, _ = co_train.eval_train(opt, a, b, noisy_loader, size, [[], []], clean, 0)
    out["eval_ids"] = np.concatenate([ids for _, ids in loaded])
    out["eval_batch_sizes"] = np.array([len(ids) for _, ids in loaded])
    out["eval_loss_a"] = np.concatenate([c["loss"] for c in rec_a.calls])
    out["eval_loss_b"] = np.concatenate([c["loss"] for c in rec_b.calls])
    assert [c["mode"] for c in rec_a.calls + rec_b.calls] == ["eval_loss"] * (2 * len(loaded))
    for net, state in zip("ab", states, strict=True):  # numpy's global state as each GMM began
        out[f"gmm_state_{net}:keys"], out[f"gmm_state_{net}:pos"] = state[1], np.array(state[2])
        out[f"gmm_state_{net}:gauss"] = np.array([state[3], state[4]])
    out["prob_a"], out["prob_b"] = prob_a, prob_b
    out["pred_a"], out["pred_b"] = co_train.split_prob(prob_a, 0.5), co_train.split_prob(prob_b, 0.5)
    del loaded[:], rec_a.calls[:], rec_b.calls[:]
    # co-rectify, on divisions of chosen sizes: A learns from B's (14 clean: loaders of 6, 6, 2
    # and a noisy one of 6, used up every step), B from A's (13 clean, 7 noisy: its second noisy
    # batch holds one pair, where their loop stops)
    clean_for_a = np.zeros(CAPTIONS, bool)
    clean_for_a[np.argsort(-prob_b, kind="stable")[:14]] = True
    clean_for_b = np.zeros(CAPTIONS, bool)
    clean_for_b[np.argsort(-prob_a, kind="stable")[:13]] = True
    out["clean_for_a"], out["clean_for_b"] = clean_for_a, clean_for_b
    for name, net, other, rec, clean_set, prob, epoch in (
            ("train_a", a, b, rec_a, clean_for_a, prob_b, 2),
            ("train_b", b, a, rec_b, clean_for_b, prob_a, 2),
            ("early_a", a, b, rec_a, clean_for_a, prob_b, 0)):
        labeled, unlabeled = data.get_loader(captions, images, "train", B, 0, pred=clean_set, prob=prob)
        co_train.train(opt, net, other, labeled, unlabeled, epoch)
        out.update(phase(name, rec, loaded, clean_set))
        del loaded[:], rec.calls[:]
    assert not rec_a.calls and not rec_b.calls
    data.collate_fn, co_train.GaussianMixture = collate, gmm
    return out


def calls(prefix: str, rec: Recorder, loaded: list, start: int) -> dict:
    """A warm-up pass: each step's caption ids, loss, clipped gradients, state after the step."""
    out = {f"{prefix}:steps": np.array(len(rec.calls))}
    for t, call in enumerate(rec.calls):
        assert call["mode"] == "warmup"
        out[f"{prefix}:{t}:ids"] = np.array(loaded[start + t][1])
        out.update(step_values(f"{prefix}:{t}", call))
    return out


def step_values(prefix: str, call: dict) -> dict:
    out = {f"{prefix}:loss": call["loss"]}
    out.update({f"{prefix}:grad:{k}": v for k, v in call["grads"].items()})
    out.update({f"{prefix}:after:{k}": v for k, v in call["after"].items()})
    if call["labels"] is not None:
        out[f"{prefix}:labels"] = call["labels"]
    return out


def phase(prefix: str, rec: Recorder, loaded: list, clean_set: np.ndarray) -> dict:
    """A co-training pass: per iteration the clean batch, the noisy batch (global caption ids),
    then each update their loop made (the clean one; the noisy one from num_epochs // 2)."""
    clean_ids, noisy_ids = np.flatnonzero(clean_set), np.flatnonzero(~clean_set)
    iterations = []
    for kind, ids in loaded:  # collate order: a clean batch, then the noisy batch that goes with it
        if kind == 6:
            iterations.append({"clean": clean_ids[ids]})
        else:
            iterations[-1]["noisy"] = noisy_ids[ids]
    updates = iter(rec.calls)
    out = {f"{prefix}:iterations": np.array(len(iterations))}
    trained = 0
    for t, it in enumerate(iterations):
        out[f"{prefix}:{t}:clean_ids"], out[f"{prefix}:{t}:noisy_ids"] = it["clean"], it["noisy"]
        if len(it["clean"]) == 1 or len(it["noisy"]) == 1:
            break  # their loop stops before training on it
        trained += 1
        for stream in ("clean", "noisy"):
            call = next(updates, None) if stream == "clean" or prefix != "early_a" else None
            if call is not None:
                out.update(step_values(f"{prefix}:{t}:{stream}", call))
    assert next(updates, None) is None
    out[f"{prefix}:trained"] = np.array(trained)
    return out


def formulas_case(m) -> dict:
    model, co_train = m["model"], m["co_train"]
    gen = torch.Generator().manual_seed(7)
    out = {}
    criterion = model.ContrastiveLoss(margin=MARGIN)
    scores = torch.rand(B, B, generator=gen) * 0.8 + 0.1
    scores += torch.eye(B) * 0.15
    out["scores"] = np_(scores)
    out["labels_matrix"] = np_(torch.rand(B, B, generator=gen))
    out["labels_column"] = np_(torch.rand(B, 1, generator=gen))
    for soft in ("linear", "exponential", "sin"):
        for layout in ("matrix", "column"):
            s = scores.clone().requires_grad_(True)
            value = criterion(s, hard_negative=True, labels=torch.from_numpy(out[f"labels_{layout}"]),
                              soft_margin=soft, mode="train")
            value.backward()
            out[f"train:{soft}:{layout}:loss"], out[f"train:{soft}:{layout}:grad"] = np_(value), np_(s.grad)
    for mode in ("warmup", "eval_loss", "predict"):
        s = scores.clone().requires_grad_(True)
        value = criterion(s, mode=mode)
        out[f"{mode}:value"] = np_(value.clamp(0, 1) if mode == "predict" else value)  # SGRAF.predict clamps
        if mode == "warmup":
            value.backward()
            out["warmup:grad"] = np_(s.grad)
    # predict() of a batch where one pair's score beats everything (some p clamp to 0 and 1)
    lopsided = scores.clone()
    lopsided[0, :] += 0.5
    out["lopsided"] = np_(lopsided)
    out["predict:lopsided"] = np_(criterion(lopsided, mode="predict").clamp(0, 1))
    # split_prob: a division, and its fallback when the GMM calls every pair clean (with ties)
    r = np.random.default_rng(3)
    out["split:some_noisy"] = r.uniform(0, 1, 250)
    out["split:all_clean"] = np.round(r.uniform(0.6, 1.0, 250), 2)
    for name in ("some_noisy", "all_clean"):
        out[f"split:{name}:pred"] = co_train.split_prob(out[f"split:{name}"], 0.5)
    out["cases"] = np.array(json.dumps({"B": B, "margin": MARGIN, "lr": LR, "grad_clip": CLIP,
                                        "num_epochs": NUM_EPOCHS}))
    return out


if __name__ == "__main__":
    main()
