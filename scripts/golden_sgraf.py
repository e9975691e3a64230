"""Golden values of SGR and SAF (Diao et al., AAAI 2021; github.com/Paranioar/SGRAF, branch
python3.6) for tests/test_sgraf_golden.py: the authors' ``SGRAF`` model of model.py
(``EncoderImage``, the BiGRU ``EncoderText``, ``EncoderSimilarity`` with SGR or SAF, and their
``ContrastiveLoss``, margin 0.2 with max-violation, as opts.py), in float64, dropout 0.

Per module (SGR, SAF) and member count (36 regions; a 49-cell grid), one bundle
``OUT/sgraf_{sgr,saf}_{36,49}.npz`` holds:

- the inputs: 6 images (pairs 0 and 1 show the same one) and 6 padded captions of word ids,
  lengths 9, 8, 6, 4, 3, 2 (sorted, as their collate_fn gives them to ``pack_padded_sequence``);
- the weights (``img_enc:``, ``txt_enc:``, ``sim_enc:`` state dicts), randomised away from their
  initialisation: every bias, the BatchNorms' affine parameters and running statistics, the
  graph query, SAF's attention and the self-attentions' weights × 4, a score head of random
  signs (at their init several attentions are uniform and hide a slip);
- one train-mode forward as their ``train_emb`` makes it: the embeddings, the scores
  (n_image, n_caption), the loss, the gradient of every parameter and every buffer after it
  (VisualSA's BatchNorms once, SAF's BatchNorm1d(1) once per caption);
- then an eval-mode forward on the same inputs with those buffers: its scores.

Their ``EncoderSimilarity`` hard-codes ``VisualSA(embed_size, 0.4, 36)``; for the grid its
``v_global_w`` is replaced by their own ``VisualSA(embed_size, 0.4, 49)``. Their code is
imported at run time from the checkout given as argument and never enters this repository.
``torch.cuda.is_available`` is False while their model is built and run (no ``.cuda()``), and
True inside ``ContrastiveLoss`` only, whose diagonal mask is defined under that test
(model.py:443-444), with ``Tensor.cuda`` a no-op.

Rerun (a CPU is enough; torch and numpy from this project's .venv):

    git clone -b python3.6 https://github.com/Paranioar/SGRAF /tmp/SGRAF
    git -C /tmp/SGRAF checkout a19d1a9d8cb01b959991f38877e5b3840ee0df28
    .venv/bin/python scripts/golden_sgraf.py /tmp/SGRAF --out tests/golden

The files record the commit (of the checkout when it is a git work tree, or --commit), the torch
version and the sha256 of model.py, the one file read.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from golden_common import commit_of, cuda_as_identity
from torch import nn

REPO = "Paranioar/SGRAF"
MODEL_FILE = "model.py"
LENGTHS = [9, 8, 6, 4, 3, 2]
IMAGE_IDS = [0, 0, 1, 2, 3, 4]   # the image each pair shows: pairs 0 and 1 one image
SIZES = dict(img_dim=20, embed_size=16, word_dim=10, vocab_size=30, sim_dim=8)


def load_model(checkout: Path):
    spec = importlib.util.spec_from_file_location("sgraf_model", checkout / MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arrays(prefix: str, values: dict) -> dict:
    return {f"{prefix}:{k}": v.detach().cpu().numpy().copy() for k, v in values.items()}


class _Logger:
    def update(self, *args, **kwargs):
        pass


def build(model, module_name: str, members: int, seed: int):
    """Their SGRAF object (opts.py's defaults but the sizes), float64, dropout 0, randomised."""
    opt = SimpleNamespace(grad_clip=2.0, no_imgnorm=False, num_layers=1, bi_gru=True, no_txtnorm=False,
                          module_name=module_name, sgr_step=3, margin=0.2, max_violation=True,
                          learning_rate=2e-4, **SIZES)
    torch.manual_seed(seed)
    with cuda_as_identity(False):
        sgraf = model.SGRAF(opt)
    if members != 36:  # their EncoderSimilarity hard-codes VisualSA(embed_size, 0.4, 36)
        sgraf.sim_enc.v_global_w = model.VisualSA(opt.embed_size, 0.4, members)
    sgraf.logger = _Logger()
    parts = (sgraf.img_enc, sgraf.txt_enc, sgraf.sim_enc)
    for part in parts:
        part.double()
        for m in part.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    with torch.no_grad():
        for part in parts:
            for name, p in part.named_parameters():
                if name.endswith("bias") or "bias_" in name:  # the GRU's too
                    p.uniform_(-0.5, 0.5)
                elif p.ndim == 1:  # BatchNorm γ
                    p.uniform_(0.5, 1.5)
                if any(w in name for w in ("graph_query_w.weight", "attn_sim_w.weight", "embedding_common")):
                    p.mul_(4.0)  # sharper attentions than at init
            for m in part.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.running_mean.uniform_(-0.3, 0.3)
                    m.running_var.uniform_(0.5, 2.0)
        # a score head of random signs, then scaled and shifted so that the logits of the eval
        # scores below have mean 0 and std 2: scores spread over (0, 1), not all near σ(bias)
        head = sgraf.sim_enc.sim_eval_w
        head.weight.copy_(torch.randn(head.weight.shape, dtype=torch.float64))
        head.bias.zero_()
    return sgraf


def spread_scores(sgraf, images, captions) -> None:
    """Scale and shift the score head so that the logits of a train-mode and an eval-mode
    forward (their buffers restored after it) have mean 0 and std 2 together."""
    parts = (sgraf.img_enc, sgraf.txt_enc, sgraf.sim_enc)
    saved = [{k: v.clone() for k, v in part.state_dict().items()} for part in parts]
    logits = []
    with cuda_as_identity(False), torch.no_grad():
        for start in (sgraf.train_start, sgraf.val_start):
            start()
            logits.append(torch.logit(sgraf.forward_sim(*sgraf.forward_emb(images, captions, list(LENGTHS)))))
        for part, state in zip(parts, saved):
            part.load_state_dict(state)
        logits = torch.cat(logits)
        head = sgraf.sim_enc.sim_eval_w
        scale = 2.0 / logits.std()
        head.weight.mul_(scale)
        head.bias.fill_(-float(scale * logits.mean()))


def inputs(members: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(len(IMAGE_IDS), members, SIZES["img_dim"], generator=g, dtype=torch.float64)
    images = images[torch.tensor(IMAGE_IDS)]  # pairs 0 and 1 show one image
    captions = torch.randint(1, SIZES["vocab_size"], (len(LENGTHS), max(LENGTHS)), generator=g)
    captions[torch.arange(max(LENGTHS))[None] >= torch.tensor(LENGTHS)[:, None]] = 0
    return images, captions


def case(model, module_name: str, members: int, seed: int) -> dict:
    sgraf = build(model, module_name, members, seed)
    images, captions = inputs(members, seed + 100)
    spread_scores(sgraf, images, captions)
    parts = {"img_enc": sgraf.img_enc, "txt_enc": sgraf.txt_enc, "sim_enc": sgraf.sim_enc}
    out = {"images": images.numpy(), "captions": captions.numpy(), "lengths": np.array(LENGTHS),
           "image_ids": np.array(IMAGE_IDS)}
    for name, part in parts.items():
        out.update(arrays(f"{name}:state", part.state_dict()))
    # one training forward as their train_emb makes it (no clipping, no optimizer step)
    sgraf.train_start()
    with cuda_as_identity(False):
        img_embs, cap_embs, cap_lens = sgraf.forward_emb(images, captions, list(LENGTHS))
        sims = sgraf.forward_sim(img_embs, cap_embs, cap_lens)
    with cuda_as_identity(True):  # their ContrastiveLoss defines its diagonal mask only when CUDA is there
        loss = sgraf.forward_loss(sims)
    loss.backward()
    out.update(img_emb=img_embs.detach().numpy(), cap_emb=cap_embs.detach().numpy(),
               train_sims=sims.detach().numpy(), loss=loss.detach().numpy())
    for name, part in parts.items():
        out.update(arrays(f"{name}:grad", {k: p.grad for k, p in part.named_parameters()}))
        out.update(arrays(f"{name}:state_after", part.state_dict()))
    sgraf.val_start()
    with cuda_as_identity(False), torch.no_grad():
        out["eval_sims"] = sgraf.forward_sim(*sgraf.forward_emb(images, captions, list(LENGTHS))).numpy()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a Paranioar/SGRAF checkout at branch python3.6")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--commit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.checkout)
    meta = {"repo": np.array(REPO), "commit": np.array(commit_of(args.checkout, args.commit)),
            "torch": np.array(torch.__version__),
            "sha256": np.array(json.dumps({MODEL_FILE: hashlib.sha256((args.checkout / MODEL_FILE)
                                                                      .read_bytes()).hexdigest()}))}
    args.out.mkdir(parents=True, exist_ok=True)
    for seed, (module_name, members) in enumerate([("SGR", 36), ("SGR", 49), ("SAF", 36), ("SAF", 49)]):
        values = case(model, module_name, members, seed)
        path = args.out / f"sgraf_{module_name.lower()}_{members}.npz"
        np.savez_compressed(path, **values, **meta)
        print(f"{path}: {len(values)} arrays, {path.stat().st_size} bytes, loss {float(values['loss']):.6g}")


if __name__ == "__main__":
    main()
