"""experiments/protocol_differences.py (the numerical differences from the authors' code that
docs/PROTOCOL.md states with a size): its tiny grid runs and writes every difference with its worst
case and grid, and the worst cases PROTOCOL states are those of the committed JSON."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "bench" / "results" / "protocol_differences.json"
DIFFERENCES = ("ncr_gmm_dtype", "ncr_gmm_random_state", "ncr_seed_noise", "rcl_one_minus_p",
               "decl_logit_readback", "vse_infty_l2_eps", "vse_infty_gpo_table", "float16_sets",
               "vsrn_adam_eps_041", "adam_kernel")


def bench():
    path = ROOT / "experiments" / "protocol_differences.py"
    spec = importlib.util.spec_from_file_location("protocol_differences", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_shape(report: dict) -> None:
    assert tuple(report["differences"]) == DIFFERENCES
    for name, entry in report["differences"].items():
        assert entry["protocol"] and entry["grid"], name
        for key, case in entry.items():
            if key.startswith("worst"):
                assert {"value", "size", "distribution"} <= set(case), (name, key)
                assert case["value"] >= 0 and case["size"] > 0, (name, key)
                assert any(row["distribution"] == case["distribution"] and row["n"] == case["size"]
                           for row in entry["grid"]), (name, key)


def test_the_tiny_grid_writes_every_difference_with_its_worst_case(tmp_path):
    module = bench()
    out = tmp_path / "pd.json"
    report = module.main(["--tiny", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["grid"] == "tiny"
    check_shape(report)
    ncr = report["differences"]["ncr_gmm_dtype"]["grid"]
    assert len(ncr) == len(module.LOSS_DISTS) and {row["n"] for row in ncr} == {500}
    # float32 against float64 moves w by rounding, far less than another random state
    assert report["differences"]["ncr_gmm_dtype"]["worst"]["value"] < 1e-3
    # the float16 cache: round to nearest, 2^-11 relative in float16's normal range
    assert report["differences"]["float16_sets"]["worst"]["value"] <= 2.0 ** -11


def test_protocol_states_the_committed_worst_cases():
    """So PROTOCOL and bench/results/protocol_differences.json cannot drift apart: the sentences
    that cite the JSON give its worst cases, formatted by the bench's ``stated``."""
    stated = bench().stated
    report = json.loads(COMMITTED.read_text())
    assert report["grid"] == "full"
    check_shape(report)
    text = re.sub(r"\s+", " ", (ROOT / "docs" / "PROTOCOL.md").read_text())
    d = report["differences"]
    dtype, state, rcl = d["ncr_gmm_dtype"], d["ncr_gmm_random_state"], d["rcl_one_minus_p"]
    moved = state["worst_dw"]
    for sentence in (f"another state flips up to {stated(100 * state['worst']['value'])} % of the verdicts",
                     f"moves w by up to {stated(moved['value'])} (n = {moved['size']:,}",
                     f"it moves w by up to {stated(dtype['worst']['value'])} and flips up to "
                     f"{stated(100 * dtype['worst_flips']['value'])} % of the verdicts "
                     f"(n = {dtype['worst_flips']['size']:,}",
                     f"theirs is off by up to {round(100 * rcl['worst_theirs_float32']['value'])} %"):
        assert sentence in text, sentence
