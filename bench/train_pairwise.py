"""Training steps of SGR and SAF (pipeline.networks.sgraf), or of VSRN (pipeline.networks.vsrn,
``--vsrn``), against the arithmetic they do and against the authors' code, side by side in one
process, plus the peak memory of each.

    python bench/train_pairwise.py                 # the authors' sizes (minutes on 2 cores)
    python bench/train_pairwise.py --small         # a quick run
    python bench/train_pairwise.py --bf16          # adds our step under bf16 autocast
    python bench/train_pairwise.py --vsrn --authors VSRN_CHECKOUT   # VSRN's step instead
    python bench/train_pairwise.py --vsrn --profile                 # bench/results/vsrn_step_profile.json
    python bench/train_pairwise.py --device cuda --bf16             # on a GPU: train_pairwise_cuda.json

Sizes (``--small`` shrinks them): a batch of 128 images of 36 regions × 2048 and 128 captions of
word ids (vocabulary 8,000, word_dim 300, lengths drawn once around Flickr30K's mean of 12 words
plus ``<start>``/``<end>``), embed 1024, sim_dim 256, 3 SGR steps: the authors' opts.py. VSRN's
(their train.py and opts.py): embed 2048, their f30k_precomp image encoder, the caption branch
(GRUs 512 wide, words 300-d, captions cut at 60 tokens, dropout 0.2); ``--size reduced``: batch
64, embed 1024 (the same embed ÷ (batch · regions), an eighth of the GCN's arithmetic).

Timed per network, interleaved over ``--steps`` rounds (they share any drift in machine load),
medians reported with max/min:

- ``ours``: the network's train-mode forward (B × B scores), the hinge loss (margin 0.2, hardest
  negatives), backward, gradient clipping at 2 and an Adam step; VSRN's as the Trainer makes it
  (the caption loss added, the caption model twice in the clipping and in Adam, as theirs);
- ``authors``: their ``SGRAF.train_emb`` on the same batch and weights of the same sizes (their
  model.py imported at run time from ``--authors`` (default: $VSE_SGRAF_CHECKOUT), with
  ``torch.cuda.is_available`` False; skipped when absent); VSRN's ``VSRN.train_emb``
  (``--authors``, default $VSE_VSRN_CHECKOUT; imported as scripts/golden_vsrn.py does);
- ``gemm``: the matrix products alone of the same step (image fc, the BiGRU, VisualSA/TextSA's
  linears, word × region attention, the attended context, the local similarity's linear, SGR's
  graph or SAF's attention linear, forward and backward) over the captions grouped by length, so
  nothing is padded: what the arithmetic costs on this CPU. ``ours`` ÷ ``gemm`` steps/s is the
  fraction of the arithmetic's limit that the step reaches (target ≥ 0.8). VSRN's: the fc, the
  4 GCN layers' maps and products (folded as ``vsrn.folds`` says, as ours), the GRUs (members,
  words packed, the caption encoder, the decoder step by step with its attention's products) and
  the vocabulary map over the predicted words.

Also the multiply-add count of a forward pass, and the fp32 matmul rate of this CPU (a 2048³
product), so ``flop / rate`` is a second, cruder limit. Peak memory: each step kind run once in a
child process of its own, its VmHWM (``nothing_built``: a child that only imports torch,
the floor). Writes bench/results/train_pairwise.json (``--out``; with ``--vsrn``
train_pairwise_vsrn.json).

``--device cuda``: every kind on the GPU, the authors' code as it runs there (their ``.cuda()``
calls real, nothing faked), each step followed by a synchronize; bf16 is autocast on the GPU;
the matmul rate is the GPU's (fp32 as PyTorch runs it: TF32 off unless
``torch.backends.cuda.matmul.allow_tf32``); peak memory is ``torch.cuda.max_memory_allocated``
of one step of each kind, built alone. Files get a ``_cuda`` suffix.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # golden_common: the authors' CUDA calls as identity

import torch  # noqa: E402
from golden_common import cuda_as_identity  # noqa: E402
from torch import nn  # noqa: E402

PAIR_BUDGET = 0  # --pair-budget: SGRAF's launch_bound_train_pair_budget for our steps (0: its own)
AUTHORS = os.environ.get("VSE_SGRAF_CHECKOUT", "")  # a Paranioar/SGRAF checkout (python3.6), if any
VSRN_AUTHORS = os.environ.get("VSE_VSRN_CHECKOUT", "")  # a KunpengLi1994/VSRN checkout, if any
SIZES = {"authors": dict(batch=128, members=36, feature_dim=2048, embed=1024, sim_dim=256, word_dim=300,
                         vocab=8000),
         "small": dict(batch=32, members=36, feature_dim=256, embed=256, sim_dim=64, word_dim=64, vocab=1000)}
# VSRN (their train.py and opts.py): embed 2048, the caption branch's GRUs 512 wide, its words 300-d,
# captions cut at 60 tokens. "reduced" keeps the ratio embed / (batch · regions) of theirs (what
# decides ``vsrn.folds``) at an eighth of the GCN's arithmetic: its profile fits minutes on 2 cores.
_CAPTION = dict(caption_hidden=512, caption_word_dim=300, max_len=60)
SIZES.update({"vsrn_authors": dict(batch=128, members=36, feature_dim=2048, embed=2048, word_dim=300,
                                   vocab=8000, **_CAPTION),
              "vsrn_reduced": dict(batch=64, members=36, feature_dim=2048, embed=1024, word_dim=300,
                                   vocab=8000, **_CAPTION),
              "vsrn_small": dict(batch=32, members=36, feature_dim=256, embed=256, word_dim=64, vocab=1000,
                                 caption_hidden=64, caption_word_dim=64, max_len=60)})


# ------------------------------------------------------------------------------------------ inputs
def to_device(device: str, *tensors):
    return tuple(t.to(device) for t in tensors)


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def batch(size: dict, seed: int = 0):
    """Images (B, K, D), word ids (B, T) padded with 0, lengths (B,) sorted longest first."""
    g = torch.Generator().manual_seed(seed)
    b = size["batch"]
    lengths = (torch.randn(b, generator=g) * 3.5 + 12.3).round().clamp(5, 30).long() + 2
    lengths = lengths.sort(descending=True).values
    images = torch.randn(b, size["members"], size["feature_dim"], generator=g).relu_()
    captions = torch.randint(1, size["vocab"], (b, int(lengths[0])), generator=g)
    captions[torch.arange(captions.shape[1])[None] >= lengths[:, None]] = 0
    return images, captions, lengths


def forward_madds(size: dict, lengths, network: str, sgr_steps: int = 3) -> float:
    """Multiply-adds of one forward pass of the B × B pairs (the products; elementwise work aside)."""
    b, k, e, s = size["batch"], size["members"], size["embed"], size["sim_dim"]
    enc = b * k * size["feature_dim"] * e + 2 * b * k * e * e               # fc, VisualSA's two
    words = int(sum(lengths))
    enc += words * 2 * 3 * (size["word_dim"] + e) * e + 2 * words * e * e  # BiGRU, TextSA's two
    total = 0.0
    for n in lengths.tolist():
        pair = 2 * n * k * e + n * e * s + e * s                           # attention, context, sims
        if network == "sgr":
            pair += sgr_steps * (3 * (n + 1) * s * s + 2 * (n + 1) ** 2 * s)
        else:
            pair += (n + 1) * s + (n + 1) * s
        total += b * (pair + s)
    return enc + total


# ------------------------------------------------------------------------------------------ steps
def ours_step(network: str, size: dict, dtype=None, device: str = "cpu"):
    from pipeline.losses.base import build_loss
    from pipeline.networks.network import NetworkConfig, build_network

    torch.manual_seed(0)
    config = NetworkConfig(network, feature_dim=size["feature_dim"], set_size=size["members"],
                           embed_dim=size["embed"], vocab_size=size["vocab"], word_dim=size["word_dim"],
                           options={"sim_dim": size["sim_dim"]})
    model = build_network(config).train().to(device)
    if PAIR_BUDGET:  # --pair-budget: the chunks off the CPU (issue 50: one chunk against a few)
        model.launch_bound_train_pair_budget = PAIR_BUDGET
    loss_fn = build_loss("mh", margin=0.2, mask_same_image=False)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4)
    images, captions, lengths = batch(size)
    images, captions = to_device(device, images, captions)
    ids = torch.arange(len(images), device=device)
    kind = torch.device(device).type
    cast = (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if dtype else contextlib.nullcontext

    def step():
        with cast():
            scores = model(images, captions, lengths)
        loss = loss_fn.scored(scores.float(), image_ids=ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 2.0)
        opt.step()
    return step


def authors_step(network: str, size: dict, checkout: Path, device: str = "cpu"):
    spec = importlib.util.spec_from_file_location("sgraf_authors_model", checkout / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    opt = SimpleNamespace(grad_clip=2.0, no_imgnorm=False, num_layers=1, bi_gru=True, no_txtnorm=False,
                          module_name=network.upper(), sgr_step=3, margin=0.2, max_violation=True,
                          learning_rate=2e-4, img_dim=size["feature_dim"], embed_size=size["embed"],
                          word_dim=size["word_dim"], vocab_size=size["vocab"], sim_dim=size["sim_dim"])
    torch.manual_seed(0)
    gpu = str(device).startswith("cuda")  # on a GPU their code runs as written: .cuda() real
    fake = contextlib.nullcontext if gpu else cuda_as_identity
    with fake():
        sgraf = module.SGRAF(opt)
    if size["members"] != 36:
        sgraf.sim_enc.v_global_w = module.VisualSA(size["embed"], 0.4, size["members"])
    sgraf.logger = SimpleNamespace(update=lambda *a, **k: None)
    criterion = sgraf.criterion

    def loss(scores):  # their diagonal mask exists only under torch.cuda.is_available()
        with cuda_as_identity(True):
            return criterion(scores)
    if not gpu:
        sgraf.criterion = loss
    if gpu and size["members"] != 36:
        sgraf.sim_enc.cuda()
    sgraf.train_start()
    images, captions, lengths = batch(size)
    lengths = lengths.tolist()

    def step():
        with fake():
            sgraf.train_emb(images, captions, lengths)
    return step


def gemm_step(network: str, size: dict, device: str = "cpu"):
    """The products of one training step and their gradients, nothing else (see the module text)."""
    torch.manual_seed(0)
    e, s = size["embed"], size["sim_dim"]
    images, captions, lengths = batch(size)
    images, captions = to_device(device, images, captions)
    p = lambda *shape: nn.Parameter(torch.randn(*shape, device=device) / shape[0] ** 0.5)  # noqa: E731
    w = dict(fc=p(size["feature_dim"], e), va=p(e, e), vg=p(e, e), ta=p(e, e), tg=p(e, e), loc=p(e, s),
             glo=p(e, s), ev=p(s, 1), q=[p(s, s) for _ in range(3)], k=[p(s, s) for _ in range(3)],
             g=[p(s, s) for _ in range(3)], att=p(s, 1))
    embed = nn.Embedding(size["vocab"], size["word_dim"]).to(device)
    rnn = nn.GRU(size["word_dim"], e, batch_first=True, bidirectional=True).to(device)
    params = [v for x in w.values() for v in (x if isinstance(x, list) else [x])]
    params += list(embed.parameters()) + list(rnn.parameters())
    groups = [(int(n), (lengths == n).nonzero().squeeze(1)) for n in lengths.unique()]

    def step():
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        v = images @ w["fc"]
        v_glo = (v @ w["va"] * (v.mean(1) @ w["vg"])[:, None]).sum(1)
        out, _ = rnn(pack_padded_sequence(embed(captions), lengths, batch_first=True))
        words = pad_packed_sequence(out, batch_first=True)[0][..., :e]
        t_glo = (words @ w["ta"] * (words.mean(1) @ w["tg"])[:, None]).sum(1)
        total = 0
        for n, rows in groups:
            c = words[rows, :n]
            attn = torch.einsum("ike,cle->iclk", v, c)
            ctx = torch.einsum("iclk,ike->icle", attn, v)
            loc = ctx @ w["loc"]
            glo = (v_glo[:, None] - t_glo[rows][None]) @ w["glo"]
            nodes = torch.cat([glo[:, :, None], loc], 2)
            if network == "sgr":
                for i in range(3):
                    edges = (nodes @ w["q"][i]) @ (nodes @ w["k"][i]).transpose(-1, -2)
                    nodes = (edges @ nodes) @ w["g"][i]
                vec = nodes[:, :, 0]
            else:
                vec = ((nodes @ w["att"]).transpose(-1, -2) @ nodes).squeeze(-2)
            total = total + (vec @ w["ev"]).sum()
        for x in params:
            x.grad = None
        total.backward()
    return step


# ------------------------------------------------------------------------------------------ VSRN
def vsrn_batch(size: dict, seed: int = 0):
    """``batch`` with captions as their data.py writes them: <start> words <end> (lengths count
    both), and the caption branch's labels and masks of their data.py ((B, max_len + 1): the
    tokens cut at max_len, then zeros; the mask through the first zero)."""
    from pipeline.core.tokens import END, SPECIALS, START

    images, captions, lengths = batch(size, seed)
    rows = torch.arange(len(lengths))
    captions[:, 0] = SPECIALS.index(START)
    captions[rows, lengths - 1] = SPECIALS.index(END)
    max_len = size["max_len"]
    labels = torch.zeros(len(lengths), max_len + 1, dtype=torch.long)
    masks = torch.zeros(len(lengths), max_len + 1)
    for i, n in enumerate(lengths.tolist()):
        words = captions[i, :n].clone()
        if n > max_len - 1:
            words = words[:max_len]
            words[-1] = SPECIALS.index(END)
        labels[i, :len(words)] = words
        masks[i, :len(words) + 1] = 1
    return images, captions, lengths, labels, masks


def vsrn_madds(size: dict, lengths, fold: bool | None = None) -> dict:
    """Multiply-adds of VSRN's training forward by part (the products; elementwise work aside):
    ``fold`` None: as our step does them (``vsrn.folds``), False: as the authors' code does."""
    from pipeline.networks.vsrn import folds

    b, k, d, e = size["batch"], size["members"], size["feature_dim"], size["embed"]
    h, w, cw, v = size["caption_hidden"], size["word_dim"], size["caption_word_dim"], size["vocab"]
    rows, words = b * k, int(sum(lengths))
    fold = folds(e, rows) if fold is None else fold
    affinity = (rows * e * e + e ** 3) if fold else 2 * rows * e * e       # θ, φ (or M = θᵀφ)
    residual = (rows * e * e + e ** 3) if fold else 2 * rows * e * e       # g, W (or N = W g)
    gcn = 4 * (affinity + residual + 2 * b * k * k * e)                     # + the two bmm
    steps = min(int(lengths.max()), size["max_len"] - 1)
    predicted = int(lengths.clamp(max=steps).sum())  # the vocabulary map: only where a word is predicted
    decoder = steps * b * (h * h + k * h + k * h + 3 * (cw + h) * h + 3 * h * h) + predicted * h * v
    return {"fc": rows * d * e, "gcn": gcn, "image_gru": 2 * rows * 3 * e * e,
            "text_gru": words * 3 * (w + e) * e,
            "caption_encoder": rows * e * h + 2 * rows * 3 * h * h + rows * h * h, "caption_decoder": decoder}


def vsrn_ours_step(size: dict, dtype=None, device: str = "cpu"):
    """`vse train --network vsrn`'s step as the Trainer makes it: VSEModel (their f30k_precomp
    encoder, the caption branch with their options), the max-of-hinges loss + the caption loss,
    backward, clipping at 2 over the list that holds the caption model twice, their Adam list."""
    import dataclasses

    from pipeline.core.config import TrainConfig
    from pipeline.losses.hinge import MaxHingeLoss
    from pipeline.networks.vse_model import ModelConfig, VSEModel
    from pipeline.networks.vsrn import VARIANTS, VSRNOptions
    from pipeline.training.factories import create_optimizer, trainable_parameters
    from pipeline.training.trainer import clip_gradients

    torch.manual_seed(0)
    options = VSRNOptions(variant="f30k", caption_max_len=size["max_len"],
                          caption_hidden=size["caption_hidden"], caption_word_dim=size["caption_word_dim"])
    cfg = ModelConfig(vocab_size=size["vocab"], feature_dim=size["feature_dim"], embed_dim=size["embed"],
                      word_dim=size["word_dim"], image_pool="vsrn", pool_options=VARIANTS["f30k"],
                      caption_loss_weight=1.0, network_options=dataclasses.asdict(options))
    model = VSEModel(cfg).train().to(device)
    loss_fn = MaxHingeLoss(margin=0.2)
    trainable, _ = trainable_parameters(model, loss_fn)
    optimizer = create_optimizer(TrainConfig(features="x.h5", run_dir="r", network="vsrn", lr=2e-4,
                                             grad_clip=2.0), model, trainable)
    images, captions, lengths, _, _ = vsrn_batch(size)
    images, captions = to_device(device, images, captions)
    kind = torch.device(device).type
    cast = (lambda: torch.autocast(kind, dtype=dtype)) if dtype else contextlib.nullcontext

    def step():
        with cast():
            img, cap = model(images, captions, lengths)
            loss = loss_fn(img.float(), cap.float()) + sum(model.auxiliary_losses().values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_gradients(trainable, 2.0)
        optimizer.step()
    return step


def vsrn_authors_step(size: dict, checkout: Path, device: str = "cpu"):
    """Their ``VSRN.train_emb`` (model.py) on the same sizes: forward_emb, their caption loss
    (``calcualte_caption_loss`` less its CUDA calls), their ContrastiveLoss, backward,
    ``clip_grad_norm`` over their list, Adam. Imported as scripts/golden_vsrn.py does; their
    logger's ``loss.data[0]`` (Python 2 era torch) left out, as there."""
    import warnings

    from golden_vsrn import reference_code

    opt = SimpleNamespace(data_name="f30k_precomp", img_dim=size["feature_dim"], embed_size=size["embed"],
                          finetune=False, cnn_type="vgg19", use_abs=False, no_imgnorm=False,
                          word_dim=size["word_dim"], num_layers=1, grad_clip=2.0, margin=0.2,
                          measure="cosine", max_violation=True, learning_rate=2e-4, dim_vid=size["embed"],
                          dim_hidden=size["caption_hidden"], dim_word=size["caption_word_dim"],
                          vocab_size=size["vocab"], max_len=size["max_len"], bidirectional=False,
                          input_dropout_p=0.2, rnn_type="gru", rnn_dropout_p=0.5)
    with reference_code(checkout):
        module = importlib.import_module("model")
        torch.manual_seed(0)
        vsrn = module.VSRN(opt)
    clip = module.clip_grad_norm
    gpu = str(device).startswith("cuda")
    if gpu:  # built under reference_code's CPU stand-ins; on a GPU it runs as written, .cuda() real
        for part in (vsrn.img_enc, vsrn.txt_enc, vsrn.caption_model):
            part.to(device)  # the same Parameter objects: their Adam list still holds them
    images, captions, lengths, labels, masks = vsrn_batch(size)
    images, captions, labels, masks = to_device(device, images, captions, labels, masks)
    lengths = lengths.tolist()

    def step():
        with warnings.catch_warnings(), (contextlib.nullcontext() if gpu else cuda_as_identity()):
            warnings.simplefilter("ignore")  # their deprecated calls (F.tanh, clip_grad_norm, ...)
            vsrn.train_start()
            img_emb, cap_emb, regions = vsrn.forward_emb(images, captions, lengths)
            seq_probs, _ = vsrn.caption_model(regions.contiguous(), labels, "train")
            caption_loss = vsrn.crit(seq_probs, labels[:, 1:], masks[:, 1:])
            vsrn.optimizer.zero_grad()
            loss = vsrn.criterion(img_emb, cap_emb) + caption_loss
            loss.backward()
            clip(vsrn.params, opt.grad_clip)
            vsrn.optimizer.step()
    return step


def vsrn_gemm_step(size: dict, device: str = "cpu"):
    """The products of VSRN's step and their gradients, nothing else, as our step does them
    (the GCN's maps folded where ``vsrn.folds`` says; the image fc, 4 GCN layers, the GRU over
    the members, the caption GRU over the words packed, the caption branch's input map, encoder
    GRU, and per predicted word the attention's query, scores and context, the decoder GRU; the
    vocabulary map once over all words): the arithmetic's limit on this CPU."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from pipeline.networks.vsrn import folds

    torch.manual_seed(0)
    b, k, d, e = size["batch"], size["members"], size["feature_dim"], size["embed"]
    h, cw = size["caption_hidden"], size["caption_word_dim"]
    images, captions, lengths, _, _ = vsrn_batch(size)
    images, captions = to_device(device, images, captions)
    p = lambda *shape: nn.Parameter(torch.randn(*shape, device=device) / shape[-1] ** 0.5)  # noqa: E731
    fc = p(e, d)
    gcn = [[p(e, e) for _ in range(4)] for _ in range(4)]                   # θ, φ, g, W
    vid2hid, attend_enc, attend_dec, score, out = p(h, e), p(h, h), p(h, h), p(1, h), p(size["vocab"], h)
    image_gru, text_gru = nn.GRU(e, e, batch_first=True), nn.GRU(size["word_dim"], e, batch_first=True)
    encoder, decoder = nn.GRU(h, h, batch_first=True), nn.GRU(cw + h, h, batch_first=True)
    embed, word_embed = nn.Embedding(size["vocab"], size["word_dim"]), nn.Embedding(size["vocab"], cw)
    params = [fc, vid2hid, attend_enc, attend_dec, score, out] + [q for layer in gcn for q in layer]
    for module in (image_gru, text_gru, encoder, decoder, embed, word_embed):
        module.to(device)
        params += list(module.parameters())
    fold = folds(e, b * k)
    steps = min(int(lengths.max()), size["max_len"] - 1)
    predicted = (torch.arange(steps)[None] < lengths[:, None]).to(device)

    def step():
        v = (images.reshape(-1, d) @ fc.T).view(b, k, e)
        for theta, phi, g, w in gcn:
            if fold:
                relation = torch.bmm(v @ (theta.T @ phi), v.transpose(1, 2))
                v = torch.bmm(relation, v) @ (w @ g).T
            else:
                relation = torch.bmm(v @ theta.T, (v @ phi.T).transpose(1, 2))
                v = torch.bmm(relation, v @ g.T) @ w.T
        _, image = image_gru(v)
        _, text = text_gru(pack_padded_sequence(embed(captions), lengths, batch_first=True))
        encoded, state = encoder(v @ vid2hid.T)
        keys = encoded @ attend_enc.T
        tokens = word_embed(captions[:, :steps])
        states = []
        for t in range(steps):
            weights = (keys + (state[-1] @ attend_dec.T)[:, None]) @ score.T            # (B, K, 1)
            context = torch.bmm(weights.transpose(1, 2), encoded)[:, 0]
            step_out, state = decoder(torch.cat([tokens[:, t], context], 1)[:, None], state)
            states.append(step_out)
        logits = torch.cat(states, 1)[predicted] @ out.T
        total = image.sum() + text.sum() + logits.sum()
        for q in params:
            q.grad = None
        total.backward()
    return step


def matmul_gflops(n: int = 2048, rounds: int = 3, device: str = "cpu", dtype=torch.float32) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = min(_timed(lambda: a @ b, device) for _ in range(rounds))
    return 2 * n ** 3 / best / 1e9


def _timed(fn, device: str = "cpu") -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def make(kind: str, network: str, size: dict, args):
    device = args.device
    if network == "vsrn":
        makers = {"ours": lambda: vsrn_ours_step(size, device=device),
                  "ours_bf16": lambda: vsrn_ours_step(size, torch.bfloat16, device),
                  "authors": lambda: vsrn_authors_step(size, Path(args.authors), device),
                  "gemm": lambda: vsrn_gemm_step(size, device)}
    else:
        makers = {"ours": lambda: ours_step(network, size, device=device),
                  "ours_bf16": lambda: ours_step(network, size, torch.bfloat16, device),
                  "authors": lambda: authors_step(network, size, Path(args.authors), device),
                  "gemm": lambda: gemm_step(network, size, device)}
    return makers[kind]()


def sizes_of(args) -> dict:
    return SIZES[("vsrn_" if args.vsrn else "") + args.size]


# ------------------------------------------------------------------------------------------ runs
def peak_memory(kind: str, network: str, args) -> float | None:
    """Peak RSS (MB) of a child process that builds ``kind`` and runs one step of it (``child``
    prints its RSS before building too: what torch's import holds, the floor of every figure);
    on a GPU, the peak of ``torch.cuda.max_memory_allocated`` (MB) over building and one step."""
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step = make(kind, network, sizes_of(args), args)
        step()
        sync(args.device)
        del step
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    command = [sys.executable, __file__, "--child", f"{kind}:{network}", "--authors", args.authors,
               "--size", args.size] + (["--vsrn"] if args.vsrn else [])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return round(float(done.stdout.split()[-1]), 1)


def baseline_memory(args) -> float | None:
    """Peak RSS (MB) of a child process that imports what ``child`` imports and builds nothing."""
    command = [sys.executable, __file__, "--child", "none:none"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return None if done.returncode else round(float(done.stdout.split()[-1]), 1)


def child(spec: str, args) -> None:
    kind, network = spec.split(":")
    if kind != "none":
        make(kind, network, sizes_of(args), args)()  # one step: its peak
    print(peak_rss_mb())


def peak_rss_mb() -> float:
    """This process's peak RSS (MB): /proc's VmHWM, which starts afresh at exec. ``ru_maxrss`` does
    not: Linux keeps it across execve, so a child of a large parent reported the parent's peak
    (every kind measured 11,137 MB in one run, the bare import included)."""
    try:
        for line in open("/proc/self/status", encoding="ascii"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addmv_", "aten::addbmm")
GRU_OPS = ("aten::gru", "aten::_thnn_fused_gru_cell", "aten::gru_cell")


def profile(network: str, size: dict, args, kind: str = "ours", rows: int = 25) -> dict:
    """One step of ``kind`` under torch.profiler (after a warm-up): its wall time, self CPU time
    by kind of op (products, the rest), the largest ops by input shape, and the memory the ops
    allocated."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    gpu = args.device.startswith("cuda")  # on a GPU: the kernels' time (self_device_time_total)
    step = make(kind, network, size, args)
    step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with torch_profile(activities=activities, record_shapes=True, profile_memory=not gpu) as prof:
        wall = _timed(step, args.device)
    unprofiled = statistics.median(_timed(step, args.device) for _ in range(3))
    events = prof.key_averages()
    own = (lambda e: e.self_device_time_total) if gpu else (lambda e: e.self_cpu_time_total)
    clock = "self_device_s" if gpu else "self_cpu_s"
    total = sum(own(e) for e in events)
    matmul = sum(own(e) for e in events if e.key in MATMUL_OPS)
    by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -own(e))
    # issue 50's host share: 1 − the kernels' busy time ÷ the step's wall time (median of 3 steps
    # outside the profiler, whose own host cost is not the step's); on a CPU the host is the device
    host = round(1 - min(total / 1e6, unprofiled) / unprofiled, 3) if gpu else "not applicable on a CPU"
    return {"wall_s": round(wall, 4), "wall_unprofiled_s": round(unprofiled, 4), "host_fraction": host,
            clock: round(total / 1e6, 4),
            "matmul_share": round(matmul / total, 3),
            "top_ops": [{"op": e.key, clock: round(own(e) / 1e6, 4), "calls": e.count,
                         "share": round(own(e) / total, 4)}
                        for e in sorted(events, key=lambda e: -own(e))[:rows]],
            "top_ops_by_shape": [{"op": e.key, "shapes": str(e.input_shapes)[:120], "calls": e.count,
                                  clock: round(own(e) / 1e6, 4)}
                                 for e in by_shape[:rows]],
            "allocated_gb_by_op": {e.key: round(e.self_cpu_memory_usage / 2**30, 3) for e in
                                   sorted(events, key=lambda e: -e.self_cpu_memory_usage)[:10]}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("authors", "reduced", "small"),
                        help="the authors' sizes (the default), reduced ones (VSRN's, and the default of "
                        "its --profile: batch 64, embed 1024), or small ones (a quick run)")
    parser.add_argument("--small", action="store_true", help="--size small")
    parser.add_argument("--networks", default="sgr,saf")
    parser.add_argument("--steps", type=int, default=5, help="interleaved timed rounds (after one warm-up)")
    parser.add_argument("--authors", default=None,
                        help="the authors' checkout: Paranioar/SGRAF (python3.6; default: "
                        "$VSE_SGRAF_CHECKOUT), with --vsrn KunpengLi1994/VSRN (default: "
                        "$VSE_VSRN_CHECKOUT); without one the authors' step is left out")
    parser.add_argument("--bf16", action="store_true", help="also our step under bf16 autocast")
    parser.add_argument("--vsrn", action="store_true", help="VSRN's step instead of SGR's and SAF's "
                        "(bench/results/train_pairwise_vsrn.json)")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--profile", action="store_true", help="profile one of our steps per network instead "
                        "(bench/results/train_pairwise_profile.json; with --vsrn ours and the authors' at "
                        "--size reduced unless given: bench/results/vsrn_step_profile.json)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (every kind on the GPU)")
    parser.add_argument("--pair-budget", type=int, default=0, help="SGR/SAF: floats of a training chunk's "
                        "largest intermediate off the CPU (launch_bound_train_pair_budget; 0: the "
                        "network's own; 1073741824: the authors' batch in one chunk)")
    parser.add_argument("--block-floats", type=int, default=0, help="SGR/SAF: sgraf_ops' blocks off the CPU "
                        "(ACCELERATOR_BLOCK_FLOATS; 0: its own)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    global PAIR_BUDGET
    PAIR_BUDGET = args.pair_budget
    if args.block_floats:
        from pipeline.networks import sgraf_ops

        sgraf_ops.ACCELERATOR_BLOCK_FLOATS = args.block_floats
    if args.small:
        args.size = "small"
    if args.size is None:
        args.size = "reduced" if args.vsrn and args.profile else "authors"
    if args.authors is None:
        args.authors = VSRN_AUTHORS if args.vsrn else AUTHORS
    if args.vsrn:
        args.networks = "vsrn"
    elif args.size == "reduced":
        parser.error("--size reduced is VSRN's (--vsrn)")
    if args.child:
        child(args.child, args)
        return 0
    from benchkit import cpu_name, write_report

    results = ROOT / "bench" / "results"
    has_authors = bool(args.authors) and (Path(args.authors) / ("GCN_lib/Rs_GCN.py" if args.vsrn
                                                                 else "model.py")).exists()
    if args.profile:
        size = sizes_of(args)
        kinds = (["ours"] + (["ours_bf16"] if args.bf16 else [])
                 + (["authors"] if args.vsrn and has_authors else []))
        report = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "load_before": os.getloadavg(),
                  "sizes": size, "networks": {n if kind == "ours" else f"{n}_{kind}":
                                              profile(n, size, args, kind)
                                              for n in args.networks.split(",") for kind in kinds},
                  "load_after": os.getloadavg()}
        name = ("vsrn_step_profile" if args.vsrn else "train_pairwise_profile") + (
            "_cuda" if args.device.startswith("cuda") else "") + ".json"
        out = Path(args.out or results / name)
        if args.vsrn and out.exists():  # the findings written beside the profile stay
            kept = json.loads(out.read_text())
            report.update({k: v for k, v in kept.items() if k in ("findings", "before_after")})
        write_report(report, out)
        return 0
    size = sizes_of(args)
    gpu = args.device.startswith("cuda")
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "sizes": size, "load_before": os.getloadavg(),
              "device": torch.cuda.get_device_name(0) if gpu else "cpu",
              "matmul_fp32_gflops": round(matmul_gflops(4096 if gpu else 2048, device=args.device), 1),
              "networks": {}}
    if gpu:
        report["tf32"] = torch.backends.cuda.matmul.allow_tf32
        report["matmul_bf16_gflops"] = round(matmul_gflops(4096, device=args.device, dtype=torch.bfloat16), 1)
    _, _, lengths = batch(size)
    report["caption_lengths_mean"] = round(float(lengths.float().mean()), 2)
    if not args.vsrn:
        from pipeline.networks import sgraf_ops
        from pipeline.networks.sgraf import SGRAF

        report["launch_bound_train_pair_budget"] = args.pair_budget or SGRAF.launch_bound_train_pair_budget
        report["accelerator_block_floats"] = sgraf_ops.ACCELERATOR_BLOCK_FLOATS
    for network in args.networks.split(","):
        kinds = ["ours", "gemm"] + (["authors"] if has_authors else []) + (["ours_bf16"] if args.bf16 else [])
        steps = {kind: make(kind, network, size, args) for kind in kinds}
        for step in steps.values():
            step()  # warm-up
        times = {kind: [] for kind in kinds}
        for _ in range(args.steps):
            for kind, step in steps.items():
                times[kind].append(_timed(step, args.device))
        del steps
        if network == "vsrn":
            from pipeline.networks.vsrn import folds

            parts = vsrn_madds(size, lengths)
            madds = sum(parts.values())
        else:
            madds = forward_madds(size, lengths, network)
        median = {k: statistics.median(v) for k, v in times.items()}
        entry = report["networks"][network] = {
            "forward_gflop": round(2 * madds / 1e9, 1), "step_gflop_fwd_bwd": round(6 * madds / 1e9, 1),
            "median_step_s": {k: round(v, 5) for k, v in median.items()},
            "steps_per_s": {k: round(1 / v, 4) for k, v in median.items()},
            "max_over_min": {k: round(max(v) / min(v), 3) for k, v in times.items()},
            "step_s": {k: [round(t, 5) for t in v] for k, v in times.items()},
            "ours_fraction_of_gemm_limit": round(median["gemm"] / median["ours"], 3),
            "ours_fraction_of_matmul_rate": round(6 * madds / median["ours"] / 1e9
                                                  / report["matmul_fp32_gflops"], 3),
            "target_fraction": 0.8,
        }
        if network == "vsrn":
            entry["forward_gflop_by_part"] = {k: round(2 * v / 1e9, 2) for k, v in parts.items()}
            unfolded = sum(vsrn_madds(size, lengths, False).values())
            entry["forward_gflop_authors_formulation"] = round(2 * unfolded / 1e9, 1)
            entry["gcn_folded"] = folds(size["embed"], size["batch"] * size["members"])
        else:
            entry["mflop_per_pair_forward"] = round(2 * madds / size["batch"] ** 2 / 1e6, 2)
        if has_authors:
            entry["speedup_ours_over_authors"] = round(median["authors"] / median["ours"], 3)
        if args.bf16:
            entry["speedup_ours_bf16_over_authors"] = (round(median["authors"] / median["ours_bf16"], 3)
                                                       if has_authors else None)
            entry["speedup_bf16_over_fp32"] = round(median["ours"] / median["ours_bf16"], 3)
        if not args.no_memory and gpu:
            entry["peak_cuda_mb"] = {kind: peak_memory(kind, network, args) for kind in kinds}
        elif not args.no_memory:
            entry["peak_rss_mb"] = {kind: peak_memory(kind, network, args) for kind in kinds}
            entry["peak_rss_mb"]["nothing_built"] = baseline_memory(args)
        print(network, json.dumps(entry), file=sys.stderr, flush=True)
    report["load_after"] = os.getloadavg()
    name = ("train_pairwise_vsrn" if args.vsrn else "train_pairwise") + ("_cuda" if gpu else "")
    write_report(report, Path(args.out or results / f"{name}.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
