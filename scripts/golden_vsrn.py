"""Golden values of VSRN (Li et al., ICCV 2019; github.com/KunpengLi1994/VSRN) for
tests/test_vsrn_golden.py, all in float64 on small random inputs:

- ``vsrn_image.npz``: their ``EncoderImagePrecompAttn`` in both variants (``f30k_precomp``: no
  norm after fc, a BatchNorm1d on the image vector; ``coco_precomp``: every other data name),
  with the GCN BatchNorms' γ/β randomised (they start at 0: every layer the identity) and their
  running statistics estimated from a few train-mode batches; one train-mode forward over 36
  regions with its gradients, then eval mode over 36 and over 49 members.
- ``vsrn_text.npz``: their ``EncoderText`` (the GRU caption encoder), output and gradients.
- ``vsrn_caption.npz``: their caption branch (``EncoderRNN`` + ``DecoderRNN`` in
  ``S2VTAttModel``, ``misc/utils.py:LanguageModelCriterion``) on labels and masks made by their
  ``data.py`` (``PrecompDataset.__getitem__`` + ``collate_fn``; one caption past ``max_len``),
  without dropout and with their dropout 0.2 under a fixed seed; the loss and its gradients.
- ``vsrn_step.npz``: their ``VSRN`` model (``f30k_precomp``): two training steps as
  ``VSRN.train_emb`` makes them (retrieval + caption loss, ``clip_grad_norm`` over their
  parameter list, Adam over it, the caption model listed twice), the losses, the gradients of
  the first step and every parameter and buffer after each step.

Their code is imported at run time from the checkout given on the command line and never
enters this repository. Modules their files import but these cases never run (nltk's
tokenizer, pycocotools, the CIDEr scorer) are stand-ins during the import; CUDA calls are
no-ops (``torch.cuda.is_available`` is False, ``Tensor.cuda`` returns the tensor). Their
Python 2 data code gets what it reads (captions with ``.decode``, an image array indexed by
``index / im_div``); their ``bidirectional=0`` is given as False (today's nn.GRU wants a bool);
the GCN output reaches the caption model made contiguous (see ``step_case``).

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/KunpengLi1994/VSRN /tmp/VSRN
    git -C /tmp/VSRN checkout 777ae74326fdb6abe69dbd3911d0e545322520d1
    .venv/bin/python scripts/golden_vsrn.py /tmp/VSRN --out tests/golden

The files record the commit (``git rev-parse HEAD`` of the checkout, or --commit), the
torch version and the sha256 of every file of theirs that was read.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, write_bundles

REPO = "https://github.com/KunpengLi1994/VSRN"
THEIR_MODULES = ("model", "opts", "data", "models", "misc", "GCN_lib", "pyciderevalcap", "nltk",
                 "pycocotools")
READ = ("model.py", "opts.py", "data.py", "GCN_lib/__init__.py", "GCN_lib/Rs_GCN.py", "models/__init__.py",
        "models/EncoderRNN.py", "models/DecoderRNN.py", "models/Attention.py", "models/S2VTAttModel.py",
        "models/S2VTModel.py", "misc/__init__.py", "misc/utils.py", "misc/rewards.py")
VOCAB = ["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "runs", "on", "the", "grass", "man", "in",
         "red", "shirt", "rides", "bike", "two", "cats", "sleep"]  # 19 words, "zebra" etc. are <unk>
VOCAB_SIZE = 20  # one id that no word has: the decoder's output layer is wider than the words used


def _stand_in(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    module.__path__ = []  # a package: submodules may be stood in too
    return module


def _refuse(what):
    def call(*args, **kwargs):
        raise RuntimeError(f"{what} is a stand-in of golden_vsrn.py")
    return call


@contextlib.contextmanager
def reference_code(checkout: Path):
    """``import model`` etc. resolve to ``checkout`` inside the block, with stand-ins for the
    modules their files import but these cases never run, and CUDA calls made no-ops."""
    def forget():
        for name in [m for m in sys.modules if m.split(".")[0] in THEIR_MODULES]:
            del sys.modules[name]

    forget()
    tokenize = _stand_in("nltk.tokenize", word_tokenize=lambda text: text.split())
    stand_ins = {
        "nltk": _stand_in("nltk", tokenize=tokenize), "nltk.tokenize": tokenize,
        "pycocotools": _stand_in("pycocotools"), "pycocotools.coco": _stand_in("pycocotools.coco",
                                                                               COCO=_refuse("COCO")),
        "pyciderevalcap": _stand_in("pyciderevalcap"),
        "pyciderevalcap.ciderD": _stand_in("pyciderevalcap.ciderD"),
        "pyciderevalcap.ciderD.ciderD": _stand_in("pyciderevalcap.ciderD.ciderD", CiderD=_refuse("CiderD")),
    }
    sys.modules.update(stand_ins)
    sys.path.insert(0, str(checkout))
    saved = torch.cuda.is_available, torch.cuda.synchronize, torch.Tensor.cuda, torch.nn.Module.cuda
    torch.cuda.is_available = lambda: False
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # their deprecated calls (nn.init.constant, reduce=False, ...)
            yield
    finally:
        torch.cuda.is_available, torch.cuda.synchronize, torch.Tensor.cuda, torch.nn.Module.cuda = saved
        sys.path.remove(str(checkout))
        forget()


class Py2Text(str):
    """A caption line as their Python 2 code reads it: ``str(c).lower().decode('utf-8')``."""

    def __str__(self):
        return self

    def lower(self):
        return Py2Text(str.lower(self))

    def decode(self, encoding):
        return str(self)


class Py2Rows:
    """Their image array, indexed by ``index / im_div`` (an int in Python 2, a float here)."""

    def __init__(self, array):
        self.array = array

    def __getitem__(self, index):
        return self.array[int(index)]


class Vocab:
    """What their data.py asks of vocab.Vocabulary: ``vocab(word)`` → id, <unk> if unknown."""

    def __init__(self, words):
        self.index = {w: i for i, w in enumerate(words)}

    def __call__(self, word):
        return self.index.get(word, self.index["<unk>"])

    def __len__(self):
        return VOCAB_SIZE


def their_batch(data, captions, images, max_len):
    """(images, targets, lengths, labels, masks) of their PrecompDataset + collate_fn: sorted by
    caption length, longest first."""
    dataset = data.PrecompDataset.__new__(data.PrecompDataset)
    dataset.__dict__.update(vocab=Vocab(VOCAB), captions=[Py2Text(c) for c in captions],
                            images=Py2Rows(images), im_div=1, length=len(captions), max_len=max_len)
    items = [dataset[i] for i in range(len(captions))]
    images, targets, lengths, _, labels, masks = data.collate_fn(items)
    return images.double(), targets, lengths, labels, masks


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def arrays(prefix: str, state: dict) -> dict:
    return {f"{prefix}:{k}": np_(v) for k, v in state.items()}


def grads(prefix: str, module: torch.nn.Module) -> dict:
    return {f"{prefix}:{k}": np_(p.grad) for k, p in module.named_parameters() if p.grad is not None}


def randomise_image_encoder(enc, generator: torch.Generator) -> None:
    """GCN BatchNorm γ/β (0 at their init: each layer the identity), the image BatchNorm's, and
    θ, φ scaled up so the affinity matters; then their running statistics estimated from four
    train-mode batches (cumulative average), as random statistics would blow up in eval mode."""
    def uniform(t, low, high):
        t.copy_(torch.rand(t.shape, generator=generator, dtype=t.dtype) * (high - low) + low)

    with torch.no_grad():
        bns = []
        for i in range(1, 5):
            gcn = getattr(enc, f"Rs_GCN_{i}")
            uniform(gcn.W[1].weight, 0.5, 1.5)
            uniform(gcn.W[1].bias, -0.5, 0.5)
            gcn.theta.weight.mul_(3.0)
            gcn.phi.weight.mul_(3.0)
            bns.append(gcn.W[1])
        if hasattr(enc, "bn"):
            uniform(enc.bn.weight, 0.5, 1.5)
            uniform(enc.bn.bias, -0.5, 0.5)
            bns.append(enc.bn)
        enc.train()
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None
        for _ in range(4):
            enc(torch.randn(8, 36, enc.fc.in_features, generator=generator, dtype=torch.float64))
        for bn in bns:
            bn.momentum = 0.1


# ---------------------------------------------------------------------------- the cases


def image_case(model) -> dict:
    out = {}
    generator = torch.Generator().manual_seed(10)
    x36 = torch.randn(6, 36, 10, generator=generator, dtype=torch.float64)
    x49 = torch.randn(4, 49, 10, generator=generator, dtype=torch.float64)
    weights = torch.randn(6, 16, generator=generator, dtype=torch.float64)
    region_weights = torch.randn(6, 36, 16, generator=generator, dtype=torch.float64)
    out.update(x36=np_(x36), x49=np_(x49), weights=np_(weights), region_weights=np_(region_weights))
    for variant in ("f30k_precomp", "coco_precomp"):
        torch.manual_seed(11)
        enc = model.EncoderImagePrecompAttn(10, 16, variant).double()
        randomise_image_encoder(enc, generator)
        out.update(arrays(f"{variant}:state", enc.state_dict()))
        enc.train()
        x = x36.clone().requires_grad_()
        emb, regions = enc(x)
        ((emb * weights).sum() + (regions * region_weights).sum()).backward()
        out[f"{variant}:train"] = np_(emb)
        out[f"{variant}:train_regions"] = np_(regions)
        out[f"{variant}:train_grad_x"] = np_(x.grad)
        out.update(grads(f"{variant}:train_grad", enc))
        out.update(arrays(f"{variant}:state_after", {k: v for k, v in enc.state_dict().items()
                                                     if "running" in k or "num_batches" in k}))
        enc.eval()
        with torch.no_grad():
            out[f"{variant}:eval36"] = np_(enc(x36)[0])
            out[f"{variant}:eval49"] = np_(enc(x49)[0])
            out[f"{variant}:eval49_regions"] = np_(enc(x49)[1])
    return out


def text_case(model) -> dict:
    torch.manual_seed(20)
    enc = model.EncoderText(VOCAB_SIZE, 6, 16, 1).double()
    generator = torch.Generator().manual_seed(21)
    lengths = [9, 7, 7, 4, 3, 2]  # sorted, longest first: their pack_padded_sequence needs it
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(1, VOCAB_SIZE, (n,), generator=generator)
    weights = torch.randn(len(lengths), 16, generator=generator, dtype=torch.float64)
    enc.train()
    emb = enc(tokens, lengths)
    (emb * weights).sum().backward()
    return {"tokens": np_(tokens), "lengths": np.array(lengths), "weights": np_(weights), "out": np_(emb),
            **arrays("state", enc.state_dict()), **grads("grad", enc)}


CAPTIONS = [  # word counts 10 (12 tokens: past max_len 8, cut), 6 (8 tokens), 5, 3, 1 and 0
    "a man in a red shirt rides a bike on the",
    "two cats sleep on the grass",
    "a dog runs on zebra",
    "a red bike",
    "dog",
    "",
]


def caption_opt(dropout: float) -> types.SimpleNamespace:
    return types.SimpleNamespace(dim_vid=16, dim_hidden=8, dim_word=6, vocab_size=VOCAB_SIZE, max_len=8,
                                 bidirectional=False, input_dropout_p=dropout, rnn_type="gru",
                                 rnn_dropout_p=0.5)


def caption_model_of(models, opt):
    """Their caption model as VSRN.__init__ builds it (model.py:403-423)."""
    encoder = models.EncoderRNN(opt.dim_vid, opt.dim_hidden, bidirectional=opt.bidirectional,
                                input_dropout_p=opt.input_dropout_p, rnn_cell=opt.rnn_type,
                                rnn_dropout_p=opt.rnn_dropout_p)
    decoder = models.DecoderRNN(opt.vocab_size, opt.max_len, opt.dim_hidden, opt.dim_word,
                                input_dropout_p=opt.input_dropout_p, rnn_cell=opt.rnn_type,
                                rnn_dropout_p=opt.rnn_dropout_p, bidirectional=opt.bidirectional)
    return models.S2VTAttModel(encoder, decoder)


def caption_case(data, models, utils) -> dict:
    generator = torch.Generator().manual_seed(30)
    images = np.zeros((len(CAPTIONS), 1), dtype=np.float32)
    _, targets, lengths, labels, masks = their_batch(data, CAPTIONS, images, max_len=8)
    regions = torch.randn(len(CAPTIONS), 9, 16, generator=generator, dtype=torch.float64)
    out = {"targets": np_(targets), "lengths": np.array(lengths), "labels": np_(labels), "masks": np_(masks),
           "regions": np_(regions)}
    torch.manual_seed(31)
    reference = caption_model_of(models, caption_opt(0.0)).double()
    state = reference.state_dict()
    out.update(arrays("state", state))
    crit = utils.LanguageModelCriterion()
    for name, dropout in (("p0", 0.0), ("p02", 0.2)):
        caption_model = caption_model_of(models, caption_opt(dropout)).double()
        caption_model.load_state_dict(state)
        x = regions.clone().requires_grad_()
        torch.manual_seed(32)  # the dropout masks: drawn in the order the modules run
        seq_probs, _ = caption_model(x, labels, "train")
        loss = crit(seq_probs, labels[:, 1:], masks[:, 1:].double())
        loss.backward()
        out[f"{name}:loss"] = np_(loss)
        out[f"{name}:grad_regions"] = np_(x.grad)
        out.update(grads(f"{name}:grad", caption_model))
    return out


STEP_CAPTIONS = [
    ["a man in a red shirt rides a bike on the", "two cats sleep on the grass", "a dog runs on zebra",
     "a red bike", "the man", "two dogs"],
    ["a dog in the grass", "the cats sleep", "a man rides a red bike on the grass in a shirt",
     "two red cats", "dog runs", "a zebra on a bike"],
]


def step_case(model_module, data) -> dict:
    """Two steps of their VSRN.train_emb (model.py:511-547) without its logger."""
    opt = types.SimpleNamespace(
        data_name="f30k_precomp", img_dim=10, embed_size=16, finetune=False, cnn_type="vgg19", use_abs=False,
        no_imgnorm=False, word_dim=6, num_layers=1, grad_clip=0.1, margin=0.2,
        measure="cosine", max_violation=True, learning_rate=2e-4, **vars(caption_opt(0.0)))
    opt.dim_vid = opt.embed_size
    torch.manual_seed(40)
    vsrn = model_module.VSRN(opt)
    generator = torch.Generator().manual_seed(41)
    for module in (vsrn.img_enc, vsrn.txt_enc, vsrn.caption_model):
        module.double()
    randomise_image_encoder(vsrn.img_enc, generator)
    parts = {"img_enc": vsrn.img_enc, "txt_enc": vsrn.txt_enc, "caption_model": vsrn.caption_model}
    out = {}
    for name, module in parts.items():
        out.update(arrays(f"{name}:state", module.state_dict()))
    listed = [id(p) for p in vsrn.params]
    out["params_listed_twice"] = np.array(sum(listed.count(i) == 2 for i in set(listed)))
    for step, captions in enumerate(STEP_CAPTIONS):
        images = torch.randn(len(captions), 36, 10, generator=generator).numpy()
        images, targets, lengths, labels, masks = their_batch(data, captions, images, max_len=opt.max_len)
        out.update({f"step{step}:images": np_(images), f"step{step}:targets": np_(targets),
                    f"step{step}:lengths": np.array(lengths), f"step{step}:labels": np_(labels),
                    f"step{step}:masks": np_(masks)})
        vsrn.train_start()
        img_emb, cap_emb, regions = vsrn.forward_emb(images, targets, lengths)
        # .contiguous(): their l2norm's output keeps the permuted strides in today's torch (0.4.1 made
        # it contiguous), on which EncoderRNN's .view fails; the same values and gradients
        caption_loss = vsrn.calcualte_caption_loss(regions.contiguous(), labels, masks.double())
        vsrn.optimizer.zero_grad()
        retrieval_loss = vsrn.criterion(img_emb, cap_emb)
        loss = retrieval_loss + caption_loss
        loss.backward()
        norm = torch.norm(torch.stack([p.grad.norm() for p in vsrn.params if p.grad is not None]))
        assert float(norm) > 2 * opt.grad_clip, "the case must clip"
        if step == 0:
            for name, module in parts.items():
                out.update(grads(f"step0:grad:{name}", module))
        model_module.clip_grad_norm(vsrn.params, opt.grad_clip)
        vsrn.optimizer.step()
        out.update({f"step{step}:retrieval_loss": np_(retrieval_loss),
                    f"step{step}:caption_loss": np_(caption_loss), f"step{step}:grad_norm": np_(norm)})
        for name, module in parts.items():
            out.update(arrays(f"step{step}:after:{name}", module.state_dict()))
    out.update(grad_clip=np.array(opt.grad_clip), lr=np.array(opt.learning_rate), margin=np.array(opt.margin),
               max_len=np.array(opt.max_len))
    return out


def sha256_of(checkout: Path) -> dict:
    return {f"sha256:{name}": np.array(hashlib.sha256((checkout / name).read_bytes()).hexdigest())
            for name in READ}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a KunpengLi1994/VSRN checkout")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    meta = {"repo": np.array(REPO), "commit": np.array(commit_of(args.checkout, args.commit)),
            "torch": np.array(torch.__version__), **sha256_of(args.checkout)}
    with reference_code(args.checkout):
        model_module = importlib.import_module("model")
        data = importlib.import_module("data")
        models = importlib.import_module("models")
        utils = importlib.import_module("misc.utils")
        cases = {"image": image_case(model_module), "text": text_case(model_module),
                 "caption": caption_case(data, models, utils), "step": step_case(model_module, data)}
    write_bundles(args.out, "vsrn", cases, meta)


if __name__ == "__main__":
    main()
