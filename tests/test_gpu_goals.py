"""bench/gpu_goals.py (issue 50): the goals read from the files bench/gpu_benches.sh writes, on
files of the benches' own shapes (a GPU run's numbers, written here), and a missing file's goals
left as not measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_goals  # noqa: E402


def _write(folder: Path, name: str, report: dict) -> None:
    (folder / name).write_text(json.dumps(report))


def test_goals_from_a_gpu_run(tmp_path):
    step = lambda ours, bf16: {"median_step_s": {"ours": ours, "ours_bf16": bf16, "authors": 0.8},  # noqa: E731
                               "speedup_ours_over_authors": 0.8 / ours,
                               "peak_cuda_mb": {"ours": 4000, "ours_bf16": 3000, "authors": 8000}}
    pairwise = {"sgr": step(0.018, 0.03), "saf": step(0.025, 0.01)}
    _write(tmp_path, "train_pairwise_cuda.json", {"device": "NVIDIA H200", "networks": pairwise})
    _write(tmp_path, "train_pairwise_vsrn_cuda.json", {"networks": {"vsrn": step(0.05, 0.029)}})
    _write(tmp_path, "train_pairwise_profile_cuda.json",
           {"networks": {"sgr": {"host_fraction": 0.1}, "sgr_ours_bf16": {"host_fraction": 0.5},
                         "saf": {"host_fraction": 0.2}}})
    _write(tmp_path, "dual_step_cuda.json",
           {"ours_over_bare": 0.95, "host_fraction": {"ours": 0.3, "bare": 0.1}})
    report = gpu_goals.goals(tmp_path)
    g = report["goals"]
    assert report["device"] == "NVIDIA H200"
    assert g["sgr_step"]["met"] and not g["saf_step"]["met"]  # fp32, the protocol's precision for both
    assert g["vsrn_step"]["kind"] == "ours_bf16" and g["vsrn_step"]["met"]
    assert g["sgr_host_fraction"]["met"] and not g["saf_host_fraction"]["met"]
    assert g["vsrn_host_fraction"] is None and g["sgr_peak_memory"]["met"]
    assert g["dual_ours_over_bare"]["met"] and not g["dual_host_fraction"]["met"]
    assert report["not_measured"] == ["vsrn_host_fraction"]


def test_a_cpu_run_leaves_the_gpu_goals_unmeasured(tmp_path):
    _write(tmp_path, "dual_step_cpu.json", {"ours_over_bare": 0.8, "host_fraction": "not applicable"})
    report = gpu_goals.goals(tmp_path, "_cpu")
    assert report["goals"]["dual_ours_over_bare"] == {"value": 0.8, "goal_min": 0.9, "met": False}
    assert report["goals"]["dual_host_fraction"] is None and report["measured"] == 1


def test_gpu_benches_parses_and_names_scripts_that_exist():
    import re
    import subprocess

    script = ROOT / "bench" / "gpu_benches.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    named = set(re.findall(r"bench/[a-z_]+\.(?:py|sh)", script.read_text()))
    assert {"bench/train_pairwise.py", "bench/dual_step.py", "bench/gpu_goals.py"} <= named
    assert all((ROOT / name).is_file() for name in named)
