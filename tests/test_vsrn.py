"""VSRN's image side (pipeline.models.vsrn inside a SetImageHead) against the encoder written the
authors' way (tests/reference/vsrn_loop.py) with the same weights, float64 (1e-9), in train mode
(BatchNorm on batch statistics, running statistics updated alike) and eval mode. The GCN's
BatchNorm is randomised: at the authors' init (γ = β = 0) every GCN layer is the identity and
would hide a slip, which ``test_a_slip_is_caught`` shows."""

import copy

import torch
from reference import vsrn_loop

from pipeline.models.heads import SetImageHead

TOL = 1e-9


def head(seed=0, dim=12, feature_dim=20):
    torch.manual_seed(seed)
    model = SetImageHead(feature_dim, dim, projection="linear", pool="vsrn").double()
    with torch.no_grad():
        for layer in model.pool.gcn:
            layer.bn.weight.uniform_(0.5, 1.5)
            layer.bn.bias.uniform_(-0.5, 0.5)
            layer.bn.running_mean.uniform_(-0.2, 0.2)
            layer.bn.running_var.uniform_(0.5, 1.5)
    return model


def images(n=5, k=36, feature_dim=20, seed=1):
    return torch.randn(n, k, feature_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def full(x):
    return torch.full((len(x),), x.shape[1], dtype=torch.int64)


def test_train_and_eval_mode_match_the_authors_structure():
    ours = head().train()
    theirs = copy.deepcopy(ours)
    x, y = images().requires_grad_(), images().requires_grad_()
    a, b = ours(x, full(x)), vsrn_loop.image_embeddings(theirs, y)
    assert (a - b).abs().max() < TOL and a.std() > 1e-3
    for (name, p), q in zip(ours.named_buffers(), theirs.buffers()):
        assert (p.double() - q.double()).abs().max() < TOL, name
    weights = torch.randn(a.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (a * weights).sum().backward()
    (b * weights).sum().backward()
    assert (x.grad - y.grad).abs().max() < TOL and x.grad.abs().max() > 1e-6
    shared = ("fc.", "pool.rnn.", ".bn.")  # modules the reference reads itself (its convs are copies)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        if any(part in name for part in shared):
            assert (p.grad - q.grad).abs().max() < TOL, name
    ours.eval(), theirs.eval()
    x = images(k=49, seed=3).detach()
    assert (ours(x, full(x)) - vsrn_loop.image_embeddings(theirs, x)).abs().max() < TOL


def test_at_the_authors_init_each_gcn_layer_is_the_identity():
    torch.manual_seed(0)
    model = SetImageHead(20, 12, projection="linear", pool="vsrn").double().eval()
    x = images()
    v = torch.randn(5, 36, 12, dtype=torch.float64)
    mask = torch.ones(5, 36, dtype=torch.bool)
    assert torch.equal(model.pool.gcn[0](v, mask, full(x)), v)


def test_a_slip_is_caught():
    """The affinity divided by the channels instead of the regions: far past the tolerance."""
    ours = head().eval()
    x = images()
    reference = vsrn_loop.image_embeddings(copy.deepcopy(ours), x)
    with torch.no_grad():
        for layer in ours.pool.gcn:
            layer.theta.weight.mul_(36 / 12)
            layer.theta.bias.mul_(36 / 12)
    assert (ours(x, full(x)) - reference).abs().max() > 1e3 * TOL
