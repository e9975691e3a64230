"""VSRN's image side (pipeline.models.vsrn inside a SetImageHead) against the encoder written the
authors' way (tests/reference/vsrn_loop.py) with the same weights, float64 (1e-9), in train mode
(BatchNorm on batch statistics, running statistics updated alike) and eval mode. The GCN's
BatchNorm is randomised: at the authors' init (γ = β = 0) every GCN layer is the identity and
would hide a slip, which ``test_a_slip_is_caught`` shows."""

import copy
import math

import numpy as np
import pytest
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


# ---------------------------------------------------------------------------- the caption branch


def test_the_caption_branch_matches_the_loop_and_never_reads_padding():
    """The batched decoder (the attention's region half computed once) against the S2VT attention
    written out one caption at a time over only its own regions and words, float64, 1e-9."""
    from reference.vsrn_loop import caption_loss_loop

    from pipeline.models.vsrn import CaptionDecoder

    torch.manual_seed(0)
    decoder = CaptionDecoder(vocab_size=30, region_dim=12, hidden=16, word_dim=8).double()
    regions = torch.randn(4, 9, 12, dtype=torch.float64)
    mask = torch.arange(9)[None] < torch.tensor([9, 5, 7, 9])[:, None]
    regions = regions.masked_fill(~mask[..., None], 1e6)  # padding that would show if it were read
    tokens = torch.randint(0, 30, (4, 11))
    lengths = torch.tensor([11, 4, 7, 2])
    got = decoder(regions.masked_fill(~mask[..., None], 0.0), mask, tokens, lengths)
    assert got.item() == pytest.approx(caption_loss_loop(decoder, regions, mask, tokens, lengths).item(),
                                       rel=1e-9)
    tokens[1, 4:] = 7  # words past a caption's length change nothing
    assert decoder(regions.masked_fill(~mask[..., None], 0.0), mask, tokens, lengths).item() == got.item()


def test_vsrn_trains_its_caption_branch_by_default(tmp_path):
    from conftest import QUIET, TINY_TRAIN, demo_captions, write_feature_cache

    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.core.config import TrainConfig
    from pipeline.core.errors import VseError
    from pipeline.evaluation.inference import load_model
    from pipeline.training.build import build_trainer

    n = 20
    ids, captions = demo_captions(n)
    rng = np.random.default_rng(0)
    splits = {"train": np.arange(12), "dev": np.arange(12, 16), "test": np.arange(16, 20)}
    sets = rng.normal(size=(n, 9, 16)).astype(np.float32)
    cache = write_feature_cache(tmp_path / "grid.h5", sets, captions, np.repeat(np.arange(n), 5), splits,
                                image_ids=ids, grid=[3, 3])
    config = TrainConfig(features=str(cache), run_dir=str(tmp_path / "run"), network="vsrn",
                         **{**TINY_TRAIN, "epochs": 1})
    assert config.caption_loss_weight == 1.0  # the paper's branch, on for --network vsrn
    trainer = build_trainer(config, **QUIET)
    trainer.fit()
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["model_config"]["caption_loss_weight"] == 1.0
    assert any(k.startswith("caption_decoder.") for k in state["model"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    caption = [e.value for e in events.Scalars("train/aux/caption")]
    assert caption and all(math.isfinite(v) and v > 0 for v in caption)
    loaded = load_model(tmp_path / "run" / "best.pt", torch.device("cpu"))
    assert loaded.model.caption_decoder is not None
    off = TrainConfig(features=str(cache), run_dir=str(tmp_path / "off"), network="vsrn",
                      caption_loss_weight=0.0, **{**TINY_TRAIN, "epochs": 1})
    assert off.caption_loss_weight == 0.0  # an explicit 0 stays off
    with pytest.raises(VseError, match="word ids, not --text-features"):
        TrainConfig(features=str(cache), run_dir=str(tmp_path / "t"), network="vsrn",
                    text_features=str(tmp_path / "x.h5")).check()
    with pytest.raises(VseError, match="caption branch"):
        TrainConfig(features=str(cache), run_dir=str(tmp_path / "t"), caption_loss_weight=1.0).check()
