"""Networks as plug-ins (pipeline.networks.network): `vse train --network sgr|saf|FILE.py:Class`
trains, resumes exactly, evaluates and is refused in one line where it cannot run; a pairwise
network's split scores are read by every metric exactly (the (I_N, Sᵀ) factorisation)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import demo_captions, learnable_features, vse, write_feature_cache

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PAIRWISE_TRAIN = ("--epochs", 1, "--embed-dim", 16, "--word-dim", 8, "--batch-size", 16, "--lr", 5e-3,
                  "--min-word-count", 1, "--val-every", 0, "--workers", 0, "--device", "cpu",
                  "--network-option", "sim_dim=8")


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> Path:
    """40 real demo images' captions; each image a set of K = 6 learnable members (a 2 × 3 grid)."""
    ids, captions = demo_captions(40)
    caption_image = np.repeat(np.arange(40), 5)
    base = learnable_features(captions, caption_image, 40, dim=24)
    rng = np.random.default_rng(1)
    members = base[:, None, :] + 0.3 * rng.standard_normal((40, 6, 24)).astype(np.float32)
    splits = {"train": np.arange(24), "dev": np.arange(24, 32), "test": np.arange(32, 40)}
    path = tmp_path_factory.mktemp("sets") / "sets.h5"
    return write_feature_cache(path, members, captions, caption_image, splits, image_ids=ids, grid=[2, 3])


@pytest.fixture(scope="module")
def sgr_run(sets, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("sgr") / "run"
    result = vse("train", "--features", sets, "--run-dir", run, "--network", "sgr", *PAIRWISE_TRAIN)
    assert result.exit_code == 0, result.output
    return run


@pytest.fixture(scope="module")
def saf_run(sets, tmp_path_factory) -> Path:
    """An SAF run of the same folder name as sgr_run's, in a folder of its own (two sweeps' layout)."""
    run = tmp_path_factory.mktemp("saf") / "run"
    result = vse("train", "--features", sets, "--run-dir", run, "--network", "saf", *PAIRWISE_TRAIN)
    assert result.exit_code == 0, result.output
    return run


def _records(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_sgr_trains_and_evaluates(sgr_run, sets):
    (record,) = _records(sgr_run)
    assert record["epoch"] == 1 and np.isfinite(record["rsum"])
    state = torch.load(sgr_run / "best.pt", weights_only=True)
    assert state["model_config"]["network"] == "sgr" and state["model_config"]["set_size"] == 6
    assert state["model_config"]["options"] == {"sim_dim": 8}
    evaluated = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--split", "test",
                    "--json")
    assert evaluated.exit_code == 0, evaluated.output
    metrics = json.loads(evaluated.stdout)
    assert 0 <= metrics["rsum"] <= 600 and metrics["i2t_medr"] >= 1


@pytest.mark.parametrize("network", ["sgr", "saf"])
def test_a_resumed_pairwise_run_equals_an_uninterrupted_one(sets, tmp_path, network):
    """SAF's running statistics (updated once per caption) are part of the checkpoint."""
    common = ("--network", network, *PAIRWISE_TRAIN[2:], "--seed", 3, "--loss", "mh")
    straight = vse("train", "--features", sets, "--run-dir", tmp_path / "a", "--epochs", 3, *common)
    assert straight.exit_code == 0, straight.output
    first = vse("train", "--features", sets, "--run-dir", tmp_path / "b", "--epochs", 1, *common)
    assert first.exit_code == 0, first.output
    resumed = vse("train", "--run-dir", tmp_path / "b", "--resume", "--epochs", 3)
    assert resumed.exit_code == 0, resumed.output
    assert _records(tmp_path / "a") == _records(tmp_path / "b") and len(_records(tmp_path / "a")) == 3
    a, b = (torch.load(tmp_path / r / "last.pt", weights_only=True)["model"] for r in "ab")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    if network == "saf":
        assert int(a["SAF_module.bn.num_batches_tracked"]) > 0


def test_split_scores_are_the_networks_own_bit_for_bit(sgr_run, sets):
    """evaluate's metrics of a pairwise network read S through images = I_N, captions = Sᵀ:
    ``images @ captions.T`` is S exactly, and the ranks are those of S itself."""
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import load_model, score_split
    from pipeline.evaluation.metrics import evaluate_embeddings, retrieval_metrics

    loaded = load_model(sgr_run / "best.pt", torch.device("cpu"))
    with FeatureCache(sets) as cache:
        captions = loaded.captions(cache)
        split = score_split(loaded.model, cache, captions, "test", torch.device("cpu"), image_block=3,
                            caption_block=7)
        image_rows, caption_rows, caption_image = cache.split_rows("test")
        with torch.no_grad():
            images = torch.from_numpy(cache.read(image_rows)).float()
            tokens, lengths = captions.batch(caption_rows)
            direct = loaded.model(images, tokens, lengths).numpy()
    assert split.pairwise and np.abs(split.captions.T - direct).max() < 1e-6
    assert np.array_equal(split.images @ split.captions.T, split.captions.T)
    s = split.captions.T.astype(np.float64)
    truth = s[caption_image, np.arange(len(caption_image))]
    t2i = (s >= truth[None]).sum(0) - 1
    best = np.array([s[i, caption_image == i].max() for i in range(len(s))])
    i2t = np.array([((s[i] >= best[i]) & (caption_image != i)).sum() for i in range(len(s))])
    assert evaluate_embeddings(split.images, split.captions, caption_image) == retrieval_metrics(i2t, t2i)


def test_pairwise_runs_are_evaluated_as_runs(sgr_run, tmp_path):
    out = tmp_path / "results.csv"
    result = vse("evaluate", "--runs", sgr_run, "--split", "test", "--out", out)
    assert result.exit_code == 0, result.output
    import csv

    (row,) = list(csv.DictReader(out.open()))
    assert float(row["rsum"]) >= 0


def _one_line_refusal(result, *words):
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.stderr


def test_what_a_pairwise_network_cannot_do_is_refused_in_one_line(sets, sgr_run, tiny_cache, tmp_path):
    train = ("train", "--features", sets, "--run-dir", tmp_path / "r", *PAIRWISE_TRAIN)
    _one_line_refusal(vse(*train, "--network", "sgr", "--loss", "mvn"), "mvn", "score matrix")
    _one_line_refusal(vse(*train, "--network", "saf", "--image-pool", "gpo"), "--image-pool", "saf")
    _one_line_refusal(vse(*train, "--network", "sgr", "--network-option", "sim_dims=4"),
                      "no option sim_dims", "sim_dim")
    _one_line_refusal(vse(*train[:-2], "--network", "vse++", "--network-option", "sim_dim=4"),
                      "vse++ has no network options")
    _one_line_refusal(vse("train", "--features", tiny_cache, "--run-dir", tmp_path / "v", "--network", "sgr",
                          *PAIRWISE_TRAIN), "one vector per image", "--grid")
    assert not (tmp_path / "r").exists() or not (tmp_path / "r" / "last.pt").exists()
    captions = tmp_path / "captions.txt"
    captions.write_text("a dog runs\n")
    _one_line_refusal(vse("embed", sgr_run / "best.pt", "--captions", captions, "--out", tmp_path / "e.h5"),
                      "scores each image–caption pair jointly", "dual checkpoint")
    assert not (tmp_path / "e.h5").exists()
    _one_line_refusal(vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", tiny_cache,
                          "--split", "test"), "one vector per image", "sets (network sgr)")


def test_vse_infty_is_the_dual_model_with_gpo_pools(sets, tmp_path):
    result = vse("train", "--features", sets, "--run-dir", tmp_path / "r", "--network", "vse-infty",
                 *PAIRWISE_TRAIN[:-2])
    assert result.exit_code == 0, result.output
    state = torch.load(tmp_path / "r" / "best.pt", weights_only=True)
    assert "network" not in state["model_config"]  # a dual checkpoint, loaded as VSE++'s were
    assert (state["model_config"]["image_pool"], state["model_config"]["text_pool"]) == ("gpo", "gpo")


def test_a_sweep_over_networks_and_a_users_network(sets, tmp_path):
    """network is one more grid axis; a user's FILE.py:Class trains, evaluates and resumes by path."""
    from pipeline.training.sweep import load_sweep, run_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(f"runs_dir: {tmp_path / 'runs'}\nbase:\n  features: {sets}\n  epochs: 1\n  val_every: 0\n"
                    "  embed_dim: 16\n  word_dim: 8\n  batch_size: 16\n  min_word_count: 1\n  device: cpu\n"
                    f"grid:\n  network: [saf, {EXAMPLES / 'scan_network.py'}:SCANt2i]\n")  # a YAML's folder's
    sweep = run_sweep(load_sweep(path), echo=lambda *a: None, quiet_runs=True)
    assert [r.status for r in sweep.runs] == ["trained", "trained"]
    for run in sweep.runs:
        state = torch.load(run.run_dir / "best.pt", weights_only=True)
        config = json.loads((run.run_dir / "config.json").read_text())
        assert state["model_config"]["network"] == config["network"]
        evaluated = vse("evaluate", "--checkpoint", run.run_dir / "best.pt", "--features", sets, "--split",
                        "test", "--json")
        assert evaluated.exit_code == 0, evaluated.output


def test_average_with_is_the_mean_of_the_scores(sgr_run, saf_run, sets, tmp_path):
    """SGRAF's rule: the mean of two checkpoints' split scores. A checkpoint averaged with itself is
    itself; with another run its scores are the mean of the two (checked through the metrics)."""
    from pipeline.evaluation.evaluate import average_scores, embed_checkpoint
    from pipeline.evaluation.metrics import evaluate_embeddings

    cpu = torch.device("cpu")
    own = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--json")
    doubled = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--average-with", sgr_run / "best.pt",
                  "--features", sets, "--json")
    assert own.exit_code == doubled.exit_code == 0
    own, doubled = json.loads(own.stdout), json.loads(doubled.stdout)
    assert (own.pop("ensemble"), doubled.pop("ensemble")) == (1, 2) and own == doubled  # its scores, twice
    a, b = (embed_checkpoint(run / "best.pt", sets, "test", cpu) for run in (sgr_run, saf_run))
    mean = average_scores([a, b], ["a", "b"])
    expected = ((a.captions.T.astype(np.float64) + b.captions.T) / 2).astype(np.float32)
    assert np.array_equal(mean.captions.T, expected)
    assert evaluate_embeddings(mean.images, mean.captions, mean.caption_image) == \
        evaluate_embeddings(np.eye(len(expected), dtype=np.float32), expected.T.copy(), a.caption_image)
    refused = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--average-with", sgr_run / "best.pt",
                  "--features", sets, "--split", "dev", "--embeddings", "x.npz")
    assert refused.exit_code == 2


def test_average_with_runs_gives_each_run_its_partner_and_their_average(sgr_run, saf_run, sets, tmp_path):
    """`--runs A --average-with-runs DIR` pairs A with DIR/<A's folder name>: A's row, the partner's,
    then the averaged row, whose metrics are `--checkpoint A --average-with B`'s and whose config id
    is its own. A run without a partner keeps its row and its average is reported skipped."""
    import csv

    from pipeline.reports.report import seed_groups

    out = tmp_path / "results.csv"
    result = vse("evaluate", "--runs", sgr_run, "--average-with-runs", saf_run.parent, "--features", sets,
                 "--out", out)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    assert [row["run"] for row in rows] == [f"{sgr_run.parent.name}/run", f"{saf_run.parent.name}/run",
                                            f"{sgr_run.parent.name}/run + {saf_run.parent.name}/run"]
    for row, checkpoints in zip(rows, ([sgr_run], [saf_run], [sgr_run, saf_run])):
        args = ["--checkpoint", checkpoints[0] / "best.pt", "--features", sets, "--json"]
        args += [a for c in checkpoints[1:] for a in ("--average-with", c / "best.pt")]
        alone = json.loads(vse("evaluate", *args).stdout)
        assert float(row["rsum"]) == pytest.approx(alone["rsum"], abs=1e-9)
        assert float(row["i2t_r1"]) == pytest.approx(alone["i2t_r1"], abs=1e-9)
    assert len({row["config_id"] for row in rows}) == 3 and rows[2]["loss"] == rows[0]["loss"]
    assert [g.label for g in seed_groups(rows)] == [row["run"] for row in rows]

    alone = tmp_path / "elsewhere" / "other"
    alone.mkdir(parents=True)
    for name in ("best.pt", "config.json", "metrics.jsonl"):
        (alone / name).write_bytes((sgr_run / name).read_bytes())
    lonely = vse("evaluate", "--runs", alone, "--average-with-runs", saf_run.parent, "--features", sets)
    assert lonely.exit_code == 0, lonely.output
    assert f"no run other in {saf_run.parent} to average with" in lonely.stderr
    refused = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets,
                  "--average-with-runs", saf_run.parent)
    assert refused.exit_code == 2 and "--average-with-runs goes with --runs" in refused.output


@pytest.fixture(scope="module")
def dual_run(sets, tmp_path_factory) -> Path:
    """A dual network (VSE∞'s GPO pools) on the same cache: the shortlist of the pairwise runs."""
    run = tmp_path_factory.mktemp("dual") / "run"
    result = vse("train", "--features", sets, "--run-dir", run, "--network", "vse-infty",
                 *PAIRWISE_TRAIN[:-2])
    assert result.exit_code == 0, result.output
    return run


def test_a_pairwise_network_reranks_a_dual_shortlist(sgr_run, dual_run, sets):
    """k >= every candidate: every pair is scored once and the metrics are exhaustive scoring's;
    k = 3: each query's first 3 are the dual network's top 3 (re-ordered); k = 1: R@1 is the dual's."""
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.evaluate import embed_checkpoint
    from pipeline.evaluation.inference import load_model
    from pipeline.evaluation.metrics import evaluate_embeddings
    from pipeline.evaluation.shortlist import rerank_split

    cpu = torch.device("cpu")
    dual = embed_checkpoint(dual_run / "best.pt", sets, "test", cpu)
    exhaustive = embed_checkpoint(sgr_run / "best.pt", sets, "test", cpu)
    loaded = load_model(sgr_run / "best.pt", cpu)
    with FeatureCache(sets) as cache:
        captions = loaded.captions(cache)
        ranked = {k: rerank_split(loaded.model, cache, captions, "test", cpu, dual, k) for k in (40, 3, 1)}
    scores = exhaustive.captions.T  # (8, 40)
    assert ranked[40].pairs_scored == ranked[40].pairs == scores.size
    expected = evaluate_embeddings(exhaustive.images, exhaustive.captions, exhaustive.caption_image)
    assert ranked[40].metrics() == pytest.approx(expected, abs=1e-9)
    assert np.array_equal(np.argsort(-ranked[40].i2t.numpy(), axis=1, kind="stable"),
                          np.argsort(-scores.astype(np.float64), axis=1, kind="stable"))
    dual_scores = dual.images @ dual.captions.T
    top3 = np.sort(np.argsort(-dual_scores, axis=1)[:, :3], axis=1)
    assert np.array_equal(np.sort(np.argsort(-ranked[3].i2t.numpy(), axis=1)[:, :3], axis=1), top3)
    assert ranked[3].pairs_scored < scores.size
    plain = evaluate_embeddings(dual.images, dual.captions, dual.caption_image)
    one = ranked[1].metrics()
    assert (one["i2t_r1"], one["t2i_r1"]) == (plain["i2t_r1"], plain["t2i_r1"])


def test_a_shortlist_comes_first_in_pairwise_order_then_the_rest_in_dual_order():
    """Hand-made: dual scores far above the pairwise ones, k = 2. Image 0's shortlist {0, 1} is
    re-ordered by the pairwise scores (1, 0), then caption 2 by the dual score; caption 2's
    shortlist {1, 0} (dual 4 > 3) is re-ordered by the pairwise scores (0: .9 > 1: .2)."""
    from pipeline.evaluation.shortlist import rerank, shortlists

    dual = torch.tensor([[5.0, 4.0, 3.0], [3.0, 5.0, 4.0]])
    pairwise = torch.tensor([[0.1, 0.2, 0.9], [0.3, 0.1, 0.2]])
    to_captions, to_images = shortlists(dual, 2)
    assert to_captions.tolist() == [[True, True, False], [False, True, True]]
    assert to_images.tolist() == [[True, True, True], [True, True, True]]
    i2t, t2i = rerank(dual, pairwise, to_captions, to_images)
    assert torch.argsort(i2t, dim=1, descending=True).tolist() == [[1, 0, 2], [2, 1, 0]]
    assert torch.argsort(t2i, dim=0, descending=True).tolist() == [[1, 0, 0], [0, 1, 1]]
    to_captions, to_images = shortlists(dual, 1)
    i2t, _ = rerank(dual, pairwise, to_captions, to_images)
    assert torch.argsort(i2t, dim=1, descending=True).tolist() == [[0, 1, 2], [1, 2, 0]]  # the dual's order


def test_vse_evaluate_shortlist_and_its_refusals(sgr_run, dual_run, sets):
    result = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--shortlist",
                 dual_run / "best.pt", "--shortlist-k", 2, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["shortlist_k"] == 2 and 0 < out["pairs_scored"] < out["pairs"] == 8 * 40 and "rsum" in out
    swapped = vse("evaluate", "--checkpoint", dual_run / "best.pt", "--features", sets, "--shortlist",
                  sgr_run / "best.pt")
    assert swapped.exit_code == 1 and "re-ranking takes a pairwise network" in swapped.output
    both = vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--shortlist",
               sgr_run / "best.pt")
    assert both.exit_code == 1 and "the shortlist comes from a dual network" in both.output
    assert vse("evaluate", "--checkpoint", sgr_run / "best.pt", "--features", sets, "--shortlist",
               dual_run / "best.pt", "--shortlist-k", 0).exit_code == 2


def test_vsrn_is_a_dual_network_that_embed_serves(sets, tmp_path):
    run = tmp_path / "vsrn"
    result = vse("train", "--features", sets, "--run-dir", run, "--network", "vsrn", *PAIRWISE_TRAIN[:-2])
    assert result.exit_code == 0, result.output
    state = torch.load(run / "best.pt", weights_only=True)
    assert state["model_config"]["image_pool"] == "vsrn" and state["model_config"]["size_augment"] is None
    assert any(k.startswith("image_encoder.head.pool.gcn.3.") for k in state["model"])
    captions = tmp_path / "captions.txt"
    captions.write_text("a dog runs on the grass\ntwo people sit\n")
    embedded = vse("embed", run / "best.pt", "--captions", captions, "--out", tmp_path / "e.h5")
    assert embedded.exit_code == 0, embedded.output
    _one_line_refusal(vse("train", "--features", sets, "--run-dir", tmp_path / "x", "--network", "vsrn",
                          "--image-pool", "gpo", *PAIRWISE_TRAIN[:-2]), "vsrn", "drop --image-pool")


AUXILIARY = '''
import torch
from pipeline.networks.network import PairwiseNetwork


class MeanDot(PairwiseNetwork):
    """Mean member · mean word, with its own loss term: the squared norm of the image projection."""

    def __init__(self, config):
        super().__init__(config)
        self.img = torch.nn.Linear(config.feature_dim, config.embed_dim)
        self.txt = torch.nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        self.terms = {}

    def encode_images(self, images):
        return self.img(images).mean(1)

    def encode_captions(self, captions, lengths):
        words = self.txt(captions[:, :int(lengths.max())])
        return words.sum(1) / lengths[:, None]

    def score(self, image_block, caption_block):
        self.terms = {"weight_norm": 0.5 * self.img.weight.square().sum()}
        return image_block @ caption_block.T

    def auxiliary_losses(self):
        return self.terms
'''


def test_a_networks_own_loss_terms_are_trained_and_logged(sets, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plugin = tmp_path / "meandot.py"
    plugin.write_text(AUXILIARY)
    run = tmp_path / "run"
    result = vse("train", "--features", sets, "--run-dir", run, "--network", f"{plugin}:MeanDot",
                 "--loss", "sh", "--log-every", 1, *PAIRWISE_TRAIN[:-2])
    assert result.exit_code == 0, result.output
    events = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    term = [e.value for e in events.Scalars("train/aux/weight_norm")]
    loss = [e.value for e in events.Scalars("train/loss")]
    assert len(term) == len(loss) > 1 and all(t > 0 for t in term)
    assert all(total > t for total, t in zip(loss, term))  # the term is part of the logged loss


def test_compare_reads_a_pairwise_runs_ranks(sgr_run):
    result = vse("compare", sgr_run, sgr_run, "--split", "test")
    assert result.exit_code == 0, result.output
    rsum = [line.split() for line in result.output.splitlines() if line.startswith("rsum")][0]
    assert rsum[1] == rsum[2] and float(rsum[3]) == 0.0 and float(rsum[4]) == 1.0


@pytest.mark.parametrize("network, options, expected", [("sgr", {}, True), ("saf", {}, True),
                                                         ("sgr", {"score_is_sigmoid": False}, False),
                                                         ("vse++", {}, False)])
def test_the_run_tells_decl_when_the_scores_are_sigmoids(sets, tmp_path, network, options, expected):
    """Built as `vse train` builds it: decl on SGR/SAF reads their raw score as DECL's code does (a
    mutation dropping the call in build_run leaves it False and fails here); the run's own option
    wins; a dual network's cosine is read as it is."""
    from conftest import QUIET, TINY_TRAIN

    from pipeline.core.config import TrainConfig
    from pipeline.training.build import build_trainer

    extra = {"network_options": {"sim_dim": 8}} if network != "vse++" else {"image_pool": "mean"}
    config = TrainConfig(features=str(sets), run_dir=str(tmp_path / "run"), network=network, loss="decl",
                         loss_options=dict(options), **{**TINY_TRAIN, **extra})
    trainer = build_trainer(config, **QUIET)
    assert trainer.loss.score_is_sigmoid is expected
