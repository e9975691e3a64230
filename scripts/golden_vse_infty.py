"""Golden values of VSE∞ (Chen et al., CVPR 2021; github.com/woodfrog/vse_infty) for
tests/test_vse_infty_golden.py: the authors' GPO, EncoderImageAggr (fc + MLP + GPO, train and
eval mode, and fc + GPO), their two size augmentations and their BiGRU text encoder, run on
small random inputs with padding and sets of different sizes.  Inputs, the modules'
state_dicts and outputs go to OUT/vse_infty_{gpo,image_head,augment,text}.npz.

Their code is imported at run time from the checkouts given as arguments and never enters
this repository.  Modules their files import but these cases never run (transformers' BERT,
cv2, imageio) are replaced, during the import only, by empty stand-ins.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone https://github.com/woodfrog/vse_infty /tmp/vse_infty
    git clone -b bigru https://github.com/woodfrog/vse_infty /tmp/vse_infty_bigru
    .venv/bin/python scripts/golden_vse_infty.py /tmp/vse_infty /tmp/vse_infty_bigru --out tests/golden

(the first checkout at master, the second at branch bigru; any folder holding their ``lib/``
works, e.g. ``git archive bigru lib | tar -x -C DIR``).  The files record the commits when
the checkouts are git work trees, or those given with --master-commit / --bigru-commit.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import random
import sys
import types
from pathlib import Path

import numpy as np
import torch
from golden_common import commit_of, write_bundles
from torch import nn

STUBBED = ("transformers", "cv2", "imageio")


@contextlib.contextmanager
def reference_code(checkout: Path):
    """``import lib...`` resolves to ``checkout/lib`` inside the block; modules named in
    ``STUBBED`` are empty stand-ins there (their attributes raise if ever called)."""
    def stand_in(name):
        module = types.ModuleType(name)
        def attribute(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _refuse(f"{name}.{attr}")

        module.__getattr__ = attribute
        return module

    saved = {name: sys.modules.get(name) for name in STUBBED}
    _forget_lib()
    sys.modules.update({name: stand_in(name) for name in STUBBED})
    sys.path.insert(0, str(checkout))
    try:
        yield
    finally:
        sys.path.remove(str(checkout))
        _forget_lib()
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _refuse(what):
    def call(*args, **kwargs):
        raise RuntimeError(f"{what} is a stand-in of golden_vse_infty.py")
    return call


def _forget_lib():
    for name in [m for m in sys.modules if m == "lib" or m.startswith("lib.")]:
        del sys.modules[name]


def arrays(prefix: str, state: dict) -> dict:
    return {f"{prefix}:{k}": v.detach().cpu().numpy().copy() for k, v in state.items()}  # not a view


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


# ---------------------------------------------------------------------------- the cases


def gpo_case(gpo_module) -> dict:
    """GPO alone: K = 8 > the longest set (7), padding of large random values."""
    torch.manual_seed(1)
    gpo = gpo_module.GPO(32, 32)
    x = torch.randn(5, 8, 6)
    lengths = torch.tensor([7.0, 3.0, 1.0, 5.0, 7.0])  # floats, as their collate_fn makes them
    padding = torch.arange(8)[None] >= lengths[:, None]
    x[padding] = 50 * torch.randn(int(padding.sum()), 6)
    pooled, weights = gpo(x, lengths)
    return {"x": np_(x), "lengths": np_(lengths).astype(np.int64), "pooled": np_(pooled),
            "weights": np_(weights[..., 0]), **arrays("state", gpo.state_dict())}


def image_head_case(encoders) -> dict:
    """EncoderImageAggr over sets padded with zeros to the longest (their collate_fn): fc + MLP
    + GPO, one train-mode forward (BatchNorm statistics updated), then eval mode; with and
    without the L2 norm; and fc + GPO ("backbone": their head over CNN grids)."""
    torch.manual_seed(2)
    head = encoders.EncoderImageAggr(10, 8, precomp_enc_type="basic")
    raw = encoders.EncoderImageAggr(10, 8, precomp_enc_type="basic", no_imgnorm=True)
    raw.load_state_dict(head.state_dict())
    fc_only = encoders.EncoderImageAggr(10, 8, precomp_enc_type="backbone")
    lengths = torch.tensor([9.0, 4.0, 1.0, 7.0, 9.0, 2.0])
    x = 3 * torch.randn(6, 9, 10) + 1
    x[torch.arange(9)[None] >= lengths[:, None]] = 0
    out = {"x": np_(x), "lengths": np_(lengths).astype(np.int64), **arrays("state", head.state_dict()),
           **arrays("fc_state", fc_only.state_dict())}
    head.train(), raw.train(), fc_only.train()
    with torch.no_grad():
        out["weights"] = np_(head.gpool.compute_pool_weights(lengths, None)[0][..., 0])
        out["train"] = np_(head(x, lengths))
        out["train_raw"] = np_(raw(x, lengths))
        out["fc_only"] = np_(fc_only(x, lengths))
        out.update(arrays("state_after", {k: v for k, v in head.state_dict().items() if ".bns." in k}))
        head.eval()
        out["eval"] = np_(head(x, lengths))
    return out


def augment_case(encoders, image_caption) -> dict:
    """Their two size augmentations, driven by np.random: the precomputed-region rule of
    PrecompRegionDataset.__getitem__ + collate_fn (and the head in train mode on the result),
    and the grid rule of EncoderImageFull.forward (backbone = identity)."""
    torch.manual_seed(3)
    regions = np.random.default_rng(3).standard_normal((6, 12, 10)).astype(np.float32)
    dataset = image_caption.PrecompRegionDataset.__new__(image_caption.PrecompRegionDataset)
    dataset.__dict__.update(tokenizer=_Tokenizer(), train=True, images=regions, im_div=1,
                            captions=["a dog runs"] * len(regions), length=len(regions))
    random.seed(0)  # their caption augmentation (python's random; not compared)
    np.random.seed(30)
    images, image_lengths, *_ = image_caption.collate_fn([dataset[i] for i in range(len(regions))])
    head = encoders.EncoderImageAggr(10, 8, precomp_enc_type="basic")
    state = head.state_dict()
    with torch.no_grad():
        head.train()
        head_train = head(images, image_lengths)

    grid = torch.from_numpy(np.random.default_rng(4).standard_normal((16, 16, 4)).astype(np.float32))
    full = encoders.EncoderImageFull(nn.Identity(), 4, 8, precomp_enc_type="backbone")
    full.image_encoder = _Capture()
    full.train()
    np.random.seed(40)
    grid_out, grid_lengths = full(grid)
    return {"regions": regions, "regions_seed": np.int64(30), "regions_out": np_(images),
            "regions_lengths": np_(image_lengths).astype(np.int64), "head_train": np_(head_train),
            **arrays("state", state), "grid": np_(grid), "grid_seed": np.int64(40),
            "grid_out": np_(grid_out), "grid_lengths": np_(grid_lengths).astype(np.int64)}


class _Capture(nn.Module):
    def forward(self, features, lengths):
        return features, lengths


class _Tokenizer:
    """What their process_caption asks of BERT's tokenizer (the caption is not compared)."""

    class _Split:
        @staticmethod
        def tokenize(text):
            return text.split()

    basic_tokenizer = _Split()
    wordpiece_tokenizer = _Split()
    vocab = {"[MASK]": 1, "a": 2, "dog": 3, "runs": 4}

    def convert_tokens_to_ids(self, tokens):
        return [self.vocab.get(t, 0) for t in tokens]


def text_case(encoders) -> dict:
    """Their BiGRU EncoderText (1 and 2 layers) on captions padded with id 0, lengths sorted
    descending (their pack needs it), as floats (their VSEModel.forward_emb)."""
    tokens = torch.tensor([[1, 5, 9, 3, 12, 7, 2], [1, 4, 4, 8, 19, 2, 0], [1, 6, 11, 2, 0, 0, 0],
                           [1, 2, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0]])
    lengths = torch.tensor([7.0, 6.0, 4.0, 2.0, 1.0])
    out = {"tokens": np_(tokens), "lengths": np_(lengths).astype(np.int64)}
    for layers in (1, 2):
        torch.manual_seed(5 + layers)
        text = encoders.EncoderText(20, 8, 6, layers, use_bi_gru=True)
        raw = encoders.EncoderText(20, 8, 6, layers, use_bi_gru=True, no_txtnorm=True)
        raw.load_state_dict(text.state_dict())
        with torch.no_grad():
            out[f"out{layers}"] = np_(text(tokens, lengths))
            out[f"raw{layers}"] = np_(raw(tokens, lengths))
            out[f"weights{layers}"] = np_(text.gpool.compute_pool_weights(lengths.long(), None)[0][..., 0])
        out.update(arrays(f"state{layers}", text.state_dict()))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("master", type=Path, help="a vse_infty checkout at master")
    parser.add_argument("bigru", type=Path, help="a vse_infty checkout at branch bigru")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--master-commit")
    parser.add_argument("--bigru-commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    meta = {"master_commit": np.array(commit_of(args.master, args.master_commit)),
            "bigru_commit": np.array(commit_of(args.bigru, args.bigru_commit)),
            "torch": np.array(torch.__version__)}
    with reference_code(args.master):
        gpo = importlib.import_module("lib.modules.aggr.gpo")
        encoders = importlib.import_module("lib.encoders")
        image_caption = importlib.import_module("lib.datasets.image_caption")
        cases = {"gpo": gpo_case(gpo), "image_head": image_head_case(encoders),
                 "augment": augment_case(encoders, image_caption)}
    with reference_code(args.bigru):
        cases["text"] = text_case(importlib.import_module("lib.encoders"))
    write_bundles(args.out, "vse_infty", cases, meta)


if __name__ == "__main__":
    main()
