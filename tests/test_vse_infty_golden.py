"""pipeline.networks.heads and pipeline.networks.set_augment against the authors' VSE∞ code: the golden files
tests/golden/vse_infty_*.npz hold their modules' inputs, weights and outputs
(scripts/golden_vse_infty.py made them from woodfrog/vse_infty, master and bigru); the same
weights in our modules give the same outputs to 1e-5 (float32)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.networks.heads import GPO, BiGRUTextEncoder, SetImageHead, from_vse_infty
from pipeline.networks.set_augment import size_augment

GOLDEN = Path(__file__).resolve().parent / "golden"
ATOL = 1e-5


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"vse_infty_{name}.npz") as data:
        return {k: data[k] for k in data.files}


def state(values: dict, prefix: str) -> dict:
    return from_vse_infty({k.split(":", 1)[1]: torch.from_numpy(np.array(v)) for k, v in values.items()
                           if k.startswith(prefix + ":")})


def close(ours: torch.Tensor, theirs: np.ndarray) -> float:
    ours = ours.detach().numpy()
    assert ours.shape == theirs.shape
    diff = float(np.abs(ours - theirs).max())
    assert diff <= ATOL, diff
    return diff


def test_the_files_come_from_the_authors_commits():
    for name in ("gpo", "image_head", "augment", "text"):
        values = golden(name)
        assert str(values["master_commit"]) == "29df9d65f0e0b5bac3b6f6e6697a285ff89f52dc"
        assert str(values["bigru_commit"]) == "8600f891e143bda1a33d2228999d0d4c63acd4fd"


def test_gpo_pooled_features_and_weights():
    g = golden("gpo")
    gpo = GPO()
    gpo.load_state_dict(state(g, "state"))  # strict: the same parameters, by name
    x, lengths = torch.from_numpy(g["x"]), torch.from_numpy(g["lengths"])
    pooled, weights = gpo.pool_with_weights(x, lengths)
    close(pooled, g["pooled"])
    longest = int(lengths.max())  # theirs stops at the longest set, ours at K
    close(weights[:, :longest], g["weights"])
    assert x.shape[1] > longest and (weights[:, longest:] == 0).all()
    close(gpo(x, lengths), g["pooled"])
    for row, n in enumerate(g["lengths"]):
        close(gpo.weights_for(int(n)), g["weights"][row, :n])


@pytest.mark.parametrize("rows", ["padded rows in BatchNorm (theirs)", "reordered batch"])
def test_image_head_fc_mlp_gpo_in_train_then_eval_mode(rows):
    g = golden("image_head")
    x, lengths = torch.from_numpy(g["x"]), torch.from_numpy(g["lengths"])
    order = torch.arange(len(x)) if rows.startswith("padded") else torch.tensor([3, 0, 5, 1, 4, 2])
    head = SetImageHead(10, 8, projection="linear+mlp", pool="gpo")
    head.load_state_dict(state(g, "state"))
    raw = SetImageHead(10, 8, projection="linear+mlp", pool="gpo", no_imgnorm=True)
    raw.load_state_dict(state(g, "state"))
    head.train(), raw.train()
    with torch.no_grad():
        close(head(x[order], lengths[order]), g["train"][order])
        close(raw(x[order], lengths[order]), g["train_raw"][order])
        close(head.pool.weights(lengths, x.shape[1]), g["weights"])
    after = state(g, "state_after")
    for key, value in head.state_dict().items():
        if key in after:  # the running statistics moved as theirs (padded rows included)
            assert torch.allclose(value.double(), after[key].double(), atol=ATOL), key
    head.eval()
    with torch.no_grad():
        close(head(x[order], lengths[order]), g["eval"][order])


def test_image_head_fc_gpo_their_grid_head():
    g = golden("image_head")
    head = SetImageHead(10, 8, projection="linear", pool="gpo")
    head.load_state_dict(state(g, "fc_state"))
    with torch.no_grad():
        close(head(torch.from_numpy(g["x"]), torch.from_numpy(g["lengths"])), g["fc_only"])


def test_precomp_size_augmentation_and_the_head_on_it():
    g = golden("augment")
    features, lengths = size_augment(g["regions"], rng=np.random.RandomState(int(g["regions_seed"])),
                                     rule="precomp")
    np.testing.assert_array_equal(lengths, g["regions_lengths"])
    np.testing.assert_array_equal(features, g["regions_out"])  # compacted, zero padding, cut
    head = SetImageHead(10, 8, projection="linear+mlp", pool="gpo").train()
    head.load_state_dict(state(g, "state"))
    with torch.no_grad():
        close(head(torch.from_numpy(features), torch.from_numpy(lengths)), g["head_train"])


def test_grid_size_augmentation():
    g = golden("augment")
    grid = torch.from_numpy(g["grid"])
    features, lengths = size_augment(grid, rng=np.random.RandomState(int(g["grid_seed"])), rule="grid")
    np.testing.assert_array_equal(lengths.numpy(), g["grid_lengths"])
    np.testing.assert_array_equal(features.numpy(), g["grid_out"])
    assert (g["grid_lengths"] == grid.shape[1]).any() and (g["grid_lengths"] < grid.shape[1]).any()


@pytest.mark.parametrize("layers", [1, 2])
def test_bigru_text_encoder_with_gpo(layers):
    g = golden("text")
    tokens, lengths = torch.from_numpy(g["tokens"]), torch.from_numpy(g["lengths"])
    for no_txtnorm, key in ((False, f"out{layers}"), (True, f"raw{layers}")):
        text = BiGRUTextEncoder(20, 6, 8, layers, pool="gpo", no_txtnorm=no_txtnorm)
        text.load_state_dict(state(g, f"state{layers}"))
        with torch.no_grad():
            close(text(tokens, lengths), g[key])
            shuffled = torch.tensor([2, 4, 0, 3, 1])  # ours needs no sorted batch
            close(text(tokens[shuffled], lengths[shuffled]), g[key][shuffled.numpy()])
    close(text.pool.weights(lengths, tokens.shape[1]), g[f"weights{layers}"])
