"""``ncr`` against the authors' code (XLearning-SCU/2021-NeurIPS-NCR, made by scripts/golden_ncr.py):

- tests/golden/ncr_schedule.npz: one chain of their co_train.py on 20 captions of 4 images, two tiny
  scorers (tests/ncr_tiny.py, with a BatchNorm) in their SGRAF class: A's warm-up pass, B's; the
  per-pair losses and the GMM split; A's co-training pass on B's division (clean and noisy
  batches, two Adam steps per iteration), B's (ends at a noisy batch of one pair), A's before
  num_epochs // 2 (clean only). Ours replays it from the same weights on the same batches through
  ``trainer.planned_step`` (the step the Trainer runs), ``CoTrained`` and one Adam with vse's
  clipping: the targets, losses, clipped gradients, weights and BatchNorm statistics after every
  step, the per-pair losses and the GMM's probabilities, to 1e-9 relative (float64); the same
  clean sets; the fixed network never moves.
- tests/golden/ncr_formulas.npz: their ContrastiveLoss's modes (train with (B, B) and (B, 1) labels
  for each soft margin, warmup, eval_loss, predict) and split_prob with its fallback.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from ncr_tiny import TinyScorer

from pipeline.data.batches import Batch
from pipeline.losses.base import build_loss
from pipeline.losses.noisy.base import Phase
from pipeline.losses.noisy.ncr import divide, gmm_clean_probability, split_prob
from pipeline.networks.cotrain import CoTrained
from pipeline.training.trainer import PlannedBatches, PlannedStep, clip_gradients, planned_step

GOLDEN = Path(__file__).resolve().parent / "golden"
RTOL = 1e-9  # float64: only the order of operations differs
COMMIT = "60256ba1095798319099af6c93e8e2b4edf563fa"


def golden(name: str) -> dict:
    with np.load(GOLDEN / f"ncr_{name}.npz") as data:
        return {k: data[k] for k in data.files}


G, F = golden("schedule"), golden("formulas")
CASE = json.loads(str(F["cases"]))
DIFFS: dict = {}  # the largest relative difference of each kind of value (reported by the last test)


def close(what: str, ours, theirs, scale: float = 0.0) -> None:
    """Relative to the largest of ``theirs`` (or ``scale``, for a tensor that is ~0 by construction:
    the gradient of a bias before a BatchNorm is rounding only)."""
    ours = ours.detach().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    theirs = np.asarray(theirs)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    scale = max(float(np.abs(theirs).max()) if theirs.size else 0.0, scale, 1e-300)
    diff = float(np.abs(ours - theirs).max()) / scale if theirs.size else 0.0
    DIFFS[what.split(":")[0]] = max(DIFFS.get(what.split(":")[0], 0.0), diff)
    assert diff <= RTOL, (what, diff)


def batch(ids) -> Batch:
    ids = np.asarray(ids)
    image = G["image_of_caption"][ids]
    lengths = torch.from_numpy(G["lengths"][ids])
    tokens = torch.from_numpy(G["tokens"][ids][:, :int(lengths.max())])
    return Batch(torch.from_numpy(G["images"][image]), (tokens, lengths), torch.from_numpy(image),
                 torch.from_numpy(ids))


class Replay:
    """Ours through their chain: ``planned_step`` with one Adam over both networks and vse's
    clipping, recording each update as their Recorder did."""

    def __init__(self):
        nets = []
        for prefix in ("init_a", "init_b"):
            net = TinyScorer().double()
            net.load_state_dict({k.split(":", 1)[1]: torch.from_numpy(v) for k, v in G.items()
                                 if k.startswith(prefix + ":")})
            nets.append(net)
        self.model = CoTrained(nets)
        self.loss = build_loss("ncr")  # the authors' defaults
        self.loss.prepare(len(G["lengths"]))
        self.adam = torch.optim.Adam(self.model.parameters(), lr=CASE["lr"])
        self.updates, self.targets = [], []
        phase_targets = self.loss.phase_targets

        def recorded_targets(phase, streams, predict):
            out = phase_targets(phase, streams, predict)
            self.targets.append(out)
            return out

        self.loss.phase_targets = recorded_targets

    def step(self, phase: Phase, *id_lists) -> None:
        member, fixed = self.model.members[phase.member], self.model.members[1 - phase.member]
        before = {k: v.clone() for k, v in fixed.state_dict().items()}

        def update(value):
            self.adam.zero_grad(set_to_none=True)
            value.backward()
            assert all(p.grad is None for p in fixed.parameters())
            clip_gradients(list(self.model.parameters()), CASE["grad_clip"])
            grads = {n: p.grad.clone() for n, p in member.named_parameters()}
            self.adam.step()
            self.updates.append({"loss": value.detach(), "grads": grads,
                                 "after": {k: v.clone() for k, v in member.state_dict().items()}})
            return value.item()

        planned_step(self.model, self.loss, PlannedStep(phase, [batch(ids) for ids in id_lists]), update)
        for k, v in fixed.state_dict().items():  # the fixed network: eval mode, no step
            assert torch.equal(v, before[k]), k


def compare_update(prefix: str, ours: dict) -> None:
    close(f"loss:{prefix}", ours["loss"], G[f"{prefix}:loss"])
    # relative to the step's largest gradient, at least 1e-4 (a step of two captions of one image
    # has an exactly cancelling gradient: theirs and ours are rounding, ~1e-16)
    largest = max(1e-4, *(float(np.abs(G[f"{prefix}:grad:{name}"]).max()) for name in ours["grads"]))
    for name, grad in ours["grads"].items():
        close(f"grad:{prefix}:{name}", grad, G[f"{prefix}:grad:{name}"], scale=largest)
    for name, value in ours["after"].items():
        theirs = G[f"{prefix}:after:{name}"].astype(np.float64)
        close(f"after:{prefix}:{name}", value.to(torch.float64), theirs)


@pytest.fixture(scope="module")
def replay():
    r = Replay()
    for member, prefix in enumerate(("warmup_a", "warmup_b")):
        for t in range(int(G[f"{prefix}:steps"])):
            r.step(Phase(member, "warmup", ()), G[f"{prefix}:{t}:ids"])
    r.warmup = r.updates[:]
    r.updates.clear()
    return r


def test_the_files_come_from_the_authors_commit():
    for values in (G, F):
        assert str(values["repo"]) == "XLearning-SCU/2021-NeurIPS-NCR"
        assert str(values["commit"]) == COMMIT
        read = {k for k in values if k.startswith("sha256:")}
        assert read >= {"sha256:NCR/co_train.py", "sha256:NCR/model.py", "sha256:NCR/data.py"}


def test_warmup_passes_loss_gradients_and_adam_steps(replay):
    """A's pass, then B's: Σ_i mean_j + Σ_j mean_i of the hinges at margin 0.2, clipped, Adam."""
    steps = [f"warmup_a:{t}" for t in range(int(G["warmup_a:steps"]))]
    steps += [f"warmup_b:{t}" for t in range(int(G["warmup_b:steps"]))]
    assert len(replay.warmup) == len(steps) == 8
    for prefix, ours in zip(steps, replay.warmup, strict=True):
        compare_update(prefix, ours)


def _division(replay):
    """Their eval_train on the replay's warmed-up networks: per-pair losses, the GMMs, split_prob."""
    model, loss = replay.model, replay.loss
    model.eval()
    losses = np.zeros((2, len(G["lengths"])))
    start = 0
    with torch.no_grad():
        for size in G["eval_batch_sizes"]:
            ids = G["eval_ids"][start:start + size]
            b = batch(ids)
            stacked = model(b.images, *b.captions)
            statistic = loss.sample_statistic(stacked, b.image_ids)
            close("eval_loss:a", statistic[0], G["eval_loss_a"][start:start + size])
            close("eval_loss:b", statistic[1], G["eval_loss_b"][start:start + size])
            losses[:, ids] = statistic.numpy()
            start += size
    return losses


def test_per_pair_losses_and_the_gmm_split(replay):
    losses = _division(replay)
    for k, net in enumerate("ab"):
        state = np.random.RandomState()
        gauss = G[f"gmm_state_{net}:gauss"]
        state.set_state(("MT19937", G[f"gmm_state_{net}:keys"], int(G[f"gmm_state_{net}:pos"]), int(gauss[0]),
                         float(gauss[1])))
        w = gmm_clean_probability(losses[k], state)
        close(f"gmm:{net}", w, G[f"prob_{net}"])
        assert np.array_equal(split_prob(w, 0.5), G[f"pred_{net}"])  # the same clean set
        state.set_state(("MT19937", G[f"gmm_state_{net}:keys"], int(G[f"gmm_state_{net}:pos"]), int(gauss[0]),
                         float(gauss[1])))
        assert np.array_equal(divide(losses[k], 0.5, state)[1], G[f"pred_{net}"])


def test_co_training_passes_targets_losses_gradients_and_adam_steps(replay):
    """A on B's division (clean + noisy, from num_epochs // 2), B on A's (stops at a noisy batch of
    one pair), A again before num_epochs // 2 (clean only): every target, update and state."""
    r, loss = replay, replay.loss
    if not hasattr(r, "cotrained"):
        with torch.no_grad():
            loss.clean_probability.copy_(torch.from_numpy(np.stack([G["prob_a"], G["prob_b"]])))
            # the divisions their train() got: A learns from B's judgement, B from A's
            loss.judged_clean.copy_(torch.from_numpy(np.stack([G["clean_for_b"], G["clean_for_a"]])))
        r.cotrained = True
    # their epoch e of num_epochs N is our epoch warmup + e of warmup + N
    warm, total = loss.warmup_epochs, loss.warmup_epochs + CASE["num_epochs"]
    ids = np.arange(len(G["lengths"]))
    late, early = loss.epoch_plan(warm + 2, total, ids), loss.epoch_plan(warm + 0, total, ids)
    assert [p.kind for p in late] == ["clean+noisy"] * 2 and [p.kind for p in early] == ["clean"] * 2
    for k, clean in enumerate((G["clean_for_a"], G["clean_for_b"])):
        assert np.array_equal(late[k].streams[0], np.flatnonzero(clean))
        assert np.array_equal(late[k].streams[1], np.flatnonzero(~clean))
    for prefix, phase in (("train_a", late[0]), ("train_b", late[1]), ("early_a", early[0])):
        r.updates.clear()
        r.targets.clear()
        trained = int(G[f"{prefix}:trained"])
        for t in range(trained):
            r.step(phase, G[f"{prefix}:{t}:clean_ids"], G[f"{prefix}:{t}:noisy_ids"])
        streams = ("clean", "noisy") if phase.kind == "clean+noisy" else ("clean",)
        assert len(r.updates) == trained * len(streams)
        for t in range(trained):
            targets = r.targets[t]
            assert [s for s, _ in targets] == list(range(len(streams)))
            for s, name in enumerate(streams):
                key = f"{prefix}:{t}:{name}"
                theirs = G[f"{key}:labels"]  # (B, B) clean, (B, 1) noisy
                size = len(G[f"{prefix}:{t}:{name}_ids"])
                for label in targets[s][1]:  # the row-direction and the column-direction labels
                    close(f"targets:{key}", label.expand(size, size), np.broadcast_to(theirs, (size, size)))
                compare_update(key, r.updates[t * len(streams) + s])
        # their loop's length: the pairs their loaders dealt, our PlannedBatches' rule
        dealt = range(int(G[f"{prefix}:iterations"]))
        sizes = [[len(G[f"{prefix}:{t}:{kind}_ids"]) for t in dealt] for kind in ("clean", "noisy")]
        assert len(PlannedBatches([phase], [[_Stream(sizes[0]), _Stream(sizes[1])]])) == trained


class _Stream:
    """A stream's batches as PlannedBatches reads them: their sizes (the ids are the bundle's)."""

    def __init__(self, sizes):
        self.slices = [slice(0, size) for size in sizes]

    def __len__(self):
        return len(self.slices)


@pytest.mark.parametrize("soft", ["linear", "exponential", "sin"])
@pytest.mark.parametrize("layout", ["matrix", "column"])
def test_train_mode_with_their_label_shapes(soft, layout):
    """Mode "train", hardest negatives: a (B, B) label matrix (their clean batches) or (B, 1) labels
    (their noisy ones) in both directions."""
    loss = build_loss("ncr", soft_margin=soft)
    scores = torch.from_numpy(F["scores"]).clone().requires_grad_(True)
    labels = torch.from_numpy(F[f"labels_{layout}"])
    value = loss.phase_loss(Phase(0, "clean"), scores, (labels, labels))
    value.backward()
    close(f"train:{soft}:{layout}", value, F[f"train:{soft}:{layout}:loss"])
    close(f"train:{soft}:{layout}:grad", scores.grad, F[f"train:{soft}:{layout}:grad"])


def test_warmup_eval_loss_and_predict_modes():
    loss = build_loss("ncr")
    scores = torch.from_numpy(F["scores"]).clone().requires_grad_(True)
    negatives = ~torch.eye(len(scores), dtype=torch.bool)
    value = loss.phase_loss(Phase(0, "warmup"), scores, None)
    value.backward()
    close("warmup", value, F["warmup:value"])
    close("warmup:grad", scores.grad, F["warmup:grad"])
    close("eval_loss", loss.per_pair_loss(scores.detach(), negatives), F["eval_loss:value"])
    close("predict", loss.predict(scores.detach(), negatives), F["predict:value"])
    lopsided = loss.predict(torch.from_numpy(F["lopsided"]), negatives)
    close("predict:lopsided", lopsided, F["predict:lopsided"])
    assert lopsided.min() == 0 and lopsided.max() == 1


def test_split_prob_and_its_fallback():
    for name in ("some_noisy", "all_clean"):
        assert np.array_equal(split_prob(F[f"split:{name}"], 0.5), F[f"split:{name}:pred"]), name
    # every probability above the threshold: the 250 // 100-th smallest becomes it, ties included
    assert F["split:all_clean"].min() > 0.5 and (~F["split:all_clean:pred"]).sum() >= 3


def test_report_the_largest_differences():
    assert DIFFS and max(DIFFS.values()) <= RTOL
    print("largest relative differences:", {k: f"{v:.1e}" for k, v in sorted(DIFFS.items())})
