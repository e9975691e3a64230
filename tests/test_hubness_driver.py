"""experiments/hubness.py (issue 61) on tiny runs named as the fast loop names its runs: every step's
file (each run's rows, the plain row and one row per correction, each with human judgments; results.csv;
claims.json with a verdict for each claim the runs measure; table.md with every row's mAP@R), a run not
finished left for a later call, a second call doing nothing, and a run's file whose re-scored rows have
no human metrics (written before they were judged) evaluated again."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pipeline.reports.report import read_results
from tests.conftest import train_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import hubness  # noqa: E402

SEEDS = (0, 1)
# the tiny test split has 8 images, its training split 24: the k of csls and nnn must fit them
OPTIONS = {"csls.k": 3, "nnn.k": 5}


@pytest.fixture(scope="module")
def fast(tiny_cache, tmp_path_factory):
    """A sweep folder like the fast loop's: method=mh and method=infonce, seeds 0 and 1, one epoch each;
    and method=mh,seed=2, begun but not finished (its config alone)."""
    root = tmp_path_factory.mktemp("hubness") / "fast"
    for method in ("mh", "infonce"):
        for seed in SEEDS:
            train_run(tiny_cache, root / f"method={method},seed={seed}", loss=method, seed=seed, epochs=1)
    (root / "method=mh,seed=2").mkdir()
    shutil.copy(root / "method=mh,seed=0" / "config.json", root / "method=mh,seed=2" / "config.json")
    return root


@pytest.fixture(scope="module")
def judgments(tiny_cache, tmp_path_factory):
    """CrowdFlower judgments of the tiny test split: each image's own first caption accepted, the next
    image's rejected, the one after half accepted."""
    from pipeline.data.cache import FeatureCache

    with FeatureCache(tiny_cache) as cache:
        images, _, _ = cache.split_rows("test")
        ids, keys = [cache.image_ids[r] for r in images], list(cache.index.caption_keys)
    lines = []
    for i, image in enumerate(ids):
        for shift, (yes, no) in enumerate([(3, 0), (0, 3), (2, 2)]):
            other = ids[(i + shift) % len(ids)]
            key = next(k for k in keys if k.startswith(other + "#"))
            lines.append(f"{image}\t{key}\t{yes / (yes + no):g}\t{yes}\t{no}")
    path = tmp_path_factory.mktemp("judged") / "cf.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def first_call(fast, judgments, tmp_path_factory):
    out = tmp_path_factory.mktemp("hubness_out") / "f8k_hubness"
    lines = []
    done = hubness.run(out, patterns=[f"{fast}/*"], judgments=judgments, device="cpu", options=OPTIONS,
                       echo=lines.append)
    return out, done, lines


def test_each_run_gets_its_plain_row_and_one_row_per_correction(first_call):
    out, done, _ = first_call
    names = [f"method={m},seed={s}" for m in ("infonce", "mh") for s in SEEDS]
    assert sorted(done["evaluated"]) == names
    for name in names:
        rows = read_results(out / "runs" / f"{name}.csv")
        assert [r["run"] for r in rows] == [name, *(f"{name} + {m}" for m in ("isf", "csls", "qbnorm")),
                                            f"{name} + dsl (transductive)", f"{name} + nnn"]
        assert rows[0].get("rescore") is None and all(r["rescore"] for r in rows[1:])
        assert all(r[k] is not None for r in rows for k in hubness.MAP_KEYS)  # re-scored rows too
        assert rows[2]["rescore"] == "csls k=3, bank train:24" and rows[5]["rescore"].startswith("nnn k=5")
    assert len(read_results(out / "results.csv")) == 4 * 6


def test_a_run_not_finished_is_left_for_a_later_call(first_call):
    out, done, lines = first_call
    assert done["waiting"] == ["method=mh,seed=2"] and not (out / "runs" / "method=mh,seed=2.csv").exists()
    assert "method=mh,seed=2: not finished training: left for a later call" in lines


def test_the_claims_have_verdicts_where_the_runs_measure_them(first_call):
    out, _, _ = first_call
    verdicts = json.loads((out / "claims.json").read_text())["claims"]
    # not measured here: the noisy runs (none), and the text→image hubness (a gallery of 8 images has no N_10)
    measured = [v for v in verdicts if "mh trained with" not in v["claim"] and "text→image" not in v["claim"]]
    assert len(verdicts) == 45 and len(measured) == 20
    assert all(v["verdict"] in ("holds", "reversed", "inside the seed noise") for v in measured), measured
    assert all(v["verdict"] == "not measured" for v in verdicts if v not in measured)


def test_the_table_has_a_line_per_configuration_with_its_verdict_and_cost(first_call):
    out, _, _ = first_call
    text = (out / "table.md").read_text()
    lines = [line for line in text.splitlines() if line.startswith("| method=")]
    assert [line.split(" | ")[0][2:] for line in lines] == [
        f"method={m}{suffix}" for m in ("infonce", "mh")
        for suffix in ("", " + isf", " + csls", " + qbnorm", " + dsl (transductive)", " + nnn")]
    cost = json.loads(hubness.COST.read_text())["methods"]
    qbnorm = next(line for line in lines if line.startswith("| method=mh + qbnorm |"))
    assert qbnorm.endswith(f" | {cost['qbnorm'][hubness.COST_KEY]:.2f}× |")
    claim = json.loads((out / "claims.json").read_text())["claims"]
    rsum = next(v for v in claim if v["claim"] == "QB-Norm raises the rsum of the fast loop's mh")
    assert f" | {rsum['verdict']} | " in qbnorm
    plain = next(line for line in lines if line.startswith("| method=mh |"))
    assert plain.endswith(" |  |  |")  # no claim, no cost: the raw scores
    # every line has its mAP@R cells (both directions), re-scored lines included
    at = [i for i, head in enumerate(text.splitlines()[0].split(" | ")) if head.startswith("mAP@R")]
    assert len(at) == 2 and all(line.split(" | ")[i].strip() for line in lines for i in at)


def test_a_second_call_does_nothing(first_call, fast, judgments):
    out, _, _ = first_call
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in files}
    lines = []
    done = hubness.run(out, patterns=[f"{fast}/*"], judgments=judgments, device="cpu", options=OPTIONS,
                       echo=lines.append)
    assert done["evaluated"] == [] and done["written"] == []
    assert {p: p.stat().st_mtime_ns for p in sorted(p for p in out.rglob("*") if p.is_file())} == before
    assert "nothing to do: every file is up to date" in lines


def test_a_file_without_the_rescored_rows_human_metrics_is_evaluated_again(first_call, fast, judgments,
                                                                              tmp_path):
    from pipeline.reports.report import write_results

    out = tmp_path / "f8k_hubness"
    shutil.copytree(first_call[0], out)
    old = out / "runs" / "method=mh,seed=0.csv"
    rows = read_results(old)
    write_results([r if not r.get("rescore") else {k: v for k, v in r.items() if not k.startswith("human_")}
                   for r in rows], old)
    done = hubness.run(out, patterns=[f"{fast}/*"], judgments=judgments, device="cpu", options=OPTIONS,
                       echo=lambda _: None)
    assert done["evaluated"] == ["method=mh,seed=0"] and out / "table.md" in done["written"]
    assert all(r[k] is not None for r in read_results(old) for k in hubness.MAP_KEYS)


def test_the_bank_table_sets_each_sizes_rsum_and_verdict_side_by_side(first_call, fast, judgments):
    """--bank-table: each configuration's rsum at each bank size (its own arm's results and verdicts),
    the bank each arm's rows record, and each method's cost at each size the cost bench measured; an
    arm not run yet is one VseError naming its folder."""
    from pipeline.core.errors import VseError
    from pipeline.reports.report import format_cell, seed_groups

    out = first_call[0]
    with pytest.raises(VseError, match=r"f8k_hubness_bank12: no results.csv and claims.json yet"):
        hubness.bank_table(out, sizes=(None, 12))
    small = hubness.bank_folder(12, out)
    assert small == out.parent / "f8k_hubness_bank12"
    hubness.run(small, patterns=[f"{fast}/*"], judgments=judgments, device="cpu", options=OPTIONS,
                bank_size=12, echo=lambda _: None)
    # a smaller bank's own table leaves the cost column empty: the cost bench's bank is the split's size
    qbnorm = next(line for line in (small / "table.md").read_text().splitlines()
                  if line.startswith("| method=mh + qbnorm |"))
    costs_named = f"f8k_hubness/{hubness.BANK_TABLES[1]}."
    assert qbnorm.endswith(" |  |") and costs_named in (small / "table.md").read_text()
    text = hubness.bank_table(out, sizes=(None, 12))
    head, _, *lines = text.splitlines()
    assert head == "| configuration | rsum, bank train 24 | rsum, bank train 12 |", head
    groups = [{g.label: g for g in seed_groups(read_results(folder / "results.csv"))}
              for folder in (out, small)]
    verdicts = [{v["claim"]: v["verdict"] for v in json.loads((f / "claims.json").read_text())["claims"]}
                for f in (out, small)]
    line = next(line for line in lines if line.startswith("| method=mh + csls |"))
    cells = line.strip("| ").split(" | ")[1:]
    claim = "CSLS raises the rsum of the fast loop's mh"
    for cell, group, verdict in zip(cells, [g["method=mh + csls"] for g in groups], verdicts):
        assert cell == f"{format_cell('rsum', group, 'md')}, {verdict[claim]}"
    plain = next(line for line in lines if line.startswith("| method=mh |"))
    assert "," not in plain.split(" | ")[1]  # no claim on the raw scores
    cost = json.loads(next(iter(hubness.BANK_COSTS.values())).read_text())["methods"]  # the first bank's
    nnn = cost["nnn"]
    costs = hubness.bank_cost_table()
    assert f"| nnn | {nnn['correction_over_evaluation']:.2f}× | {nnn[hubness.COST_KEY]:.2f}× |" in costs
    with pytest.raises(VseError, match="nowhere.json: not measured yet"):
        hubness.bank_cost_table({"1": hubness.COST, "2": small / "nowhere.json"})


def test_a_run_below_the_current_folder_is_named_from_it(tmp_path, monkeypatch):
    """The rows' checkpoint column names a run from the repository (the folder `make` runs in), not
    from this machine's root; a run elsewhere stays absolute."""
    (tmp_path / "runs" / "a").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hubness.as_given(tmp_path / "runs" / "a") == Path("runs/a")
    assert hubness.as_given(Path("runs/a")) == Path("runs/a")
    assert hubness.as_given(tmp_path.parent) == tmp_path.parent.resolve()


def test_the_committed_bank_tables_are_fresh_renderings_of_their_files():
    """bench/results/f8k_hubness/bank_sizes.md and bank_costs.md are what --bank-table makes of the
    committed arms' results and claims and the cost benches' JSON (no stale copy)."""
    made = (hubness.bank_table(), hubness.bank_cost_table())
    for name, text in zip(hubness.BANK_TABLES, made):
        assert (hubness.OUT / name).read_text(encoding="utf-8") == text, name
