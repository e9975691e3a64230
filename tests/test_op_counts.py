"""bench/op_counts.py (issue 50): the operators a training step dispatches, counted by torch.profiler
on the CPU; its counter on modules of known counts, its GPU-path emulation (an RNN as one op each
way, sgraf_ops in one block a chunk), and the fields of bench/results/op_counts.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import op_counts  # noqa: E402

TINY = dict(batch=12, members=4, feature_dim=8, embed=8, sim_dim=4, word_dim=4, vocab=50)


def test_a_linear_forward_is_one_dispatch_and_one_addmm():
    layer, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    counts = op_counts.count_ops(lambda: layer(x))
    assert counts["dispatched"] == counts["kernel_ops"] == 1
    assert counts["top_dispatched"] == {"aten::linear": 1}
    assert counts["by_name"]["aten::addmm"] == 1
    assert counts["aten_ops"] > counts["dispatched"]  # linear's own t, addmm, ...


def test_views_are_dispatched_but_launch_no_kernel():
    x = torch.randn(4, 6)
    counts = op_counts.count_ops(lambda: (x.view(6, 4).t() * 2).sum())
    assert counts["dispatched"] == 4 and counts["kernel_ops"] == 2  # view, t; mul, sum


def test_an_rnn_counts_one_op_each_way_on_the_gpu_path():
    gru, x = torch.nn.GRU(3, 5, batch_first=True), torch.randn(2, 7, 3)

    def step():
        gru(x)[0].sum().backward()
    cpu = op_counts.count_ops(step)
    with op_counts.as_on_a_gpu():
        gpu = op_counts.count_ops(step)
    assert gpu["rnn_calls"] == 1 and cpu["rnn_calls"] == 0
    # the GRU (2) and sum, its backward, AccumulateGrad's copies: a handful, not a loop of 7 steps
    assert gpu["dispatched"] < 20 < cpu["dispatched"]
    assert torch.nn.GRU.forward is not None and op_counts.RNN_RANGE not in str(torch.nn.GRU.forward)


@pytest.mark.parametrize("network", ["sgr", "saf"])
def test_a_pairwise_step_is_counted_fp32_and_bf16(network):
    with op_counts.as_on_a_gpu():
        fp32 = op_counts.count_ops(op_counts.pairwise_step(network, TINY))
        bf16 = op_counts.count_ops(op_counts.pairwise_step(network, TINY, torch.bfloat16))
    for counts in (fp32, bf16):
        assert counts["rnn_calls"] == 1
        assert 0 < counts["kernel_ops"] <= counts["dispatched"] < counts["aten_ops"]
        assert counts["by_name"]["aten::bmm"] > 0
    assert bf16["by_name"]["aten::_to_copy"] > fp32["by_name"]["aten::_to_copy"]  # autocast's casts


def test_count_sizes_fall_into_the_authors_chunks():
    from train_pairwise import SIZES

    assert op_counts.chunk_sizes(op_counts.COUNT_SIZE) == op_counts.chunk_sizes(SIZES["authors"])


def test_the_results_file_has_before_and_after_for_each_step():
    report = json.loads((ROOT / "bench" / "results" / "op_counts.json").read_text())
    names = {f"{n}/{p}" for n in ("sgr", "saf", "vsrn", "dual_cached") for p in ("fp32", "bf16")}
    for key in ("before", "after"):
        for mode in ("gpu_path", "cpu_path"):
            assert set(report[key][mode]) == names
            for counts in report[key][mode].values():
                assert {"aten_ops", "dispatched", "kernel_ops", "by_name"} <= set(counts)
    assert report["before"]["sizes"]["chunks"] == report["before"]["sizes"]["chunks_at_authors_sizes"]
    for name in names:
        assert report["ratio_before_over_after"]["gpu_path"][name]["dispatched"] > 0
