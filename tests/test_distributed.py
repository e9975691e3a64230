"""torchrun with 2 CPU processes (gloo): one step of N processes × B equals one step of a single
process on the concatenated batch of N×B, for every loss and in RC mode; only rank 0
writes; a killed distributed run resumes exactly; `torchrun -m cli.main train` works."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rc_data import make_flickr8k

from pipeline.core.checkpoint import load_checkpoint
from pipeline.core.config import TrainConfig
from pipeline.data.caption_features import encode_text
from pipeline.relevance.stage import build_relevance
from pipeline.training.build import build_trainer

pytestmark = pytest.mark.slow  # processes, real images or servers: `pytest -m "not slow"` skips them

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
PER_RANK = 8
# fp32 everywhere (every CPU's default), so DDP's gradients are compared with one process's to fp32
# rounding
SMALL = dict(embed_dim=16, word_dim=8, lr=5e-3, min_word_count=1, val_every=0, workers=0, log_every=1,
             device="cpu")
CACHED_LOSSES = {
    "sh": {"loss": "sh"},
    "mh": {"loss": "mh"},
    "mh_negative_set": {"loss": "mh", "loss_options": {"negative_set_size": 3}},  # random negatives
    "order": {"loss": "order"},
    "lseh": {"loss": "lseh"},
    "ladder": {"loss": "ladder", "loss_options": {"levels": 3}},
    "csn": {"loss": "csn"},
    "cmn": {"loss": "cmn"},
    "mvn": {"loss": "mvn"},
    "infonce": {"loss": "infonce"},  # a learned logit scale (clamped after each step)
    "siglip": {"loss": "siglip"},    # a learned scale and bias
    "rcl": {"loss": "rcl"},
    "crcl": {"loss": "crcl"},        # per-caption labels, updated alike by every rank (the global batch)
    "decl": {"loss": "decl"},        # the epoch's pass over every pair, shared by the ranks
    "poly": {"loss": "poly"},        # the hardest negative of the global batch, / its size
    "selhn": {"loss": "selhn"},      # the mean or the max of each query's hinges
    "pcme": {"loss": "pcme"},        # Gaussian embeddings, sampled; a learned shift and scale
    "pcmepp": {"loss": "pcmepp"},    # the closed-form sampled distance
    # a plug-in with a parameter of its own (a learnable temperature)
    "plugin": {"loss": str(ROOT / "examples" / "infonce_learnable_tau.py") + ":LearnableTemperatureInfoNCE"},
}


# a pairwise network under torchrun: each rank's batch is its own negatives (ncr's two networks are one
# pairwise network), and DDP averages the ranks' gradients
LOCAL_BATCH_CASES = {"ncr": {"loss": "ncr"}, "bicro": {"loss": "bicro"}}


def torchrun(args, timeout=900):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={WORLD}", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"torchrun failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


@pytest.fixture(scope="module")
def launched(tiny_cache, tmp_path_factory):
    """One torchrun launch: the one-step cases, the kill/resume runs and an RC run by the CLI."""
    out = tmp_path_factory.mktemp("ddp")
    relevance = out / "svd.h5"
    build_relevance(tiny_cache, "svd", relevance, k=16, device="cpu")
    text = out / "cbow_text.h5"  # cached caption features: a head over frozen vectors, no GRU
    encode_text(tiny_cache, "cbow", text, device="cpu")
    images = make_flickr8k(out / "flickr8k", sizes=(("train", 8), ("dev", 2), ("test", 2)))
    cached = {name: dict(features=str(tiny_cache), relevance=str(relevance), **SMALL, **extra)
              for name, extra in CACHED_LOSSES.items()}
    local = {f"local_{name}": dict(features=str(tiny_cache), **SMALL, **extra)
             for name, extra in LOCAL_BATCH_CASES.items()}
    rc = {f"rc_{mode}": dict(rc=True, root=str(images), backbone="tiny", loss="mh",
                             finetune=mode == "finetune", **SMALL) for mode in ("frozen", "finetune")}
    text_case = {"text_features_mh": dict(features=str(tiny_cache), text_features=str(text), loss="mh",
                                          **SMALL)}
    # no gradient clipping here: it would hide a gradient of the wrong scale
    steps = {name: {**config, "run_dir": str(out / name), "batch_size": PER_RANK, "grad_clip": 0.0}
             for name, config in {**cached, **rc, **text_case, **local}.items()}
    # 120 training captions / (2 × 8) = 7 global batches per epoch; a checkpoint every 3 steps
    resume = dict(features=str(tiny_cache), loss="mh", epochs=2, lr_decay_epoch=1, batch_size=PER_RANK,
                  **{**SMALL, "val_every": 3})
    spec = out / "spec.json"
    command = ["train", "--rc", "--root", str(images), "--backbone", "tiny", "--finetune", "--run-dir",
               str(out / "cli"), "--epochs", "1", "--batch-size", "4", "--embed-dim", "16", "--word-dim", "8",
               "--min-word-count", "1", "--val-every", "0", "--workers", "1", "--device", "cpu"]
    # a pairwise network's whole run: its validations share the score blocks over the ranks
    fits = {"fit_ncr": dict(features=str(tiny_cache), loss="ncr", epochs=1, batch_size=PER_RANK, **SMALL)}
    # `vse evaluate` of that run's checkpoint: its score blocks shared by the ranks, reported by rank 0
    evaluate = [["evaluate", "--runs", str(out / "fit_ncr"), "--checkpoint-name", "last.pt", "--split", "dev",
                 "--out", str(out / "eval.csv"), "--device", "cpu"],
                ["evaluate", "--checkpoint", str(out / "fit_ncr" / "last.pt"), "--features", str(tiny_cache),
                 "--split", "dev", "--json", "--device", "cpu"]]
    spec.write_text(json.dumps({"steps": steps, "fits": fits, "resume": {"config": resume, "kill_after": 10},
                                "cli": [command, *evaluate]}))
    launch = torchrun(["tests/distributed_worker.py", str(spec), str(out)])
    ranks = [torch.load(out / f"steps-rank{r}.pt", weights_only=True) for r in range(WORLD)]
    return {"out": out, "steps": steps, "ranks": ranks, "resume": resume, "launch": launch}


def _single_process_step(config: dict) -> dict:
    """The same step by one process on the concatenated batch (WORLD × PER_RANK pairs)."""
    trainer = build_trainer(TrainConfig(**{**config, "batch_size": WORLD * PER_RANK}),
                                  echo=lambda *a: None)
    loss = trainer.step(trainer.epoch_batches(0)[0])
    named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    named += [(f"loss.{n}", p) for n, p in trainer.loss.named_parameters() if p.requires_grad]
    return {"loss": loss, "grads": {n: p.grad for n, p in named},
            "weights": {n: p.detach() for n, p in named}}


@pytest.mark.parametrize("case", [*CACHED_LOSSES, "rc_frozen", "rc_finetune", "text_features_mh"])
def test_distributed_step_equals_one_process_on_the_global_batch(launched, case, tmp_path):
    expected = _single_process_step({**launched["steps"][case], "run_dir": str(tmp_path)})
    for rank, results in enumerate(launched["ranks"]):
        got = results[case]
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-6), rank
        assert set(got["grads"]) == set(expected["grads"])
        for name, grad in expected["grads"].items():  # float32 sums in another order
            error = (got["grads"][name] - grad).norm() / grad.norm().clamp_min(1e-12)
            assert error < 1e-4, (case, name, rank, error.item())
        for name, weight in expected["weights"].items():  # Adam's first step moves each weight by ≈ lr
            # · sign(grad): where a gradient is at float32's summation noise (another order of sums,
            # another thread count) its sign, and so a 2·lr move, is noise too; compare the rest
            grad = expected["grads"][name]
            settled = grad.abs() > 1e-5 * grad.abs().max()
            torch.testing.assert_close(got["weights"][name][settled], weight[settled], rtol=0, atol=1e-5,
                                       msg=f"{case} {name}")
    if case == "rc_finetune":
        assert any(name.startswith("image_encoder.backbone.") for name in expected["grads"])
    if case == "rc_frozen":
        assert not any(name.startswith("image_encoder.backbone.") for name in expected["grads"])


@pytest.mark.parametrize("case", [f"local_{name}" for name in LOCAL_BATCH_CASES])
def test_a_pairwise_step_under_torchrun_averages_the_ranks_local_batches(launched, case, tmp_path):
    """One process, from the same weights: rank r's loss is the loss of its own local batch, and the
    step's gradient is the mean of the ranks' local-batch gradients (then the same Adam step)."""
    config = {**launched["steps"][case], "run_dir": str(tmp_path)}
    trainer = build_trainer(TrainConfig(**config), echo=lambda *a: None)
    pairs = trainer.epoch_batches(0)  # batch r is rank r's part of the first global batch
    named = [(n, p) for n, p in trainer.model.named_parameters() if p.requires_grad]
    mean = {n: torch.zeros_like(p) for n, p in named}
    losses = []
    for r in range(WORLD):
        trainer.optimizer.zero_grad(set_to_none=True)
        batch = pairs[r]
        loss = trainer._pairwise_loss(trainer.model(batch.images, *batch.captions), batch)
        loss.backward()
        losses.append(loss.item())
        for n, p in named:
            mean[n] += p.grad / WORLD
    for n, p in named:
        p.grad = mean[n].clone()
    trainer.optimizer.step()
    for rank, results in enumerate(launched["ranks"]):
        got = results[case]
        assert got["loss"] == pytest.approx(losses[rank], rel=1e-5, abs=1e-6), rank
        for name, grad in mean.items():
            error = (got["grads"][name] - grad).norm() / grad.norm().clamp_min(1e-12)
            assert error < 1e-4, (case, name, rank, error.item())
        for name, p in named:
            torch.testing.assert_close(got["weights"][name], p.detach(), rtol=0, atol=1e-5,
                                       msg=f"{case} {name}")


@pytest.mark.parametrize("case", ["decl", "local_ncr"])
def test_the_pass_over_every_pair_is_shared_by_the_ranks_and_whole_on_each(launched, case, tmp_path):
    """decl's and ncr's look at every training pair before an epoch: the ranks take turns with its
    fixed cache-order batches, and each ends with the array one process makes (same weights)."""
    trainer = build_trainer(TrainConfig(**{**launched["steps"][case], "run_dir": str(tmp_path)}),
                            echo=lambda *a: None)
    expected = trainer.sample_statistics()
    assert expected.shape[1] == len(trainer.train_captions)
    for rank, results in enumerate(launched["ranks"]):
        got = results[case]["statistics"].numpy()
        assert got.shape == expected.shape, rank
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=f"{case} rank {rank}")


def test_a_pairwise_networks_score_blocks_are_shared_by_the_ranks(launched, tmp_path):
    """score_split under torchrun (validation of a pairwise network): blocks of 3 images dealt to
    2 ranks (8 dev images: blocks 0, 2 on rank 0, 1 on rank 1), each rank ends with the whole
    matrix one process computes from the same weights."""
    from pipeline.evaluation.inference import score_split

    trainer = build_trainer(TrainConfig(**{**launched["steps"]["local_ncr"], "run_dir": str(tmp_path)}),
                            echo=lambda *a: None)
    split = score_split(trainer.model, trainer.index, trainer.captions, "dev", trainer.device,
                        image_block=3, caption_block=16)
    expected = torch.from_numpy(split.captions.T.copy())
    assert expected.shape == (8, 40)
    for rank, results in enumerate(launched["ranks"]):
        torch.testing.assert_close(results["local_ncr"]["scores"], expected, rtol=0, atol=1e-6,
                                   msg=f"rank {rank}")


def test_a_pairwise_run_under_torchrun_validates_as_one_process_would(launched, tiny_cache):
    """The record of the run's last validation (blocks shared by 2 ranks) equals one process's
    evaluation of the checkpoint saved with it."""
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import encode_split, load_model
    from pipeline.evaluation.metrics import evaluate_embeddings

    run = launched["out"] / "fit_ncr"
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    loaded = load_model(run / "last.pt", torch.device("cpu"))
    cache = FeatureCache(tiny_cache)
    emb = encode_split(loaded.model, cache, loaded.captions(cache), "dev", torch.device("cpu"))
    metrics = evaluate_embeddings(emb.images, emb.captions, emb.caption_image, similarity=emb.similarity)
    assert emb.pairwise and len(emb.image_rows) == 8
    for name in ("rsum", "i2t_r1", "t2i_r1", "i2t_meanr", "t2i_meanr"):
        assert record[name] == pytest.approx(metrics[name], abs=1e-6), name


def test_vse_evaluate_under_torchrun_reports_once_what_one_process_computes(launched, tiny_cache):
    """`torchrun -m cli.main evaluate` of a pairwise checkpoint: the ranks share its score blocks
    (score_split, tested above), rank 0 alone prints the table or the JSON and writes --out, and
    the numbers are one process's. Both ranks printing would show two JSON lines."""
    import csv

    from conftest import vse

    run = launched["out"] / "fit_ncr"
    alone = vse("evaluate", "--checkpoint", run / "last.pt", "--features", tiny_cache, "--split", "dev",
                "--json", "--device", "cpu")
    assert alone.exit_code == 0, alone.output
    expected = json.loads(alone.stdout)
    printed = [json.loads(line) for line in launched["launch"].stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1, launched["launch"].stdout[-2000:]
    rows = list(csv.DictReader((launched["out"] / "eval.csv").open()))
    assert len(rows) == 1 and launched["launch"].stderr.count("1 of 1 runs evaluated") == 1
    for name in ("rsum", "i2t_r1", "t2i_r1", "i2t_meanr", "t2i_meanr"):
        assert printed[0][name] == pytest.approx(expected[name], abs=1e-6), name
        assert float(rows[0][name]) == pytest.approx(expected[name], abs=1e-6), name


def test_killed_distributed_run_resumes_exactly_and_only_rank_0_writes(launched):
    out = launched["out"]
    full, cut = (load_checkpoint(out / run / "last.pt") for run in ("full", "cut"))
    assert full["iteration"] == cut["iteration"] == 14  # 2 epochs × 7 global batches (last one dropped)
    for key, value in full["model"].items():
        assert torch.equal(value, cut["model"][key]), key
    lines = [json.loads(line) for line in (out / "full" / "metrics.jsonl").read_text().splitlines()]
    # validations at iterations 3, 6, 7 (epoch end), 9, 12, 14 (epoch end) — once each, not once per rank
    assert [r["iteration"] for r in lines] == [3, 6, 7, 9, 12, 14]
    assert full["train_config"]["batch_size"] == PER_RANK
    assert sorted(p.name for p in (out / "full").iterdir()) == [
        "best.pt", "code.json", "config.json", "last.pt", "metrics.jsonl", "tb", "vocab.json"]
    # one event file per start of the run, rank 0's only: the killed run was started twice
    assert [len(list((out / run / "tb").iterdir())) for run in ("full", "cut")] == [1, 2]


def test_vse_train_under_torchrun_trains_rc_mode(launched):
    run = launched["out"] / "cli"
    state = load_checkpoint(run / "last.pt")
    assert state["iteration"] == 5  # 40 training pairs / (2 × 4)
    assert state["backbone"]["finetune"] is True
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1


def test_every_built_in_loss_is_stepped_under_torchrun():
    from pipeline.losses.base import LOSS_NAMES

    # ncr trains two networks as one pairwise network: under torchrun each rank's batch is its own
    # negatives, so a 2-process step is not one global-batch step (docs/PROTOCOL.md, "ncr")
    assert set(LOSS_NAMES) - set(LOCAL_BATCH_CASES) <= {case["loss"] for case in CACHED_LOSSES.values()}
