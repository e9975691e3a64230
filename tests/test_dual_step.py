"""bench/dual_step.py and bench/bare_loop.py (issue 50): the cached dual trainer against a bare
PyTorch loop of the same model, run at a tiny size on the CPU (the GPU path's profiler share is
arithmetic, tested here; on a CPU it is reported as not applicable)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import dual_step  # noqa: E402
from bare_loop import bare_loop  # noqa: E402


def test_the_bare_loop_learns_the_pairing():
    torch.manual_seed(0)
    images = torch.randn(40, 12)
    caption_image = torch.arange(40).repeat_interleave(5)
    vectors = images[caption_image] @ torch.randn(12, 10) + 0.1 * torch.randn(200, 10)
    run = bare_loop(images, vectors, caption_image, batch=32, embed=16)
    first = float(run(1).detach())
    for _ in range(30):
        last = float(run(6).detach())
    assert last < 0.7 * first


def test_ours_over_bare_side_by_side_on_the_cpu():
    args = argparse.Namespace(device="cpu", images=150, batch=32, steps=2, rounds=1)
    report = dual_step.measure(args)
    assert report["ours_over_bare"] > 0 and report["sizes"]["steps_a_round"] == 2
    assert set(report["steps_per_s"]) == {"ours", "bare"}
    assert report["host_fraction"].startswith("not applicable")
    assert dual_step.host_fraction(lambda: None, "cpu") is None


def test_host_share_is_the_time_the_device_was_idle():
    assert dual_step.host_share(0.085, 0.1) == 0.15
    assert dual_step.host_share(0.2, 0.1) == 0.0  # overlapping kernels never make it negative
