"""The network contract (``vse check-network``): what every network, built-in or a user's own, must
satisfy for training, evaluation and the metrics to use it (``networks.network``), for its kind.

The network is built at a small size (sets of K members, or one vector per image for a dual network
that does not take sets; captions as cached token vectors, and with ``--words`` as word ids too:
VSE's own model, vse++ / vse-infty / vsrn, always reads word ids), in float64, with the given seed.

A pairwise network (``score`` of blocks):

- the score matrix: ``forward(images, captions, lengths)`` is (B, B) and finite, and
  ``score(encode_images, encode_captions)`` of blocks of other sizes is (Bi, Bc);
- blocks agree with pairs: every entry of a block's matrix equals the score of that pair scored
  alone (eval mode);

a dual network (``image_encoder``, ``text_encoder``):

- the embeddings: ``forward(images, captions, lengths)`` is ((B, E), (B, E)) and finite, and each
  encoder on a batch of another size gives that many rows;
- a batch's rows agree with items: each image's and each caption's embedding equals that item
  embedded alone (eval mode);

and either kind:

- padding never read: padded token positions of zeros or of 1e6 give the same scores;
- the batch order does not matter: permuting images and captions permutes the scores;
- gradients: every parameter that a score depends on gets a finite gradient in train mode (a dual
  network's scores: the inner products of its embeddings);
- it survives a checkpoint: a state dict loaded into a fresh build scores the same;
- ms per training step at B = 32 (forward + backward), a measurement.
"""

from __future__ import annotations

import copy
import time

import torch

from pipeline.core.checks import CheckResult, guarded
from pipeline.core.registry import LAST, NETWORKS
from pipeline.networks.network import NetworkConfig, build_network, network_class, network_kind

SET_SIZE, FEATURE_DIM, TEXT_DIM, VOCAB, WORDS = 5, 12, 10, 20, 7
LENGTHS = (7, 2, 5, 1, 4, 6)
TOLERANCE = 1e-9   # float64


def run_network_contract(spec: str, options: dict | None = None, *, embed_dim: int = 16, words: bool = False,
                         timing: bool = True, seed: int = 0) -> list[CheckResult]:
    """Every check of the contract of its kind on network ``spec`` (a name or an import path); a
    network that cannot be built raises VseError (one line) before any check."""
    declared = NETWORKS.spec(spec)
    words = words or declared.vse_heads
    if declared.kind == "pairwise":
        sets = True
    elif declared.vse_heads:
        sets = declared.defaults.get("image_pool") is not None
    else:
        sets = bool(getattr(network_class(spec), "takes_sets", False))
    config = NetworkConfig(spec, feature_dim=FEATURE_DIM, set_size=SET_SIZE if sets else 0,
                           embed_dim=embed_dim, vocab_size=VOCAB if words else 0, word_dim=8,
                           text_dim=0 if words else TEXT_DIM, options=dict(options or {}))
    build = _builder(declared, config)
    torch.manual_seed(seed)
    model = build().double()
    data = _inputs(words, seed, sets=sets)
    if declared.kind == "pairwise":
        first = [guarded("score matrix (B, B) and blocks (Bi, Bc), finite", lambda: _shapes(model, data)),
                 guarded("a block's scores = each pair scored alone", lambda: _pairs(model, data))]
    else:
        first = [guarded("embeddings (B, E) of both sides, finite", lambda: _dual_shapes(model, data)),
                 guarded("a batch's rows = each item embedded alone", lambda: _items(model, data))]
    results = first + [
        guarded("padding never read", lambda: _padding(model, data, words)),
        guarded("the batch order does not matter", lambda: _order(model, data)),
        guarded("gradient reaches every parameter, finite", lambda: _gradients(model, data)),
        guarded("a state dict loaded anew scores the same", lambda: _reload(model, build, data)),
    ]
    if timing:
        results.append(guarded("ms per training step (B=32, fwd+bwd)",
                               lambda: _timing(build, words, sets, seed)))
    return results


def _builder(declared, config: NetworkConfig):
    """How the network is built: from the ``NetworkConfig``, or VSE's model from the ``ModelConfig``
    its declaration's defaults make (its caption branch left out: it trains only, scores nothing)."""
    if not declared.vse_heads:
        return lambda: build_network(copy.deepcopy(config))
    from pipeline.networks.vse_model import ModelConfig, VSEModel

    image_pool = declared.defaults.get("image_pool")
    own = declared.own_fields(config.options, "grid" if image_pool else None)
    model_config = ModelConfig(vocab_size=config.vocab_size, feature_dim=config.feature_dim,
                               embed_dim=config.embed_dim, word_dim=config.word_dim, image_pool=image_pool,
                               text_pool=declared.defaults.get("text_pool", LAST), **own)
    return lambda: VSEModel(copy.deepcopy(model_config))


def _inputs(words: bool, seed: int, batch: int | None = None, sets: bool = True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS if batch is None else [(i % WORDS) + 1 for i in range(batch)])
    n = len(lengths)
    shape = (n, SET_SIZE, FEATURE_DIM) if sets else (n, FEATURE_DIM)
    images = torch.randn(shape, generator=g, dtype=torch.float64)
    padding = torch.arange(WORDS)[None] >= lengths[:, None]
    if words:
        captions = torch.randint(1, VOCAB, (n, WORDS), generator=g).masked_fill(padding, 0)
    else:
        captions = torch.randn(n, WORDS, TEXT_DIM, generator=g, dtype=torch.float64)
        captions[padding] = 0.0
    return images, captions, lengths


def _scores(model, images, captions, lengths) -> torch.Tensor:
    """(Bi, Bc): a pairwise network's scores of two blocks; a dual network's inner products."""
    with torch.no_grad():
        if network_kind(model) == "pairwise":
            return model.score(model.encode_images(images), model.encode_captions(captions, lengths))
        return model.image_encoder(images) @ model.text_encoder(captions, lengths).T


def _dual_shapes(model, data) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    with torch.no_grad():
        out = model(images, captions, lengths)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            return CheckResult("", False, f"forward gave {type(out).__name__}, not the two sides' embeddings")
        img, cap = out
        some_images = model.image_encoder(images[:4])
        some_captions = model.text_encoder(captions[1:], lengths[1:])
    n, width = len(images), img.shape[-1]
    ok = img.shape == cap.shape == (n, width) and some_images.shape == (4, width)
    ok = ok and some_captions.shape == (n - 1, width)
    ok = ok and all(bool(torch.isfinite(x).all()) for x in (img, cap, some_images, some_captions))
    return CheckResult("", ok, f"{tuple(img.shape)}, {tuple(cap.shape)}; {tuple(some_images.shape)}, "
                               f"{tuple(some_captions.shape)}")


def _items(model, data) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    with torch.no_grad():
        img, cap = model.image_encoder(images), model.text_encoder(captions, lengths)
        alone_img = torch.cat([model.image_encoder(images[i:i + 1]) for i in range(len(images))])
        alone_cap = torch.cat([model.text_encoder(captions[j:j + 1], lengths[j:j + 1])
                               for j in range(len(captions))])
    worst = max(float((alone_img - img).abs().max()), float((alone_cap - cap).abs().max()))
    return CheckResult("", worst <= TOLERANCE, f"max difference {worst:.1e}")


def _shapes(model, data) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    with torch.no_grad():
        full = model(images, captions, lengths)
    block = _scores(model, images[:4], captions[1:], lengths[1:])
    ok = full.shape == (len(images), len(captions)) and block.shape == (4, len(captions) - 1)
    ok = ok and bool(torch.isfinite(full).all()) and bool(torch.isfinite(block).all())
    return CheckResult("", ok, f"{tuple(full.shape)}, {tuple(block.shape)}")


def _pairs(model, data) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    full = _scores(model, images, captions, lengths)
    alone = torch.tensor([[float(_scores(model, images[i:i + 1], captions[j:j + 1], lengths[j:j + 1]))
                           for j in range(len(captions))] for i in range(len(images))], dtype=full.dtype)
    worst = float((alone - full).abs().max())
    return CheckResult("", worst <= TOLERANCE, f"max difference {worst:.1e}")


def _padding(model, data, words: bool) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    padded = torch.arange(captions.shape[1])[None] >= lengths[:, None]
    noisy = captions.clone()
    noisy[padded] = VOCAB - 1 if words else 1e6
    difference = float((_scores(model, images, captions, lengths) - _scores(model, images, noisy, lengths))
                       .abs().max())
    return CheckResult("", difference <= TOLERANCE, f"max difference {difference:.1e}")


def _order(model, data) -> CheckResult:
    images, captions, lengths = data
    model.eval()
    full = _scores(model, images, captions, lengths)
    gen = torch.Generator().manual_seed(7)
    pi, pc = torch.randperm(len(images), generator=gen), torch.randperm(len(captions), generator=gen)
    permuted = _scores(model, images[pi], captions[pc], lengths[pc])
    difference = float((permuted - full[pi][:, pc]).abs().max())
    return CheckResult("", difference <= TOLERANCE, f"max difference {difference:.1e}")


def _gradients(model, data) -> CheckResult:
    images, captions, lengths = data
    model.train()
    model.zero_grad(set_to_none=True)
    _training_scores(model, images, captions, lengths).sum().backward()
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    missing = [name for name, p in params if p.grad is None]
    bad = [name for name, p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
    model.eval()
    detail = (f"no gradient: {', '.join(missing[:3])}" if missing else
              f"not finite: {', '.join(bad[:3])}" if bad else f"{len(params)} parameters")
    return CheckResult("", not missing and not bad, detail)


def _training_scores(model, images, captions, lengths) -> torch.Tensor:
    """What a training step differentiates: the (B, B) scores (a dual network's inner products)."""
    out = model(images, captions, lengths)
    return out[0] @ out[1].T if isinstance(out, (tuple, list)) else out


def _reload(model, build, data) -> CheckResult:
    model.eval()
    fresh = build().double()
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    difference = float((_scores(model, *data) - _scores(fresh, *data)).abs().max())
    return CheckResult("", difference == 0.0, f"max difference {difference:.1e}")


def _timing(build, words: bool, sets: bool, seed: int) -> CheckResult:
    torch.manual_seed(seed)
    model = build().train()
    images, captions, lengths = _inputs(words, seed, batch=32, sets=sets)
    images = images.float()
    captions = captions if words else captions.float()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        _training_scores(model, images, captions, lengths).sum().backward()
        times.append(time.perf_counter() - started)
    return CheckResult("", None, f"{1000 * min(times):.1f} ms")
