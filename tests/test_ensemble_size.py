"""Ensemble size is part of the protocol (issue 59): every result records how many networks' scores it
averages (ncr's two co-trained networks: 2; `--average-with`: the sum; one network: 1), a co-trained
run's network is evaluated alone with `--member K`, `vse report` labels the rows and keeps the sizes
apart, and `vse compare` and `vse claims` refuse to compare different sizes unless asked by name."""

import csv
import json

import numpy as np
import pytest
import torch

from pipeline.reports.claims import load_claims, run_claims
from pipeline.reports.report import config_key, read_results, row_ensemble, seed_groups
from tests.conftest import train_run, vse


@pytest.fixture(scope="module")
def runs(tiny_cache, tmp_path_factory):
    """RUNS/ncr (two co-trained networks, one warm-up epoch then one of co-training) and RUNS/sh."""
    root = tmp_path_factory.mktemp("ensemble") / "runs"
    train_run(tiny_cache, root / "ncr", loss="ncr", epochs=2, batch_size=8,
              loss_options={"warmup_epochs": 1})
    train_run(tiny_cache, root / "sh", loss="sh", epochs=1, batch_size=8)
    return root


def evaluated(*args) -> dict:
    result = vse("evaluate", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def json_of(output: str) -> dict:
    """The JSON object `vse compare --json` prints (after the progress lines of standard error)."""
    return json.loads(output[output.index("{\n"):])


def metrics_of(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("ensemble", "member")}


def test_a_co_trained_checkpoint_records_two_and_its_member_one_with_its_own_numbers(runs, tiny_cache):
    whole = evaluated("--checkpoint", runs / "ncr" / "best.pt", "--features", tiny_cache)
    alone = evaluated("--checkpoint", runs / "ncr" / "best.pt", "--features", tiny_cache, "--member", 0)
    other = evaluated("--checkpoint", runs / "ncr" / "best.pt", "--features", tiny_cache, "--member", 1)
    assert whole["ensemble"] == 2 and "member" not in whole
    assert (alone["ensemble"], alone["member"]) == (1, 0) and (other["ensemble"], other["member"]) == (1, 1)
    assert metrics_of(alone) != metrics_of(whole) and metrics_of(alone) != metrics_of(other)


def test_the_member_scores_are_that_network_alone_and_their_mean_the_whole(runs, tiny_cache):
    from pipeline.data.cache import FeatureCache
    from pipeline.evaluation.inference import embed_member, encode_split, load_model

    cpu = torch.device("cpu")
    checkpoint = runs / "ncr" / "best.pt"
    with FeatureCache(tiny_cache) as cache:
        loaded = load_model(checkpoint, cpu)
        whole = encode_split(loaded.model, cache, loaded.captions(cache), "test", cpu)
        members = [embed_member(checkpoint, cache, "test", cpu, k) for k in (0, 1)]
        captions = loaded.captions(cache)
        network = loaded.model.members[0].eval()
        with torch.no_grad():
            img = network.image_encoder(torch.from_numpy(cache.read(whole.image_rows)).float())
            cap = captions.embed(network.text_encoder, whole.caption_rows, cpu)
    scores = [m.images @ m.captions.T for m in members]  # a dual copy: its own embeddings
    np.testing.assert_allclose(scores[0], (img @ cap.T).numpy(), atol=1e-6)
    assert not np.allclose(scores[0], scores[1], atol=1e-4)
    np.testing.assert_allclose(whole.captions.T, (scores[0] + scores[1]) / 2, atol=1e-6)  # I_N, S^T


def test_one_network_records_one_and_an_average_the_sum(runs, tiny_cache):
    sh, ncr = runs / "sh" / "best.pt", runs / "ncr" / "best.pt"
    assert evaluated("--checkpoint", sh, "--features", tiny_cache)["ensemble"] == 1
    assert evaluated("--checkpoint", sh, "--features", tiny_cache, "--average-with", sh)["ensemble"] == 2
    assert evaluated("--checkpoint", ncr, "--features", tiny_cache, "--average-with", sh)["ensemble"] == 3
    table = vse("evaluate", "--checkpoint", ncr, "--features", tiny_cache, "--member", 0)
    assert table.exit_code == 0 and "(network 0 alone)" in table.output.splitlines()[0]


def test_the_size_is_read_from_the_checkpoints_as_they_are_embedded(runs, tiny_cache, monkeypatch):
    """Each checkpoint file is read once: the ensemble size comes with its embeddings, not from a
    second reading of every checkpoint (a large file on a GPU run)."""
    import torch

    read = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: (read.append(str(f)), load(f, *a, **k))[1])
    sh, ncr = runs / "sh" / "best.pt", runs / "ncr" / "best.pt"
    assert evaluated("--checkpoint", ncr, "--features", tiny_cache, "--average-with", sh)["ensemble"] == 3
    assert sorted(read) == sorted([str(ncr), str(sh)]), read


@pytest.mark.parametrize("member, says", [(None, "holds one network"), (2, "networks 0 to 1")])
def test_a_member_that_is_not_there_is_refused_in_one_line(runs, tiny_cache, member, says):
    run = runs / ("sh" if member is None else "ncr")
    result = vse("evaluate", "--checkpoint", run / "best.pt", "--features", tiny_cache,
                 "--member", member or 0)
    assert result.exit_code == 1 and says in result.output and str(run / "best.pt") in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_member_does_not_go_with_averaging(runs, tiny_cache):
    result = vse("evaluate", "--checkpoint", runs / "ncr" / "best.pt", "--features", tiny_cache,
                 "--member", 0, "--average-with", runs / "sh" / "best.pt")
    assert result.exit_code == 2 and "--member goes with" in result.output


@pytest.fixture(scope="module")
def results(runs, tmp_path_factory):
    """`vse evaluate --runs RUNS/* --member 0 --out results.csv`: ncr, ncr's network 0, sh."""
    out = tmp_path_factory.mktemp("results") / "results.csv"
    result = vse("evaluate", "--runs", f"{runs}/*", "--member", 0, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def test_runs_member_puts_the_single_network_row_beside_the_ensemble_row(results):
    rows = {row["run"]: row for row in csv.DictReader(open(results, encoding="utf-8"))}
    assert list(rows) == ["ncr", "ncr,member=0", "sh"]  # a run of one network: its row only
    assert [(rows[r]["ensemble"], rows[r]["member"]) for r in rows] == [("2", ""), ("1", "0"), ("1", "")]
    assert rows["ncr"]["rsum"] != rows["ncr,member=0"]["rsum"] or rows["ncr"]["i2t_meanr"] != \
        rows["ncr,member=0"]["i2t_meanr"]
    assert rows["ncr"]["config_id"] == rows["ncr,member=0"]["config_id"]  # one training ...
    assert rows["ncr"]["evaluation_id"] != rows["ncr,member=0"]["evaluation_id"]  # ... two evaluations
    read = read_results(results)
    assert len({config_key(row) for row in read}) == 3 and len(seed_groups(read)) == 3


def test_runs_member_rows_are_kept_when_unchanged(runs, results, tmp_path):
    copy = tmp_path / "results.csv"
    copy.write_bytes(results.read_bytes())
    again = vse("evaluate", "--runs", f"{runs}/*", "--member", 0, "--out", copy, "--keep-evaluated")
    assert again.exit_code == 0 and "(3 kept from" in again.output
    assert [r["run"] for r in read_results(copy)] == ["ncr", "ncr,member=0", "sh"]


def test_report_labels_the_ensemble_rows(results):
    table = vse("report", results, "--columns", "recall", "--per-run")
    assert table.exit_code == 0, table.output
    labels = [line.split(" | ")[0][2:] for line in table.output.splitlines()[2:5]]
    labels = [label.replace(" (at chance: see below)", "") for label in labels]  # tiny runs learn little
    assert labels == ["ncr (2 networks)", "ncr,member=0", "sh"]
    assert "the rows differ in it: compare at equal size" in table.output


def test_report_infers_the_size_of_rows_evaluated_before_it_was_recorded():
    assert row_ensemble({"run": "method=ncr,seed=0", "loss": "ncr"}) == 2  # its loss trains 2 networks
    assert row_ensemble({"run": "sgr/method=mh + saf/method=mh", "loss": "mh"}) == 2  # SGRAF: an average
    assert row_ensemble({"run": "mh,seed=0", "loss": "mh"}) == 1
    assert row_ensemble({"run": "x", "loss": "ncr", "ensemble": 1}) == 1  # recorded: as recorded
    assert config_key({"run": "a,seed=0", "loss": "ncr"}) != config_key({"run": "a,seed=0", "loss": "ncr",
                                                                         "ensemble": 1})


def test_compare_two_runs_refuses_other_sizes_unless_asked(runs):
    refused = vse("compare", runs / "ncr", runs / "sh")
    assert refused.exit_code == 1 and "ensembles of different size" in refused.output
    assert "--across-ensemble" in refused.output and len(refused.output.strip().splitlines()) == 1
    across = vse("compare", runs / "ncr", runs / "sh", "--across-ensemble", "--json", "--permutations", 100)
    assert across.exit_code == 0, across.output
    assert json_of(across.output)["ensemble"] == [2, 1]
    member = vse("compare", runs / "ncr", runs / "sh", "--member", 0, "--json", "--permutations", 100)
    assert member.exit_code == 0, member.output
    assert json_of(member.output)["ensemble"] == [1, 1] and json_of(member.output)["member"] == [0, None]


def test_compare_groups_refuses_other_sizes_unless_asked(runs, results):
    refused = vse("compare", runs / "ncr", runs / "sh", "--results", results)
    assert refused.exit_code == 1 and "ensembles of different size" in refused.output
    across = vse("compare", runs / "ncr", runs / "sh", "--results", results, "--across-ensemble", "--json")
    assert across.exit_code == 0, across.output
    assert [g["ensemble"] for g in json_of(across.output)["groups"].values()] == [2, 1]
    member = vse("compare", runs / "ncr", runs / "sh", "--results", results, "--member", 0, "--json")
    assert member.exit_code == 0, member.output
    assert list(json_of(member.output)["groups"].values())[0]["runs"] == ["ncr,member=0"]


CLAIMS = """results: results.csv
claims:
  - claim: ncr beats mh
    better: ncr
    worse: mh
    metric: rsum{across}
"""


def _claims_file(tmp_path, rows, across=""):
    with open(tmp_path / "results.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "loss", "seed", "ensemble", "rsum"])
        writer.writerows(rows)
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIMS.format(across=across), encoding="utf-8")
    return path


def test_claims_refuse_other_sizes_unless_the_claim_says_across_ensemble(tmp_path):
    rows = [[f"ncr,seed={s}", "ncr", s, 2, 300 + s] for s in range(3)]
    rows += [[f"mh,seed={s}", "mh", s, 1, 280 + s] for s in range(3)]
    [refused] = run_claims(load_claims(_claims_file(tmp_path, rows)))["claims"]
    assert refused["verdict"].startswith("not compared: ensembles of different size")
    assert "across_ensemble: true" in refused["verdict"]
    [across] = run_claims(load_claims(_claims_file(tmp_path, rows, "\n    across_ensemble: true")))["claims"]
    assert across["verdict"] == "holds" and across["ensemble"] == {"ncr": 2, "mh": 1}
    equal = [[r[0], r[1], r[2], 1, r[4]] for r in rows]  # ncr's network alone against mh: compared
    [same] = run_claims(load_claims(_claims_file(tmp_path, equal)))["claims"]
    assert same["verdict"] == "holds" and "ensemble" not in same


def test_claims_refuse_a_table_that_predates_the_column_by_the_methods_size(tmp_path):
    rows = [[f"ncr,seed={s}", "ncr", s, "", 300 + s] for s in range(3)]  # ncr's size read from ncr
    rows += [[f"mh,seed={s}", "mh", s, "", 280 + s] for s in range(3)]
    [refused] = run_claims(load_claims(_claims_file(tmp_path, rows)))["claims"]
    assert refused["verdict"].startswith("not compared: ensembles of different size")


def test_a_claims_across_ensemble_must_be_true_or_false(tmp_path):
    from pipeline.core.errors import VseError

    with pytest.raises(VseError, match="across_ensemble: true or false"):
        load_claims(_claims_file(tmp_path, [], "\n    across_ensemble: yes please"))


def test_a_run_read_in_two_tables_is_one_seed(tmp_path):
    from pipeline.reports.claims import read_tables

    header = ["run", "loss", "seed", "checkpoint_sha256", "evaluation_id", "rsum"]
    rows = [["mh,seed=0", "mh", 0, "aaa", "e1", 280.0], ["mh,seed=1", "mh", 1, "bbb", "e1", 281.0]]
    for name, part in (("a.csv", rows), ("b.csv", rows[:1] + [["mh,seed=1", "mh", 1, "bbb", "e2", 282.0]])):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([header, *part])
    read = read_tables([tmp_path / "a.csv", tmp_path / "b.csv"])
    assert [row["rsum"] for row in read] == [280.0, 281.0, 282.0]  # seed 1 evaluated otherwise: kept


def test_the_recipe_of_noisy_equal_size_makes_the_rows_its_claims_name(runs, tiny_cache, tmp_path):
    """noisy_equal_size.yaml's commands on tiny runs named as the noisy sweep names them: each claim
    of the clean setting finds both its sides (one seed each here: not testable, not 'not measured')."""
    import shutil
    from dataclasses import replace

    from pipeline.reports.claims import CLAIMS_DIR

    sweep, pairs = tmp_path / "noisy", tmp_path / "pairs"
    shutil.copytree(runs / "ncr", sweep / "noise=clean,method=ncr,seed=0")
    shutil.copytree(runs / "sh", sweep / "noise=clean,method=mh,seed=0")
    train_run(tiny_cache, sweep / "noise=clean,method=mh,seed=3", loss="sh", epochs=1, batch_size=8, seed=3)
    pairs.mkdir()
    (pairs / "noise=clean,method=mh,seed=0").symlink_to(sweep / "noise=clean,method=mh,seed=3")
    results, paired = tmp_path / "results.csv", tmp_path / "results_pairs.csv"
    made = vse("evaluate", "--runs", f"{sweep}/*", "--member", 0, "--out", results)
    assert made.exit_code == 0, made.output
    made = vse("evaluate", "--runs", f"{sweep}/*method=mh,seed=[012]", "--average-with-runs", pairs,
               "--out", paired)
    assert made.exit_code == 0, made.output
    spec = replace(load_claims(CLAIMS_DIR / "noisy_equal_size.yaml"), results=[results, paired])
    verdicts = {c["claim"]: c["verdict"] for c in run_claims(spec, tmp_path / "claims.json")["claims"]}
    clean = {claim: verdict for claim, verdict in verdicts.items() if claim.endswith("without noise")}
    assert clean == {"one of ncr's networks beats one network of mh without noise":
                     "not testable: 1 and 2 seeds (one seed is an anecdote)",
                     "ncr's two networks beat two seeds of mh averaged without noise":
                     "not testable: 1 and 1 seeds (one seed is an anecdote)",
                     # no bicro run here: its claims name rows that are not there
                     "one of bicro's networks beats one network of mh without noise": "not measured",
                     "bicro's two networks beat two seeds of mh averaged without noise": "not measured"}
