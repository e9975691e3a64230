"""The pairwise-network contract (``vse check-network``): what every network that scores pairs
jointly, built-in or a user's own, must satisfy for training, evaluation and the metrics to use
it (``models.network``).

The network is built from a small ``NetworkConfig`` (sets of K members, captions as cached token
vectors, and with ``--words`` as word ids too), in float64, with the given seed. Checks:

- the score matrix: ``forward(images, captions, lengths)`` is (B, B) and finite, and
  ``score(encode_images, encode_captions)`` of blocks of other sizes is (Bi, Bc);
- blocks agree with pairs: every entry of a block's matrix equals the score of that pair scored
  alone (eval mode);
- padding never read: padded token positions of zeros or of 1e6 give the same scores;
- the batch order does not matter: permuting images and captions permutes the matrix;
- gradients: every parameter that a score depends on gets a finite gradient in train mode;
- it survives a checkpoint: a state dict loaded into a fresh build scores the same;
- ms per training step at B = 32 (forward + backward), a measurement.
"""

from __future__ import annotations

import copy
import time

import torch

from pipeline.models.checks import CheckResult, guarded
from pipeline.models.network import NetworkConfig, build_network

SET_SIZE, FEATURE_DIM, TEXT_DIM, VOCAB, WORDS = 5, 12, 10, 20, 7
LENGTHS = (7, 2, 5, 1, 4, 6)
TOLERANCE = 1e-9   # float64


def run_network_contract(spec: str, options: dict | None = None, *, embed_dim: int = 16, words: bool = False,
                         timing: bool = True, seed: int = 0) -> list[CheckResult]:
    """Every check of the contract on network ``spec`` (a name or an import path); a network that
    cannot be built raises VseError (one line) before any check."""
    config = NetworkConfig(spec, feature_dim=FEATURE_DIM, set_size=SET_SIZE, embed_dim=embed_dim,
                           vocab_size=VOCAB if words else 0, word_dim=8, text_dim=0 if words else TEXT_DIM,
                           options=dict(options or {}))
    torch.manual_seed(seed)
    model = build_network(config).double()
    data = _inputs(words, seed)
    results = [
        guarded("score matrix (B, B) and blocks (Bi, Bc), finite", lambda: _shapes(model, data)),
        guarded("a block's scores = each pair scored alone", lambda: _pairs(model, data)),
        guarded("padding never read", lambda: _padding(model, data, words)),
        guarded("the batch order does not matter", lambda: _order(model, data)),
        guarded("gradient reaches every parameter, finite", lambda: _gradients(model, data)),
        guarded("a state dict loaded anew scores the same", lambda: _reload(model, config, data)),
    ]
    if timing:
        results.append(guarded("ms per training step (B=32, fwd+bwd)", lambda: _timing(config, seed)))
    return results


def _inputs(words: bool, seed: int, batch: int | None = None):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS if batch is None else [(i % WORDS) + 1 for i in range(batch)])
    n = len(lengths)
    images = torch.randn(n, SET_SIZE, FEATURE_DIM, generator=g, dtype=torch.float64)
    padding = torch.arange(WORDS)[None] >= lengths[:, None]
    if words:
        captions = torch.randint(1, VOCAB, (n, WORDS), generator=g).masked_fill(padding, 0)
    else:
        captions = torch.randn(n, WORDS, TEXT_DIM, generator=g, dtype=torch.float64)
        captions[padding] = 0.0
    return images, captions, lengths


def _scores(model, images, captions, lengths) -> torch.Tensor:
    with torch.no_grad():
        return model.score(model.encode_images(images), model.encode_captions(captions, lengths))


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
    model(images, captions, lengths).sum().backward()
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    missing = [name for name, p in params if p.grad is None]
    bad = [name for name, p in params if p.grad is not None and not torch.isfinite(p.grad).all()]
    model.eval()
    detail = (f"no gradient: {', '.join(missing[:3])}" if missing else
              f"not finite: {', '.join(bad[:3])}" if bad else f"{len(params)} parameters")
    return CheckResult("", not missing and not bad, detail)


def _reload(model, config, data) -> CheckResult:
    model.eval()
    fresh = build_network(copy.deepcopy(config)).double()
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    difference = float((_scores(model, *data) - _scores(fresh, *data)).abs().max())
    return CheckResult("", difference == 0.0, f"max difference {difference:.1e}")


def _timing(config, seed: int) -> CheckResult:
    torch.manual_seed(seed)
    model = build_network(config).train()
    images, captions, lengths = _inputs(config.vocab_size > 0, seed, batch=32)
    images = images.float()
    captions = captions if config.vocab_size else captions.float()
    times = []
    for _ in range(3):
        started = time.perf_counter()
        model(images, captions, lengths).sum().backward()
        times.append(time.perf_counter() - started)
    return CheckResult("", None, f"{1000 * min(times):.1f} ms")
