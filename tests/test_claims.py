"""bench/f8k_claims.py: the verdict of a paper's claim from a results table over seeds."""

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import f8k_claims  # noqa: E402

COLUMNS = ["run", "loss", "seed", "epochs", "epochs_to_best", "rsum"]


def write_results(path: Path, rows) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def verdicts(path: Path) -> dict:
    return {c["claim"]: c["verdict"] for c in f8k_claims.main(str(path), "fast")["claims"]}


LSEH_FASTER = "LSEH reaches its best in fewer epochs than VSE++"
LSEH_RSUM = "LSEH beats VSE++ on rsum"


def test_clear_gap_holds_and_equal_rows_are_noise(tmp_path):
    rows = [[f"mh,seed={s}", "mh", s, 6, 5 + s % 2, 280 + s] for s in range(3)]
    rows += [[f"lseh,seed={s}", "lseh", s, 6, 2 + s % 2, 300 + s] for s in range(3)]
    out = verdicts(write_results(tmp_path / "r.csv", rows))
    assert out[LSEH_RSUM] == "holds"            # +20 with a spread of 1
    assert out[LSEH_FASTER] == "holds"          # 2-3 epochs against 5-6
    assert out["VSE++ (max of hinges) beats VSE0 (sum of hinges)"] == "not measured"  # no sh rows


def test_epochs_to_best_is_not_measurable_when_every_run_peaked_last(tmp_path):
    rows = [[f"{loss},seed={s}", loss, s, 3, 3, 280 + s] for loss in ("mh", "lseh") for s in range(3)]
    out = verdicts(write_results(tmp_path / "r.csv", rows))
    assert out[LSEH_FASTER].startswith("not measurable")
    assert out[LSEH_RSUM] == "inside the seed noise"


@pytest.mark.parametrize("last", [3, 4])
def test_one_run_that_peaked_early_makes_it_measurable(tmp_path, last):
    rows = [[f"{loss},seed={s}", loss, s, 4, 4, 280 + s] for loss in ("mh", "lseh") for s in range(3)]
    rows[3][4] = last  # lseh seed 0
    out = verdicts(write_results(tmp_path / "r.csv", rows))
    assert out[LSEH_FASTER].startswith("not measurable") == (last == 4)


def test_one_seed_is_not_tested(tmp_path):
    rows = [[f"mh,seed={s}", "mh", s, 6, 5, 280 + s] for s in range(3)]
    rows += [["lseh,seed=0", "lseh", 0, 6, 2, 330]]  # far above, but one run
    out = verdicts(write_results(tmp_path / "r.csv", rows))
    assert out[LSEH_RSUM] == "not testable: 1 and 3 seeds (one seed is an anecdote)"


@pytest.mark.parametrize("claim_set,sgr_dir,saf_dir,schedule", [
    ("sgraf_short", "sgr_short", "saf_short", "one epoch"),
    ("sgraf_bf16", "sgraf_bf16_sgr", "sgraf_bf16_saf", "two epochs"),  # make f8k-sgraf-bf16's folders
])
def test_the_sgraf_claims_find_each_network_and_the_average_by_its_run_names(tmp_path, claim_set, sgr_dir,
                                                                             saf_dir, schedule):
    """`vse evaluate --runs 'sgr_short/*' --average-with-runs saf_short` names its rows
    ``sgr_short/method=M,seed=S``, ``saf_short/...`` and ``A + B``: each network's claim reads its own."""
    rows = []
    for s in range(3):
        for method, gap in (("mh", 0), ("lseh-svd", 1)):
            sgr, saf = f"{sgr_dir}/method={method},seed={s}", f"{saf_dir}/method={method},seed={s}"
            loss = "lseh" if gap else "mh"
            rows += [[sgr, loss, s, 1, 1, 100 + s + 50 * gap],             # SGR: LSEH far above
                     [saf, loss, s, 1, 1, 100 + s],                       # SAF: equal
                     [f"{sgr} + {saf}", loss, s, 1, 1, 100 + s - 50 * gap]]  # SGRAF: LSEH far below
    claims = f8k_claims.main(str(write_results(tmp_path / "r.csv", rows)), claim_set)["claims"]
    rsum = {c["claim"]: c["verdict"] for c in claims if "(rsum)" in c["claim"]}
    sgraf = "SGRAF (SGR and SAF scores averaged)"
    assert rsum == {f"LSEH (SVD) beats MH on SGR (rsum), {schedule}": "holds",
                    f"LSEH (SVD) beats MH on SAF (rsum), {schedule}": "inside the seed noise",
                    f"LSEH (SVD) beats MH on {sgraf} (rsum), {schedule}": "reversed"}


def test_the_vsrn_claims_keep_the_warmed_up_pair_apart_from_the_one_epoch_pair(tmp_path):
    """experiments/f8k_vsrn_short.yaml: ``method=mh`` / ``method=lseh-svd`` (one epoch) and
    ``method=mh-warm`` / ``method=lseh-svd-warm`` (two): each schedule's claims read its own rows."""
    rows = []
    for s in range(3):
        rows += [[f"method=mh,seed={s}", "mh", s, 1, 1, 4 + s],
                 [f"method=lseh-svd,seed={s}", "lseh", s, 1, 1, 4 + s],
                 [f"method=mh-warm,seed={s}", "mh", s, 2, 1, 40 + s],
                 [f"method=lseh-svd-warm,seed={s}", "lseh", s, 2, 2, 60 + s]]
    claims = f8k_claims.main(str(write_results(tmp_path / "r.csv", rows)), "vsrn_short")["claims"]
    rsum = {c["claim"]: c["verdict"] for c in claims if "(rsum)" in c["claim"]}
    assert rsum == {"LSEH (SVD) beats MH on VSRN (rsum), one epoch": "inside the seed noise",
                    "LSEH (SVD) beats MH on VSRN (rsum), two epochs, the first warmed up": "holds"}
    last = f8k_claims.main(str(write_results(tmp_path / "l.csv", rows)), "vsrn_last")["claims"]
    assert [c["verdict"] for c in last if "(rsum)" in c["claim"]] == ["holds"]
