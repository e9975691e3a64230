"""VSRN here beyond what the authors' code has (tests/test_vsrn_golden.py pins what it has):
padding never read (their sets are always full), the GCN's identity at their init, the variant
rule, float32 kept where it was, and `vse train --network vsrn` with its caption branch, its
Adam list and its options. Float comparisons: float64, 1e-9 unless stated."""

import math

import numpy as np
import pytest
import torch

from pipeline.core.errors import VseError
from pipeline.networks.heads import SetImageHead
from pipeline.networks.vsrn import CaptionDecoder, VSRNOptions, model_fields, resolve_variant

TOL = 1e-9


def head(seed=0, dim=12, feature_dim=20, **pool_options):
    torch.manual_seed(seed)
    model = SetImageHead(feature_dim, dim, projection="linear", pool="vsrn", pool_options=pool_options)
    model = model.double()
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


def test_at_the_authors_init_each_gcn_layer_is_the_identity():
    torch.manual_seed(0)
    model = SetImageHead(20, 12, projection="linear", pool="vsrn").double().eval()
    v = torch.randn(5, 36, 12, dtype=torch.float64)
    mask = torch.ones(5, 36, dtype=torch.bool)
    assert torch.equal(model.pool.gcn[0](v, mask, full(v)), v)


@pytest.mark.parametrize("variant", ["coco", "f30k"])
def test_padding_is_never_read(variant):
    """A set padded to K with huge values gives (eval mode) what the set alone gives."""
    model = head(**{"coco": {}, "f30k": {"region_norm": False, "image_bn": True}}[variant]).eval()
    x = images(n=3, k=9)
    lengths = torch.tensor([9, 4, 6])
    padded = x.clone()
    padded[torch.arange(9)[None] >= lengths[:, None]] = 1e6
    with torch.no_grad():
        together = model(padded, lengths)
        for row, n in enumerate(lengths.tolist()):
            alone = model(x[row:row + 1, :n], torch.tensor([n]))
            assert (together[row] - alone[0]).abs().max() < TOL


def test_the_caption_branch_never_reads_padding_and_cuts_at_max_len():
    torch.manual_seed(0)
    decoder = CaptionDecoder(vocab_size=30, region_dim=12, hidden=16, word_dim=8, max_len=6, dropout=0.0)
    decoder = decoder.double()
    mask = torch.arange(9)[None] < torch.tensor([9, 5, 7, 9])[:, None]
    regions = torch.randn(4, 9, 12, dtype=torch.float64)
    tokens = torch.randint(4, 30, (4, 11))
    tokens[:, 0] = 1
    lengths = torch.tensor([11, 4, 7, 2])
    got = decoder(regions.masked_fill(~mask[..., None], 0.0), mask, tokens, lengths)
    assert decoder(regions.masked_fill(~mask[..., None], 1e6), mask, tokens, lengths).item() == pytest.approx(
        got.item(), rel=TOL)
    changed = tokens.clone()
    changed[1, 4:] = 7   # words past a caption's length
    changed[0, 6:] = 9   # words past max_len (the 6th token is made <end>)
    assert decoder(regions, mask, changed, lengths).item() == pytest.approx(
        decoder(regions, mask, tokens, lengths).item(), rel=TOL)


def test_the_variant_rule():
    assert resolve_variant("auto", "regions", ["vsepp-precomp", "f30k_precomp"]) == "f30k"
    assert resolve_variant("auto", "regions", ["vsepp-precomp", "coco_precomp"]) == "coco"
    assert resolve_variant("auto", "grid", ["flickr8k"]) == "coco"
    assert resolve_variant("f30k", "grid", []) == "f30k"
    fields = model_fields({}, "regions", ["data"])
    assert fields["pool_options"] == {"region_norm": False, "image_bn": True}
    assert fields["network_options"] == {**vars(VSRNOptions()), "variant": "f30k"}
    with pytest.raises(VseError, match="vsrn has no option colour"):
        model_fields({"colour": 1}, "grid")
    with pytest.raises(VseError, match="variant must be one of auto, f30k, coco, got 'f8k'"):
        model_fields({"variant": "f8k"}, "grid")


def test_float32_stays_float32():
    """The image and caption encoders run in their parameters' precision: float32 features of
    any stored type (float16 sets) as before, float64 only in a .double() model."""
    from pipeline.networks.vse_model import ModelConfig, VSEModel

    cfg = ModelConfig(vocab_size=20, feature_dim=10, embed_dim=8, word_dim=6, image_pool="vsrn")
    model = VSEModel(cfg).eval()
    x = images(n=2, k=4, feature_dim=10).half()
    tokens, lengths = torch.tensor([[1, 5, 2], [1, 2, 0]]), torch.tensor([3, 2])
    img, cap = model(x, tokens, lengths)
    assert img.dtype == cap.dtype == torch.float32
    img64, cap64 = model.double()(x.double(), tokens, lengths)
    assert img64.dtype == cap64.dtype == torch.float64
    assert (img64 - img.double()).abs().max() < 1e-3


def test_vsrn_trains_its_caption_branch_by_default(tmp_path):
    from conftest import QUIET, TINY_TRAIN, demo_captions, write_feature_cache

    from pipeline.core.checkpoint import load_checkpoint
    from pipeline.core.config import TrainConfig
    from pipeline.evaluation.inference import load_model
    from pipeline.networks.vsrn import AdamListingTwice
    from pipeline.training.build import build_trainer

    n = 20
    ids, captions = demo_captions(n)
    rng = np.random.default_rng(0)
    splits = {"train": np.arange(12), "dev": np.arange(12, 16), "test": np.arange(16, 20)}
    sets = rng.normal(size=(n, 9, 16)).astype(np.float32)
    cache = write_feature_cache(tmp_path / "grid.h5", sets, captions, np.repeat(np.arange(n), 5), splits,
                                image_ids=ids, grid=[3, 3])
    assert TrainConfig(features=str(cache), run_dir="r", network="vsrn").embed_dim == 2048  # theirs
    assert TrainConfig(features=str(cache), run_dir="r").embed_dim == 1024
    config = TrainConfig(features=str(cache), run_dir=str(tmp_path / "run"), network="vsrn",
                         network_options={"caption_max_len": 12}, **{**TINY_TRAIN, "epochs": 1})
    assert config.caption_loss_weight == 1.0  # the paper's branch, on for --network vsrn
    config.check()
    trainer = build_trainer(config, **QUIET)
    assert isinstance(trainer.optimizer, AdamListingTwice)  # their list: the caption model twice
    assert len(trainer.trainable) - len({id(q) for q in trainer.trainable}) == len(
        list(trainer.model.caption_decoder.parameters()))
    assert trainer.model.caption_decoder.max_len == 12
    trainer.fit()
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    config_saved = state["model_config"]
    assert config_saved["caption_loss_weight"] == 1.0
    assert config_saved["network_options"]["variant"] == "coco"  # a CNN grid: their rule for every other data
    assert config_saved["pool_options"] == {"region_norm": True, "image_bn": False}
    assert any(k.startswith("caption_decoder.") for k in state["model"])  # exact resume (theirs drops it)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    caption = [e.value for e in events.Scalars("train/aux/caption")]
    assert caption and all(math.isfinite(v) and v > 0 for v in caption)
    loaded = load_model(tmp_path / "run" / "best.pt", torch.device("cpu"))
    assert loaded.model.caption_decoder is None  # it trains only: inference never builds it
    off = TrainConfig(features=str(cache), run_dir=str(tmp_path / "off"), network="vsrn",
                      caption_loss_weight=0.0, **{**TINY_TRAIN, "epochs": 1})
    assert off.caption_loss_weight == 0.0  # an explicit 0 stays off
    with pytest.raises(VseError, match="word ids, not --text-features"):
        TrainConfig(features=str(cache), run_dir=str(tmp_path / "t"), network="vsrn",
                    text_features=str(tmp_path / "x.h5")).check()
    with pytest.raises(VseError, match="caption branch"):
        TrainConfig(features=str(cache), run_dir=str(tmp_path / "t"), caption_loss_weight=1.0).check()
    with pytest.raises(VseError, match="vse\\+\\+ has no network options"):
        TrainConfig(features=str(cache), run_dir=str(tmp_path / "t"),
                    network_options={"variant": "f30k"}).check()
    bad = TrainConfig(features=str(cache), run_dir=str(tmp_path / "bad"), network="vsrn",
                      network_options={"variant": "f8k"}, **{**TINY_TRAIN, "epochs": 1})
    with pytest.raises(VseError, match="variant must be"):
        build_trainer(bad, **QUIET)
