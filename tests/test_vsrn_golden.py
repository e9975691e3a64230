"""pipeline.networks.vsrn (and the dual model, its loss and optimizer as `vse train --network vsrn`
builds them) against the authors' VSRN code: tests/golden/vsrn_*.npz hold their modules' inputs,
weights, outputs, gradients and parameters after two optimizer steps, all in float64
(scripts/golden_vsrn.py made them from KunpengLi1994/VSRN); the same weights here give the same
values to 1e-9 relative (of each array's largest magnitude)."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.core.config import TrainConfig
from pipeline.losses.hinge import MaxHingeLoss
from pipeline.networks.heads import SetImageHead
from pipeline.networks.vse_model import ModelConfig, TextEncoder, VSEModel
from pipeline.networks.vsrn import VARIANTS, CaptionDecoder, VSRNOptions, from_vsrn
from pipeline.training.factories import create_optimizer, trainable_parameters
from pipeline.training.trainer import clip_gradients

GOLDEN = Path(__file__).resolve().parent / "golden"
REL = 1e-9
VOCAB = 20


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"vsrn_{name}.npz") as data:
        return {k: data[k] for k in data.files}


def part(values: dict, prefix: str) -> dict:
    """The arrays under ``prefix:`` as tensors, by the rest of their name."""
    return {k[len(prefix) + 1:]: torch.from_numpy(np.array(v)) for k, v in values.items()
            if k.startswith(prefix + ":")}


def close(ours, theirs, what="", zero=0.0) -> float:
    """``zero``: below this, an array of theirs is a zero made of rounding (e.g. the gradient of a
    bias before a train-mode BatchNorm), and ours must be one too."""
    ours = ours.detach().double().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    theirs = np.asarray(theirs)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    if zero and np.abs(theirs).max() < zero:
        assert np.abs(ours).max() < zero, what
        return 0.0
    scale = max(float(np.abs(theirs).max()), 1e-300)
    diff = float(np.abs(ours - theirs).max()) / scale
    assert diff <= REL, (what, diff)
    assert float(np.abs(theirs).max()) > 0, what  # never a comparison of zeros
    return diff


def strip(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def test_the_files_come_from_the_authors_commit():
    for name in ("image", "text", "caption", "step"):
        values = golden(name)
        assert str(values["commit"]) == "777ae74326fdb6abe69dbd3911d0e545322520d1"
        assert str(values["repo"]) == "https://github.com/KunpengLi1994/VSRN"
        assert "sha256:model.py" in values and "sha256:GCN_lib/Rs_GCN.py" in values


# ---------------------------------------------------------------------------- the image side


def image_head(values: dict, variant: str) -> SetImageHead:
    theirs = part(values, f"{variant}:state")
    options = VARIANTS[variant.split("_")[0]]
    head = SetImageHead(10, 16, projection="linear", pool="vsrn", pool_options=options)
    head.double().load_state_dict(strip(from_vsrn(img_enc=theirs), "image_encoder.head."))  # strict
    return head


@pytest.mark.parametrize("variant", ["f30k_precomp", "coco_precomp"])
def test_both_image_encoders_in_train_then_eval_mode(variant):
    """Their EncoderImagePrecompAttn: a train-mode forward over 36 regions (BatchNorm on batch
    statistics, running statistics updated) with the gradients of the image vector and of the
    reasoned regions the caption branch reads, then eval mode over 36 and 49 members."""
    g = golden("image")
    head = image_head(g, variant).train()
    x = torch.from_numpy(g["x36"]).requires_grad_()
    full = torch.full((len(x),), x.shape[1])
    emb = head(x, full)
    regions = head.pool.last_regions[0]
    close(emb, g[f"{variant}:train"], "train")
    close(regions, g[f"{variant}:train_regions"], "regions")
    weights, region_weights = (torch.from_numpy(g[k]) for k in ("weights", "region_weights"))
    ((emb * weights).sum() + (regions * region_weights).sum()).backward()
    close(x.grad, g[f"{variant}:train_grad_x"], "d/dx")
    theirs = from_vsrn(img_enc=part(g, f"{variant}:train_grad"))
    zero = REL * max(float(v.abs().max()) for v in theirs.values())
    for name, p in head.named_parameters():
        close(p.grad, theirs["image_encoder.head." + name], name, zero=zero)
    after = from_vsrn(img_enc=part(g, f"{variant}:state_after"))
    buffers = dict(head.named_buffers())
    assert len(after) == len(buffers)
    for name, value in after.items():
        close(buffers[name[len("image_encoder.head."):]], value, name)
    head.eval()
    with torch.no_grad():
        close(head(x, full), g[f"{variant}:eval36"], "eval 36")
        x49 = torch.from_numpy(g["x49"])
        close(head(x49, torch.full((len(x49),), 49)), g[f"{variant}:eval49"], "eval 49")
        close(head.pool.last_regions[0], g[f"{variant}:eval49_regions"], "eval 49 regions")


def test_the_variants_differ_where_the_authors_do():
    """f30k_precomp's encoder is not coco_precomp's: the same weights, other vectors (so each
    test above pins its own variant)."""
    g = golden("image")
    head = image_head(g, "coco_precomp").eval()
    head.pool.region_norm = False
    x = torch.from_numpy(g["x36"])
    with torch.no_grad():
        assert np.abs(head(x, torch.full((6,), 36)).numpy() - g["coco_precomp:eval36"]).max() > 1e-3


# ---------------------------------------------------------------------------- the caption side


def test_the_gru_caption_encoder():
    g = golden("text")
    cfg = ModelConfig(vocab_size=VOCAB, feature_dim=10, embed_dim=16, word_dim=6)
    text = TextEncoder(cfg).double()
    text.load_state_dict(part(g, "state"))
    tokens, lengths = torch.from_numpy(g["tokens"]), torch.from_numpy(g["lengths"])
    emb = text(tokens, lengths)
    close(emb, g["out"])
    (emb * torch.from_numpy(g["weights"])).sum().backward()
    for name, p in text.named_parameters():
        close(p.grad, g[f"grad:{name}"], name)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_the_caption_branch_loss_and_gradients(dropout):
    """Their S2VTAttModel + LanguageModelCriterion on labels and masks of their data.py (max_len
    8: one caption cut, one of exactly 8 tokens whose <pad> is past the last prediction). With
    dropout 0.2 the masks are drawn in their order from the same seed: each dropout sits where
    theirs does."""
    g = golden("caption")
    name = "p0" if dropout == 0 else "p02"
    decoder = CaptionDecoder(VOCAB, 16, hidden=8, word_dim=6, max_len=8, dropout=dropout).double()
    decoder.load_state_dict(strip(from_vsrn(caption_model=part(g, "state")), "caption_decoder."))
    regions = torch.from_numpy(g["regions"]).requires_grad_()
    mask = torch.ones(regions.shape[:2], dtype=torch.bool)
    torch.manual_seed(32)
    loss = decoder(regions, mask, torch.from_numpy(g["targets"]), torch.from_numpy(g["lengths"]))
    close(loss, g[f"{name}:loss"], "loss")
    loss.backward()
    close(regions.grad, g[f"{name}:grad_regions"], "d/dregions")
    theirs = from_vsrn(caption_model=part(g, f"{name}:grad"))
    for key, p in decoder.named_parameters():
        close(p.grad, theirs["caption_decoder." + key], key)


# ---------------------------------------------------------------------------- two training steps


def step_model(g: dict, **options) -> VSEModel:
    network = dataclasses.asdict(VSRNOptions(variant="f30k", caption_max_len=int(g["max_len"]),
                                             caption_dropout=0.0, caption_hidden=8, caption_word_dim=6,
                                             **options))
    cfg = ModelConfig(vocab_size=VOCAB, feature_dim=10, embed_dim=16, word_dim=6, image_pool="vsrn",
                      pool_options=VARIANTS["f30k"], caption_loss_weight=1.0, network_options=network)
    model = VSEModel(cfg).double()
    state = from_vsrn(*(part(g, f"{name}:state") for name in ("img_enc", "txt_enc", "caption_model")))
    model.load_state_dict(state)  # strict: every weight of theirs, and only theirs
    return model


def train_steps(g: dict, model: VSEModel, trainable: list, optimizer, clip: bool = True):
    """`Trainer.step`'s order: forward, retrieval + the network's own terms, backward, clipping
    over the trainable list, the optimizer's step."""
    loss_fn = MaxHingeLoss(margin=float(g["margin"]))
    for step in range(2):
        model.train()
        images = torch.from_numpy(g[f"step{step}:images"])
        tokens = torch.from_numpy(g[f"step{step}:targets"])
        lengths = torch.from_numpy(g[f"step{step}:lengths"])
        img, cap = model(images, tokens, lengths)
        retrieval = loss_fn(img, cap)
        caption = model.auxiliary_losses()["caption"]
        yield step, retrieval, caption
        optimizer.zero_grad(set_to_none=True)
        (retrieval + caption).backward()
        yield step, None, None
        if clip:
            clip_gradients(trainable, float(g["grad_clip"]))
        optimizer.step()
        yield step, optimizer, None


def test_two_steps_of_their_training_with_the_caption_model_listed_twice():
    """The retrieval + caption loss, its gradients, then `vse train`'s clipping (the caption
    model counted twice in the norm and scaled twice) and Adam (its parameters stepped twice),
    twice: every parameter and BatchNorm statistic after each step equals theirs."""
    g = golden("step")
    model = step_model(g)
    loss = MaxHingeLoss(margin=float(g["margin"]))
    trainable, _ = trainable_parameters(model, loss)
    assert len(trainable) - len({id(q) for q in trainable}) == int(g["params_listed_twice"]) == \
        len(list(model.caption_decoder.parameters()))
    cfg = TrainConfig(features="x.h5", run_dir="r", network="vsrn", lr=float(g["lr"]),
                      grad_clip=float(g["grad_clip"]))
    optimizer = create_optimizer(cfg, model, trainable)
    names = ("img_enc", "txt_enc", "caption_model")  # from_vsrn's arguments, in order
    steps = train_steps(g, model, trainable, optimizer)
    for step, retrieval, caption in steps:
        close(retrieval, g[f"step{step}:retrieval_loss"], "retrieval loss")
        close(caption, g[f"step{step}:caption_loss"], "caption loss")
        next(steps)  # backward
        if step == 0:
            theirs = from_vsrn(*(part(g, f"step0:grad:{name}") for name in names))
            zero = REL * max(float(v.abs().max()) for v in theirs.values())
            for key, p in model.named_parameters():
                close(p.grad, theirs[key], f"d/d{key}", zero=zero)
        norm = torch.nn.utils.get_total_norm([q.grad for q in trainable])
        close(norm, g[f"step{step}:grad_norm"], "the norm clipping reads")
        next(steps)  # clipping, Adam
        before = from_vsrn(*(part(g, f"{name}:state") for name in names))
        after = from_vsrn(*(part(g, f"step{step}:after:{name}") for name in names))
        # the update itself, to 1e-9 of the largest (a bias before a BatchNorm has a gradient of
        # rounding noise, which Adam turns into an update of about lr · noise / eps)
        zero = REL * max(float((after[k] - before[k]).abs().max())
                         for k in after if after[k].is_floating_point())
        for key, value in model.state_dict().items():
            if value.is_floating_point():
                close(value - before[key], after[key] - before[key], f"step {step}: {key}", zero=zero)
            else:
                assert torch.equal(value, after[key]), key


def test_the_clean_adam_list_is_an_option_and_differs():
    """``caption_params_twice=False``: each parameter once in Adam and in the clipping norm; the
    caption model's update is then not theirs."""
    g = golden("step")
    model = step_model(g, caption_params_twice=False)
    trainable, _ = trainable_parameters(model, MaxHingeLoss())
    assert len(trainable) == len({id(q) for q in trainable})
    optimizer = create_optimizer(TrainConfig(features="x.h5", run_dir="r", network="vsrn", lr=float(g["lr"])),
                                 model, trainable)
    assert type(optimizer) is torch.optim.Adam
    for _ in train_steps(g, model, trainable, optimizer):
        pass
    after = strip(from_vsrn(caption_model=part(g, "step1:after:caption_model")), "caption_decoder.")
    ours = model.caption_decoder.state_dict()
    assert max(float((ours[k] - after[k]).abs().max()) for k in after) > 1e-5
