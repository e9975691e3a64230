"""SGR and SAF (pipeline.networks.sgraf) against the authors' code: tests/golden/sgraf_*.npz hold
the inputs, randomised weights and outputs of their ``SGRAF`` (Paranioar/SGRAF, branch
python3.6, model.py; made by scripts/golden_sgraf.py) over 36 regions and a 49-cell grid, with
padded captions of mixed lengths and an image shown twice. Their weights in ours (``from_sgraf``)
give, in float64 to 1e-9: the train-mode scores (dropout 0), their hinge loss, the gradient of
every parameter and every BatchNorm buffer after the forward (SAF's: once per caption), then the
eval-mode scores."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.losses.base import build_loss
from pipeline.networks.network import NetworkConfig
from pipeline.networks.sgraf import SAF, SGR, CaptionBlock, ImageBlock, from_sgraf

GOLDEN = Path(__file__).resolve().parent / "golden"
TOL = 1e-9  # relative to the largest magnitude of each compared tensor, float64
CASES = [("sgr", 36), ("sgr", 49), ("saf", 36), ("saf", 49)]
PARTS = ("img_enc", "txt_enc", "sim_enc")


def golden(name: str, members: int) -> dict:
    with np.load(GOLDEN / f"sgraf_{name}_{members}.npz") as data:
        return {k: data[k] for k in data.files}


def part(g: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1:]: torch.from_numpy(np.array(v)) for k, v in g.items()
            if k.startswith(prefix + ":")}


def converted(g: dict, what: str) -> dict:
    return from_sgraf(*(part(g, f"{name}:{what}") for name in PARTS))


def model_of(name: str, members: int, g: dict, **options):
    vocab_size, word_dim = g["txt_enc:state:embed.weight"].shape
    config = NetworkConfig(name, feature_dim=g["images"].shape[-1], set_size=members,
                           embed_dim=g["img_emb"].shape[-1], vocab_size=vocab_size, word_dim=word_dim,
                           options={"sim_dim": g["sim_enc:state:sim_eval_w.weight"].shape[1], "dropout": 0.0,
                                    **options})
    model = (SGR if name == "sgr" else SAF)(config).double()
    model.load_state_dict(converted(g, "state"))  # strict: every tensor, by name
    return model


def inputs(g: dict):
    return (torch.from_numpy(g["images"]), torch.from_numpy(g["captions"]), torch.from_numpy(g["lengths"]))


def close(ours: torch.Tensor, theirs, what: str, floor: float = 0.0) -> float:
    """max |ours − theirs| / max(max |theirs|, floor) <= TOL (``floor``: for a tensor that is 0
    in exact arithmetic, e.g. the gradient of a bias that a training BatchNorm cancels)."""
    theirs = torch.as_tensor(np.asarray(theirs))
    assert ours.shape == theirs.shape, what
    scale = max(float(theirs.abs().max()), floor, 1e-300)
    diff = float((ours.detach().double() - theirs.double()).abs().max()) / scale
    assert diff <= TOL, (what, diff)
    return diff


def test_the_files_come_from_the_authors_commit():
    for name, members in CASES:
        g = golden(name, members)
        assert str(g["repo"]) == "Paranioar/SGRAF"
        assert str(g["commit"]) == "a19d1a9d8cb01b959991f38877e5b3840ee0df28"
        assert set(json.loads(str(g["sha256"]))) == {"model.py"}
        assert g["images"].shape[1] == members and len(set(g["lengths"].tolist())) == len(g["lengths"])
        assert g["train_sims"].std() > 0.1  # scores spread over (0, 1): the comparison sees the inputs


@pytest.mark.parametrize("name,members", CASES)
@pytest.mark.parametrize("chunk", [0, 2])
def test_train_step_scores_loss_gradients_and_buffers_equal_theirs(name, members, chunk):
    """One train-mode forward (``caption_chunk`` 2: the captions scored in three chunks), their
    loss (hinge, margin 0.2, hardest negatives, only the diagonal positive) and its backward."""
    g = golden(name, members)
    model = model_of(name, members, g, caption_chunk=chunk).train()
    images, captions, lengths = inputs(g)
    scores = model(images, captions, lengths)
    close(scores, g["train_sims"], "train scores")
    loss = build_loss("mh", margin=0.2, mask_same_image=False).scored(
        scores, image_ids=torch.from_numpy(g["image_ids"]))
    close(loss, g["loss"], "loss")
    loss.backward()
    theirs = converted(g, "grad")
    grads = dict(model.named_parameters())
    assert set(grads) == set(theirs)
    # the biases of the graph keys, of the self-attentions' scores and of a Linear before a
    # training BatchNorm have gradient 0 in exact arithmetic (< 1e-14 of the largest here, their
    # rounding): compared with 1e-5 of the largest gradient as their scale; every other gradient
    # is above 4e-4 of the largest and compared with its own
    largest = max(float(v.abs().max()) for v in theirs.values())
    for key, p in grads.items():
        close(p.grad, theirs[key], f"grad {key}", floor=1e-5 * largest)
    after = converted(g, "state_after")
    for key, buffer in model.named_buffers():
        close(buffer, after[key], f"buffer {key}")
    if name == "saf":  # their BatchNorm1d(1) runs once per caption
        before = int(g["sim_enc:state:SAF_module.bn.num_batches_tracked"])
        assert int(model.SAF_module.bn.num_batches_tracked) == before + len(g["lengths"])


@pytest.mark.parametrize("name,members", CASES)
def test_eval_scores_after_the_step_equal_theirs(name, members):
    g = golden(name, members)
    model = model_of(name, members, g)
    model.load_state_dict(converted(g, "state_after"))
    with torch.no_grad():
        close(model.eval()(*inputs(g)), g["eval_sims"], "eval scores")


@pytest.mark.parametrize("name,members", CASES)
def test_scoring_their_embeddings_equals_theirs(name, members):
    """The similarity stage alone, from their encoders' outputs (what the cached-token-vector
    path, whose text head is ours, shares with theirs)."""
    g = golden(name, members)
    model = model_of(name, members, g).train()
    local = torch.from_numpy(g["img_emb"])
    words, lengths = torch.from_numpy(g["cap_emb"]), torch.from_numpy(g["lengths"])
    mask = torch.arange(words.shape[1])[None] < lengths[:, None]
    block = CaptionBlock(words, mask, model.t_global_w(words, mask), lengths)
    close(model.score(ImageBlock(local, model.v_global_w(local)), block), g["train_sims"], "scores")
