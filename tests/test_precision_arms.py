"""The precision ablation's tools (experiments/precision_arms.py, experiments/precision_table.py):
the rounding each arm applies is the one it names, the products' rounding reaches the backward pass,
and the table pairs the arms with the controls seed by seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import precision_arms  # noqa: E402
import precision_table  # noqa: E402


def test_mantissa_rounding_is_bf16_and_tf32():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 100
    assert torch.equal(precision_arms.round_mantissa(x, 7), x.bfloat16().float())  # round to nearest even
    tf32 = precision_arms.round_mantissa(x, 10)
    relative = ((tf32 - x).abs() / x.abs()).max().item()
    assert 2 ** -12 < relative <= 2 ** -11  # 10 explicit bits: half an ulp at most, and it does round


def test_the_noise_arm_stays_inside_bf16_rounding():
    x = torch.rand(10_000, generator=torch.Generator().manual_seed(1)) + 1e-3
    bound = precision_arms.bf16_half_ulp(x)
    assert ((x.bfloat16().float() - x).abs() <= bound).all()
    assert (bound <= x * 2 ** -8).all()  # never coarser than bf16 itself


def test_rounded_products_reach_the_backward_pass():
    linear = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    mode = precision_arms.RoundedProducts(7)
    try:
        with mode:
            out = linear(x)
            out.sum().backward()
        calls = mode.calls
        linear(x).sum().backward()  # outside: not rounded, not counted
    finally:
        mode.close()
    assert calls >= 3 and mode.calls == calls  # the forward product and the two of the backward
    expected = F.linear(x.detach().bfloat16().float(), linear.weight.detach().bfloat16().float(), linear.bias)
    assert torch.allclose(out, expected, rtol=0, atol=1e-6)


def _run(arm, seed, rsum, ties):
    steps = {"loss": [60.0, 52.0], "collapse_gap": [8.8, 0.3], "tied_queries": [ties, ties],
             "ties_per_query": [1.0, 2.0], "distinct_scores": [100, 10], "grad_norm": [3.0, 1.0]}
    return {"arm": arm, "seed": seed, "options": {"embed_dim": 64, "network_options": {"sim_dim": 16},
                                                  "batch_size": 128, "epochs": 1, "val_images": 100},
            "collapse_value": 51.2, "seconds": 60.0, "validation": [{"rsum": rsum}], "steps": steps}


def test_the_table_pairs_arms_with_the_controls_by_seed(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    for arm, values, ties in (("fp32", (100.0, 120.0), 0.0), ("bf16", (200.0, 180.0), 0.5),
                              ("fp32-scores-bf16", (190.0, 170.0), 0.5)):
        for seed, value in enumerate(values):
            (runs / f"{arm}-s{seed}.json").write_text(json.dumps(_run(arm, seed, value, ties)))
    monkeypatch.setattr(sys, "argv", ["precision_table.py", str(tmp_path)])
    precision_table.main()
    summary = json.loads((tmp_path / "summary.json").read_text())["arms"]
    assert summary["fp32-scores-bf16"]["paired_vs_fp32"] == [90.0, 50.0]
    assert summary["fp32-scores-bf16"]["paired_vs_bf16"] == [-10.0, -10.0]
    assert summary["bf16"]["all"]["tied_queries"] == 0.5 and summary["fp32"]["all"]["at_collapse"] == 0.5
    assert "| fp32-scores-bf16 | 2 | 180.0 ± 14.1 | +90 +50 |" in (tmp_path / "table.md").read_text()


def test_the_protocol_holds_the_ablation_table_of_its_results_file():
    """docs/PROTOCOL.md's precision table is bench/results/precision_saf_cpu/table.md's, not typed
    twice (python docs/hooks/vse_docs.py --readme writes the region)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("vse_docs", root / "docs" / "hooks" / "vse_docs.py")
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    protocol = root / "docs" / "PROTOCOL.md"
    assert "<!-- vse:table bench/results/precision_saf_cpu/table.md -->" in protocol.read_text()
    assert docs.regions_up_to_date(protocol), "stale: python docs/hooks/vse_docs.py --readme"


def test_precision_pairs_match_a_configuration_across_precisions_seed_by_seed(tmp_path):
    """--fast pairs the rows of two results files by configuration (the run name without its seed
    and its precision) and by seed, the precision read from each row's own column."""
    header = "run,loss,seed,precision,rsum,i2t_r1,t2i_r1\n"
    rows = {"fp32": [(0, 100.0), (1, 110.0), (2, 120.0)], "bf16": [(2, 125.0), (0, 101.0), (1, 104.0)]}
    for prec, values in rows.items():
        net = "bf16/fp32/fp32" if prec == "bf16" else "fp32/fp32/fp32"
        lines = [f'"sgr_{prec}/method=mh,seed={s}",mh,{s},{net},{r},{r / 10},{r / 20}' for s, r in values]
        lines += [f'"sgr_{prec}/method=mh,seed={s} + saf_{prec}/method=mh,seed={s}",mh,{s},{net},{r + 1},1,1'
                  for s, r in values]
        (tmp_path / f"results_{prec}.csv").write_text(header + "\n".join(lines) + "\n")
    out = precision_table.precision_pairs(tmp_path, sorted(tmp_path.glob("results*.csv")))
    assert list(out) == ["sgr/method=mh", "sgr/method=mh + saf/method=mh"]
    rsum = out["sgr/method=mh"]["rsum"]
    assert rsum["by_seed"] == {"0": 1.0, "1": -6.0, "2": 5.0}
    assert rsum["fp32"]["mean"] == 110.0 and rsum["bf16"]["n"] == 3
    assert abs(rsum["difference"] - 0.0) < 1e-12 and rsum["verdict"] == "inside the seed noise"
    assert "| sgr/method=mh | rsum | 110.0 ± 10.0 (3) | 110.0 ± 13.1 (3) | +0.0 | +1.0 -6.0 +5.0 |" \
        in (tmp_path / "precision.md").read_text()
    assert precision_table.configuration("method=lseh,cpu_amp=true,seed=1") == "method=lseh"
