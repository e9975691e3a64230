"""Set heads (pipeline.networks.heads), their names (pipeline.core.registry) and size augmentation
(pipeline.networks.set_augment) against slow per-set implementations written here; the match with the
authors' code is tests/test_vse_infty_golden.py."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.errors import VseError
from pipeline.core.registry import (
    IMAGE_POOLS,
    SET_POOLS,
    SET_PROJECTIONS,
    SIZE_AUGMENT_RULES,
    TEXT_POOLS,
    check_image_pool,
    check_text_pool,
)
from pipeline.networks.heads import (
    GPO,
    BiGRUTextEncoder,
    MaxPool,
    MeanPool,
    SetImageHead,
    TokenSetTextEncoder,
    build_pool,
    from_vse_infty,
    pool_class,
)
from pipeline.networks.set_augment import DROP_RATE, GRID_KEEP_ALL, size_augment
from pipeline.networks.vse_model import ModelConfig, TextEncoder

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6


def padded_batch(seed=0, batch=6, size=7, dim=5, lengths=(7, 3, 1, 5, 7, 2)):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, size, dim, generator=gen)
    lengths = torch.tensor(lengths[:batch])
    x[torch.arange(size)[None] >= lengths[:, None]] = 1e3  # padding: never read
    return x, lengths


# ---------------------------------------------------------------------------- names


def test_the_names_resolve_to_the_pools_and_the_name_module_is_torch_free():
    from pipeline.networks.vsrn import VSRNReasoning

    assert IMAGE_POOLS == ("mean", "max", "gpo", "vsrn")
    assert TEXT_POOLS == ("last", "mean", "max", "gpo", "vsrn")
    assert {n: pool_class(n) for n in SET_POOLS} == {"mean": MeanPool, "max": MaxPool, "gpo": GPO,
                                                    "vsrn": VSRNReasoning}
    code = "import sys, pipeline.core.registry, pipeline.networks.set_augment; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pool_names_are_checked_in_one_line():
    check_image_pool("gpo"), check_text_pool("last"), check_image_pool("my_pool.py:Pool")
    with pytest.raises(VseError, match=r"unknown pool 'last' \(built-in: mean, max, gpo, vsrn; or your own"):
        check_image_pool("last")
    with pytest.raises(VseError, match="unknown pool 'avg'"):
        check_text_pool("avg")
    with pytest.raises(VseError, match="unknown pool 'f.py:'"):
        build_pool("f.py:", 4)
    with pytest.raises(VseError, match="pool mean has no options; got k"):
        build_pool("mean", 4, {"k": 2})
    with pytest.raises(ValueError, match="pool options"):
        build_pool(MeanPool(), 4, {"k": 2})


def test_a_users_pool_file_builds_with_its_dim_and_options(tmp_path):
    path = tmp_path / "my_pool.py"
    path.write_text("from torch import nn\nclass Pool(nn.Module):\n"
                    "    def __init__(self, dim, scale=1.0):\n        super().__init__()\n"
                    "        self.dim, self.scale = dim, scale\n")
    pool = build_pool(f"{path}:Pool", 12, {"scale": 2.0})
    assert (pool.dim, pool.scale) == (12, 2.0)
    with pytest.raises(VseError) as info:
        build_pool(f"{path}:Nope", 12)
    assert str(info.value) == f"{path}: has no 'Nope' (the pool '{path}:Nope')"
    with pytest.raises(VseError, match=f"^{tmp_path / 'x.py'}: no such pool file$"):
        build_pool(f"{tmp_path / 'x.py'}:Pool", 12)


def test_from_vse_infty_renames_their_pool_and_drops_their_unused_batchnorm():
    theirs = {"fc.weight": 1, "gpool.gru.weight_ih_l0": 2, "mlp.bns.0.weight": 3, "mlp.bns.1.weight": 4}
    assert from_vse_infty(theirs) == {"fc.weight": 1, "pool.gru.weight_ih_l0": 2, "mlp.bns.0.weight": 3}


# ---------------------------------------------------------------------------- pools


def slow_pool(kind, x, lengths, gpo=None):
    out = []
    for row, n in zip(x, lengths.tolist()):
        members = row[:n]
        if kind == "mean":
            out.append(members.sum(0) / n)
        elif kind == "max":
            out.append(members.max(0).values)
        else:
            ranked = members.sort(0, descending=True).values  # each dimension on its own
            out.append((gpo.weights_for(n)[:, None] * ranked).sum(0))
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["mean", "max", "gpo"])
def test_pools_equal_a_per_set_loop_and_ignore_padding(kind):
    torch.manual_seed(0)
    pool = build_pool(kind, 5)
    x, lengths = padded_batch()
    with torch.no_grad():
        expected = slow_pool(kind, x, lengths, pool)
        got = pool(x, lengths)
        assert torch.allclose(got, expected, atol=TOL)
        assert torch.equal(pool(x.masked_fill(x == 1e3, -7.0), lengths), got)


def test_gpo_weights_are_a_distribution_over_ranks_that_depends_on_the_length_only():
    torch.manual_seed(1)
    gpo = GPO()
    with torch.no_grad():
        table = gpo.weight_table(9)
        assert table.shape == (9, 9)
        assert torch.allclose(table.sum(1), torch.ones(9), atol=TOL)
        assert torch.equal(table > 0, torch.ones(9, 9).tril().bool())  # zero from rank n on
        for n in (1, 4, 9):
            assert torch.allclose(gpo.weights_for(n), table[n - 1, :n], atol=TOL)
        assert gpo.weights_for(1).item() == pytest.approx(1.0)  # a single member passes unchanged
        weights = gpo.weights(torch.tensor([4, 9, 4]), 9)
        assert torch.equal(weights[0], weights[2]) and torch.equal(weights[1], table[8])


def test_gpo_sorts_members_below_minus_10000_before_the_padding():
    """The authors fill padding with -10000 before sorting: a member below it would sort
    after the padding and be zeroed.  Ours fills -inf."""
    torch.manual_seed(2)
    gpo = GPO()
    x = torch.tensor([[[-2e4], [1.0], [0.0]]])
    with torch.no_grad():
        pooled = gpo(x, torch.tensor([2]))
        expected = gpo.weights_for(2) @ torch.tensor([1.0, -2e4])
    assert pooled.item() == pytest.approx(expected.item(), rel=1e-6) and pooled.item() < -1


def test_lengths_out_of_range_are_refused():
    x, _ = padded_batch()
    for pool in (MeanPool(), MaxPool(), GPO()):
        with pytest.raises(ValueError, match="lengths must be in 1..7"):
            pool(x, torch.tensor([0, 1, 1, 1, 1, 1]))
        with pytest.raises(ValueError, match="lengths must be in 1..7"):
            pool(x, torch.tensor([8, 1, 1, 1, 1, 1]))


def test_gpo_under_bf16_autocast_keeps_its_weights_in_fp32():
    torch.manual_seed(3)
    gpo = GPO()
    x, lengths = padded_batch()
    with torch.no_grad():
        plain = gpo(x, lengths)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = gpo(x.bfloat16(), lengths)
    assert torch.allclose(mixed.float(), plain, atol=0.05)


# ---------------------------------------------------------------------------- image head


def test_image_head_init_and_shapes():
    torch.manual_seed(4)
    head = SetImageHead(10, 8, projection="linear+mlp", pool="gpo")
    bound = math.sqrt(6 / (10 + 8))
    assert head.fc.weight.abs().max() <= bound and not head.fc.bias.any()
    assert head.mlp.layers[0].out_features == 4 and head.mlp.layers[1].out_features == 8
    assert SetImageHead(10, 8, projection="linear", pool="mean").mlp is None
    assert SET_PROJECTIONS == ("linear", "linear+mlp")
    with pytest.raises(ValueError, match="projection must be one of"):
        SetImageHead(10, 8, projection="mlp", pool="gpo")
    x, lengths = padded_batch(dim=10)
    emb = head(x, lengths)
    assert emb.shape == (6, 8) and torch.allclose(emb.norm(dim=1), torch.ones(6), atol=TOL)
    raw = SetImageHead(10, 8, projection="linear", pool=MaxPool(), no_imgnorm=True, use_abs=True)
    out = raw(x, lengths)
    assert (out >= 0).all() and not torch.allclose(out.norm(dim=1), torch.ones(6))


def test_batchnorm_over_padding_is_theirs_by_default_and_masked_on_request():
    """Finding: in training the authors' MLP BatchNorm takes statistics over every B·K row, the
    padding included, so a set's embedding depends on the padding of the batch.  masked_bn
    takes them over the members only; in eval mode both use the running statistics."""
    torch.manual_seed(5)
    default = SetImageHead(10, 8, projection="linear+mlp", pool="gpo").train()
    masked = SetImageHead(10, 8, projection="linear+mlp", pool="gpo", masked_bn=True).train()
    masked.load_state_dict(default.state_dict())
    x, lengths = padded_batch(dim=10)
    zeros = x.masked_fill(x == 1e3, 0)
    with torch.no_grad():
        assert not torch.allclose(default(zeros, lengths), default(x, lengths), atol=1e-3)
        assert torch.equal(masked(zeros, lengths), masked(x, lengths))
        members = torch.cat([zeros[b, :n] for b, n in enumerate(lengths.tolist())])
        hidden = masked.mlp.layers[0](members)
        # two forward passes from 0 with momentum 0.1: 0.1 m + 0.9 · 0.1 m, m over the members
        assert torch.allclose(masked.mlp.bns[0].running_mean, 0.19 * hidden.mean(0), atol=1e-6)
        default.eval(), masked.eval()
        masked.load_state_dict(default.state_dict())
        assert torch.equal(default(zeros, lengths), masked(x, lengths))


# ---------------------------------------------------------------------------- caption side


def tokens_batch():
    tokens = torch.tensor([[1, 5, 9, 3, 2], [1, 4, 2, 0, 0], [1, 2, 0, 0, 0], [1, 6, 7, 8, 2]])
    return tokens, torch.tensor([5, 3, 2, 5])


def test_bigru_encoder_is_called_as_the_gru_encoder():
    torch.manual_seed(6)
    cfg = ModelConfig(vocab_size=10, feature_dim=4, embed_dim=8, word_dim=6)
    tokens, lengths = tokens_batch()
    gru = TextEncoder(cfg)
    bigru = BiGRUTextEncoder(10, 6, 8, pool="gpo")
    assert gru(tokens, lengths).shape == bigru(tokens, lengths).shape == (4, 8)
    with torch.no_grad():
        emb = bigru(tokens, lengths)
        assert torch.allclose(emb.norm(dim=1), torch.ones(4), atol=TOL)
        noisy = tokens.masked_fill(tokens == 0, 7)  # ids past the end are never read
        assert torch.equal(bigru(noisy, lengths), emb)
        alone = torch.cat([bigru(tokens[i:i + 1, :n], lengths[i:i + 1])
                           for i, n in enumerate(lengths.tolist())])
        assert torch.allclose(alone, emb, atol=TOL)
    vectors, mask = torch.ones(10, 6), torch.zeros(10, dtype=torch.bool)
    mask[3] = True
    assert bigru.load_word_vectors(vectors, mask) == 1 and torch.equal(bigru.embed.weight[3], torch.ones(6))
    assert BiGRUTextEncoder(10, 6, 8, 2, pool="mean", use_abs=True)(tokens, lengths).min() >= 0


def test_token_set_encoder_pools_the_projected_tokens():
    torch.manual_seed(7)
    x, lengths = padded_batch(dim=12)
    head = TokenSetTextEncoder(12, 8, pool="mean")
    with torch.no_grad():
        projected = head.proj(x)
        expected = torch.stack([projected[b, :n].mean(0) for b, n in enumerate(lengths.tolist())])
        assert torch.allclose(head(x, lengths), expected / expected.norm(dim=1, keepdim=True), atol=TOL)
        raw = TokenSetTextEncoder(12, 8, pool="mean", no_txtnorm=True)
        raw.load_state_dict(head.state_dict())
        assert torch.allclose(raw(x, lengths), expected, atol=TOL)


# ---------------------------------------------------------------------------- size augmentation


def slow_augment(features, lengths, rng, rule):
    """The authors' loops (their draw order), set by set, without the empty-set guard."""
    out, kept = np.zeros_like(features), []
    if rule == "precomp":
        for b, n in enumerate(lengths):
            members = features[b, :n][rng.random(n) > DROP_RATE]
            out[b, :len(members)] = members
            kept.append(len(members))
    else:
        r, u = rng.random(features.shape[:2]), rng.random(len(features))
        for b, n in enumerate(lengths):
            keep = r[b, :n] > DROP_RATE * u[b] if u[b] > GRID_KEEP_ALL else np.ones(n, bool)
            members = features[b, :n][keep]
            out[b, :len(members)] = members
            kept.append(len(members))
    return out[:, :max(kept)], np.array(kept)


@pytest.mark.parametrize("rule", SIZE_AUGMENT_RULES)
def test_size_augment_equals_the_per_set_loops(rule):
    data = np.random.default_rng(8).standard_normal((40, 12, 3)).astype(np.float32)
    lengths = np.random.default_rng(9).integers(4, 13, 40)
    expected, kept = slow_augment(data, lengths, np.random.RandomState(10), rule)
    got, got_lengths = size_augment(data, lengths, rng=np.random.RandomState(10), rule=rule)
    np.testing.assert_array_equal(got_lengths, kept)
    np.testing.assert_array_equal(got, expected)
    tensor, tensor_lengths = size_augment(torch.from_numpy(data), torch.from_numpy(lengths),
                                          rng=np.random.RandomState(10), rule=rule)
    assert torch.equal(tensor, torch.from_numpy(expected)) and tensor_lengths.dtype == torch.int64
    again, _ = size_augment(data, lengths, rng=np.random.default_rng(11), rule=rule)
    np.testing.assert_array_equal(again, size_augment(data, lengths, rng=np.random.default_rng(11),
                                                      rule=rule)[0])


def test_size_augment_rates():
    data = np.zeros((4000, 36, 1), np.float32)
    _, kept = size_augment(data, rng=np.random.default_rng(12), rule="precomp")
    assert kept.mean() / 36 == pytest.approx(1 - DROP_RATE, abs=0.005)
    _, kept = size_augment(data, rng=np.random.default_rng(13), rule="grid")
    # E[drop] = 0.8 · 0.2 · E[u | u > 0.2] = 0.16 · 0.6 = 0.096
    assert 1 - kept.mean() / 36 == pytest.approx(0.096, abs=0.005)
    assert (kept == 36).mean() > GRID_KEEP_ALL


def test_size_augment_never_leaves_a_set_empty():
    """The authors' rule drops a set of one member with probability 0.2; ours keeps it."""
    data = np.arange(3000, dtype=np.float32).reshape(1000, 3, 1) + 1
    lengths = np.ones(1000, np.int64)
    out, kept = size_augment(data, lengths, rng=np.random.default_rng(14), rule="precomp")
    assert out.shape == (1000, 1, 1) and (kept == 1).all()
    np.testing.assert_array_equal(out[:, 0], data[:, 0])
    _, slow_kept = slow_augment(data, lengths, np.random.default_rng(14), "precomp")
    assert 150 < (slow_kept == 0).sum() < 250  # what the guard changes


def test_size_augment_refuses_bad_input():
    with pytest.raises(ValueError, match="rule must be one of"):
        size_augment(np.zeros((2, 3, 1)), rng=np.random.default_rng(), rule="crop")
    with pytest.raises(ValueError, match="lengths must be"):
        size_augment(np.zeros((2, 3, 1)), [0, 3], rng=np.random.default_rng(), rule="grid")
    with pytest.raises(ValueError, match=r"\(B, K, D\)"):
        size_augment(np.zeros((2, 3)), rng=np.random.default_rng(), rule="grid")


def test_the_protocol_lists_the_pool_names_and_points_to_tests_that_exist():
    protocol = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    section = protocol.split("## VSE∞", 1)[1].split("\n## ", 1)[0]
    text = " ".join(section.split())
    assert f"`--image-pool`: {' | '.join(IMAGE_POOLS)};" in text
    assert f"`--text-pool`: {' | '.join(TEXT_POOLS)};" in text
    tests = " ".join(p.read_text(encoding="utf-8") for p in (ROOT / "tests").glob("test_*.py"))
    named = re.findall(r"(?:`|::)(test_\w+)", section)
    assert len(named) >= 5 and all(f"def {name}(" in tests for name in named), named
