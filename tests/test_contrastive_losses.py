"""infonce and siglip (pipeline.losses.contrastive): hand-made cases, open_clip's ClipLoss and SigLipLoss
as golden references (pinned open_clip_torch 3.3.0, float64, 1e-9: values and gradients), the
clamp of the learned scale after each step, and training with the scale saved and resumed."""

import math

import pytest
import torch

from pipeline.losses.contrastive import CLIPInfoNCELoss, SigmoidPairLoss

open_clip_loss = pytest.importorskip("open_clip.loss")


def test_hand_made_cases():
    infonce = CLIPInfoNCELoss(init_scale=1.0).double()
    eye = torch.eye(2, dtype=torch.float64)
    # each row and column: -log(e / (e + 1)) = log(1 + 1/e)
    assert float(infonce(eye, eye).detach()) == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-12)
    siglip = SigmoidPairLoss(init_scale=1.0, init_bias=0.0).double()
    one = torch.zeros(1, 1, dtype=torch.float64)  # S = 0: -log σ(0) = log 2, divided by B = 1
    assert float(siglip.scored(one).detach()) == pytest.approx(math.log(2), abs=1e-12)
    two = torch.tensor([[1.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # positives σ(1), negatives σ(-1)
    expected = -(2 * math.log(1 / (1 + math.exp(-1))) + 2 * math.log(1 / (1 + math.exp(1)))) / 2
    assert float(siglip.scored(two).detach()) == pytest.approx(expected, abs=1e-12)


def features(seed=0, b=8, d=16):
    g = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    cap = torch.nn.functional.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=1)
    return img.requires_grad_(), cap.requires_grad_()


def _grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


def test_infonce_is_open_clips_clip_loss():
    ours = CLIPInfoNCELoss(init_scale=12.5, mask_same_image=False).double()
    img, cap = features()
    a = ours(img, cap, image_ids=torch.tensor([0, 0, 1, 2, 3, 4, 5, 6]))  # unmasked: ids change nothing
    scale = ours.logit_scale.detach().clone().requires_grad_()
    b = open_clip_loss.ClipLoss()(img, cap, scale.exp())
    assert abs(float(a.detach()) - float(b.detach())) < 1e-9
    ga, gb = _grads(a, img, cap, ours.logit_scale), _grads(b, img, cap, scale)
    assert all((x - y).abs().max() < 1e-9 for x, y in zip(ga, gb))


def test_siglip_is_open_clips_siglip_loss():
    ours = SigmoidPairLoss(init_scale=7.0, init_bias=-3.0, mask_same_image=False).double()
    img, cap = features(1)
    a = ours(img, cap)
    scale = ours.logit_scale.detach().clone().requires_grad_()
    bias = ours.logit_bias.detach().clone().requires_grad_()
    b = open_clip_loss.SigLipLoss()(img, cap, scale.exp(), bias)
    assert abs(float(a.detach()) - float(b.detach())) < 1e-9
    ga, gb = _grads(a, img, cap, ours.logit_scale, ours.logit_bias), _grads(b, img, cap, scale, bias)
    assert all((x - y).abs().max() < 1e-9 for x, y in zip(ga, gb))


def test_same_image_pairs_are_left_out_by_default():
    img, cap = features(2, b=4)
    ids = torch.tensor([0, 0, 1, 2])
    for cls in (CLIPInfoNCELoss, SigmoidPairLoss):
        masked, unmasked = cls().double(), cls(mask_same_image=False).double()
        assert float(masked(img, cap, image_ids=ids)) != float(unmasked(img, cap, image_ids=ids))
        assert float(masked(img, cap)) == float(unmasked(img, cap))  # no ids: only the diagonal


def test_the_learned_scale_is_clamped_after_a_step():
    loss = CLIPInfoNCELoss()
    with torch.no_grad():
        loss.logit_scale.fill_(10.0)
    loss.after_step()
    assert float(loss.logit_scale) == pytest.approx(math.log(100))
    assert float(SigmoidPairLoss().logit_scale) == pytest.approx(math.log(10))


@pytest.mark.parametrize("loss", ["infonce", "siglip"])
def test_the_scale_trains_and_resumes_exactly(tiny_cache, tmp_path, loss):
    from conftest import vse

    common = ("--loss", loss, "--embed-dim", 8, "--word-dim", 8, "--batch-size", 8, "--min-word-count", 1,
              "--val-every", 0, "--workers", 0, "--device", "cpu", "--seed", 1)
    straight = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "a", "--epochs", 2, *common)
    assert straight.exit_code == 0, straight.output
    first = vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "b", "--epochs", 1, *common)
    assert first.exit_code == 0, first.output
    assert vse("train", "--run-dir", tmp_path / "b", "--resume", "--epochs", 2).exit_code == 0
    a, b = (torch.load(tmp_path / r / "last.pt", weights_only=True)["loss"] for r in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert float(a["logit_scale"]) != pytest.approx(math.log(1 / 0.07 if loss == "infonce" else 10))
