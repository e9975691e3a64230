"""The shortcuts of VSRN's training step (pipeline.networks.vsrn) give what the plain computation
gives: the GCN's folded maps (``folds``: θ with φ, W with g) against the four maps, forward and
gradients, over full and padded sets; full sets without masks, the GRUs unpacked, against the
masked and packed path. Float64, 1e-9 of each array's largest magnitude."""

import pytest
import torch

from pipeline.networks import vsrn
from pipeline.networks.vsrn import CaptionDecoder, RegionGCN, VSRNReasoning, folds

TOL = 1e-9


def close(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    a, b = a.detach(), b.detach()
    scale = float(b.abs().max())
    assert scale > 0, what
    assert float((a - b).abs().max()) <= TOL * scale, (what, float((a - b).abs().max()) / scale)


def layer(dim=12, seed=0) -> RegionGCN:
    torch.manual_seed(seed)
    gcn = RegionGCN(dim).double().train()
    with torch.no_grad():  # every weight matters: γ, β (0 at their init), biases of every map
        gcn.bn.weight.uniform_(0.5, 1.5)
        gcn.bn.bias.uniform_(-0.5, 0.5)
        for m in (gcn.theta, gcn.phi, gcn.g, gcn.W):
            m.bias.uniform_(-0.5, 0.5)
    return gcn


def test_the_rule_counts_multiply_adds():
    assert folds(2048, 128 * 36) and not folds(2048, 36) and not folds(16, 16)
    assert folds(16, 17)
    # inter ≠ dim: rows·E² + E²·I against 2·rows·E·I
    assert folds(8, 100, inter=16) == (8 * (100 + 16) < 2 * 100 * 16)


@pytest.mark.parametrize("lengths", [[7, 7, 7, 7], [7, 3, 5, 1]])
def test_folded_maps_equal_the_four_maps(monkeypatch, lengths):
    """The same layer, forced one way then the other: outputs, the input's gradient, every
    parameter's gradient and the BatchNorm's running statistics."""
    lengths = torch.tensor(lengths)
    k, dim = 7, 12
    mask = torch.arange(k)[None] < lengths[:, None]
    v = torch.randn(len(lengths), k, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    v = v.masked_fill(~mask[..., None], 0.0)
    weights = torch.randn(v.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    results = {}
    for fold in (False, True):
        monkeypatch.setattr(vsrn, "folds", lambda *args, fold=fold: fold)
        gcn = layer(dim)
        x = v.clone().requires_grad_()
        out = gcn(x, mask, lengths, full=bool((lengths == k).all()))
        (out * weights).sum().backward()
        results[fold] = (out, x.grad, {n: p.grad for n, p in gcn.named_parameters()},
                         {n: b.clone() for n, b in gcn.named_buffers() if b.is_floating_point()})
    (out0, dx0, grads0, bufs0), (out1, dx1, grads1, bufs1) = results[False], results[True]
    close(out1, out0, "out")
    close(dx1, dx0, "d/dv")
    for name in grads0:
        if name == "W.bias":  # before a train-mode BatchNorm: a zero made of rounding, both ways
            assert grads0[name].abs().max() < 1e-12 and grads1[name].abs().max() < 1e-12
            continue
        close(grads1[name], grads0[name], name)
    for name in bufs0:
        close(bufs1[name], bufs0[name], name)


def test_a_full_batch_skips_the_masks_with_the_same_values():
    """``full=True`` (no mask applied, the BatchNorm over all rows) equals the masked path on
    full sets, exactly."""
    v = torch.randn(3, 7, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    lengths, mask = torch.full((3,), 7), torch.ones(3, 7, dtype=torch.bool)
    outs = [layer()(v, mask, lengths, full=f) for f in (False, True)]
    assert torch.equal(outs[0], outs[1])


def pool(seed=0, dim=12) -> VSRNReasoning:
    torch.manual_seed(seed)
    model = VSRNReasoning(dim, region_norm=True, image_bn=True).double()
    with torch.no_grad():
        for gcn in model.gcn:
            gcn.bn.weight.uniform_(0.5, 1.5)
            gcn.bn.bias.uniform_(-0.5, 0.5)
            gcn.bn.running_var.uniform_(0.5, 1.5)
        model.image_bn.running_var.uniform_(0.5, 1.5)
    return model.eval()


def test_full_sets_unpacked_equal_the_packed_path():
    """Eval mode (statistics per set): full sets alone (no masks, the GRU unpacked) and the same
    sets in a batch with a padded one (masks, packed) give the same vectors and regions."""
    x = torch.randn(4, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    model = pool()
    with torch.no_grad():
        alone = model(x[:3], torch.full((3,), 9))
        regions = model.last_regions[0]
        mixed = model(x, torch.tensor([9, 9, 9, 5]))
    close(alone, mixed[:3], "pool")
    close(regions, model.last_regions[0][:3], "regions")


def test_the_caption_branch_on_full_sets_equals_the_packed_path():
    """The loss is a sum over the batch / B: full sets alone (unpacked encoder, no attention
    mask) and a padded set alone (packed) add up to the two together (packed)."""
    torch.manual_seed(5)
    decoder = CaptionDecoder(20, 12, hidden=8, word_dim=6, max_len=8, dropout=0.0).double()
    regions = torch.randn(4, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    tokens = torch.randint(4, 20, (4, 10), generator=torch.Generator().manual_seed(7))
    lengths = torch.tensor([10, 6, 4, 7])
    tokens[:, 0], tokens[torch.arange(4), lengths - 1] = 1, 2
    tokens[torch.arange(10)[None] >= lengths[:, None]] = 0
    region_lengths = torch.tensor([9, 9, 9, 5])
    mask = torch.arange(9)[None] < region_lengths[:, None]

    def loss(rows):
        rows = torch.tensor(rows)
        given = (regions[rows], mask[rows], tokens[rows], lengths[rows], region_lengths[rows])
        return decoder(*given) * len(rows)

    close(loss([0, 1, 2]) + loss([3]), loss([0, 1, 2, 3]), "loss")
