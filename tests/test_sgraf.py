"""SGR and SAF (pipeline.networks.sgraf), batched over blocks: what their equality with the
authors' code (tests/test_sgraf_golden.py: scores, loss, gradients and BatchNorm buffers against
their model.py, float64, 1e-9) does not show: padding never read, batch order and chunks,
option checks, finite gradients over zero padding; in float64 with the weights randomised away
from the authors' initialisation (biases, BatchNorm affine and running statistics, sharper
attentions), where several attentions are uniform and would hide a slip."""

import pytest
import torch

from pipeline.networks.network import NetworkConfig
from pipeline.networks.sgraf import SAF, SGR

TOL = 1e-9
LENGTHS = torch.tensor([9, 3, 5, 1, 7, 2])


def randomised(cls, set_size=7, vocab=False, seed=0, **options):
    torch.manual_seed(seed)
    config = NetworkConfig("sgr" if cls is SGR else "saf", feature_dim=20, set_size=set_size, embed_dim=16,
                           vocab_size=30 if vocab else 0, word_dim=10, text_dim=0 if vocab else 12,
                           options={"sim_dim": 8, "dropout": 0.0, **options})
    model = cls(config).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
            elif "bn" in name or ".1.weight" in name and p.ndim == 1:
                p.uniform_(0.5, 1.5)
        for name, p in model.named_parameters():  # sharper attentions than at init
            if "graph_query_w.weight" in name or "attn_sim_w.weight" in name or "embedding_common" in name:
                p.mul_(4.0)
        # scores spread over (0, 1), not all near σ(bias): a score head of random signs
        model.sim_eval_w.weight.copy_(torch.randn(model.sim_eval_w.weight.shape, dtype=torch.float64) * 3)
        model.sim_eval_w.bias.zero_()
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return model


def inputs(set_size=7, vocab=False, n_images=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n_images, set_size, 20, generator=g, dtype=torch.float64)
    if vocab:
        captions = torch.randint(1, 30, (len(LENGTHS), 9), generator=g)
        captions[torch.arange(9)[None] >= LENGTHS[:, None]] = 0
    else:
        captions = torch.randn(len(LENGTHS), 9, 12, generator=g, dtype=torch.float64)
    return images, captions, LENGTHS


@pytest.mark.parametrize("cls", [SGR, SAF])
def test_padding_is_never_read(cls):
    model = randomised(cls).eval()
    images, captions, lengths = inputs()
    noisy = captions.clone()
    noisy[torch.arange(9)[None] >= lengths[:, None]] = 1e6
    assert torch.equal(model(images, captions, lengths), model(images, noisy, lengths))


@pytest.mark.parametrize("cls", [SGR, SAF])
def test_batch_order_does_not_matter_and_blocks_agree(cls):
    model = randomised(cls, caption_chunk=2).eval()
    images, captions, lengths = inputs()
    full = model(images, captions, lengths)
    order = torch.tensor([4, 0, 5, 2, 1, 3])
    permuted = model(images[[3, 1, 0, 4, 2]], captions[order], lengths[order])
    assert (permuted - full[[3, 1, 0, 4, 2]][:, order]).abs().max() < TOL
    one_caption = model.encode_captions(captions[4:5], lengths[4:5])
    one_pair = model.score(model.encode_images(images[2:3]), one_caption)
    assert abs(float(one_pair.detach()) - float(full[2, 4].detach())) < TOL


def test_options_are_checked_in_one_line():
    from pipeline.core.errors import VseError

    config = NetworkConfig("sgr", feature_dim=4, set_size=3, embed_dim=8, text_dim=4, options={"sim_dims": 3})
    with pytest.raises(VseError, match="no option sim_dims .*its options: sim_dim"):
        SGR(config)
    with pytest.raises(VseError, match="^network sgr: sgr_steps must be an integer >= 1, got '3'$"):
        SGR(NetworkConfig("sgr", feature_dim=4, set_size=3, embed_dim=8, text_dim=4,
                          options={"sgr_steps": "3"}))


def test_zero_padding_keeps_gradients_finite():
    """Cached token vectors are zero past a caption's end, and the text head's bias starts at 0:
    the padded words are 0 before their L2 norm, whose √0 once made every gradient NaN."""
    model = randomised(SGR).train()
    with torch.no_grad():
        model.text_fc.bias.zero_()
    images, captions, lengths = inputs()
    captions[torch.arange(9)[None] >= lengths[:, None]] = 0.0
    model(images, captions, lengths).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("cls", [SGR, SAF])
def test_scores_leave_bf16_autocast_in_fp32(cls):
    """Under bf16 autocast the interior runs in bf16 but the scores come out of σ(w_e · v) in fp32:
    rounded to bf16 they would take a few dozen values, and MH's hardest negatives would tie
    (PROTOCOL, "Numeric precision"; bench/results/precision_saf_cpu)."""
    model = randomised(cls).float().eval()
    images, captions, lengths = inputs()
    images, captions = images.float(), captions.float()
    with torch.no_grad():
        fp32 = model(images, captions, lengths)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(images, captions, lengths)
    assert mixed.dtype == torch.float32
    assert not torch.equal(mixed, mixed.bfloat16().float())  # finer than bf16's grid
    assert mixed.unique().numel() > mixed.bfloat16().unique().numel()  # fewer ties than bf16 scores
    assert torch.allclose(mixed, fp32, atol=0.05)  # the interior's bf16 rounding only
