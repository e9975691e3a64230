"""experiments/dev_curves.py: each epoch's validation rsum over seeds, from hand-made metrics.jsonl files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import dev_curves  # noqa: E402


def write_run(folder: Path, rsums: list[float], extra_iteration: float | None = None) -> None:
    folder.mkdir(parents=True)
    records = [{"epoch": e + 1, "iteration": 10 * (e + 1), "split": "dev", "rsum": r}
               for e, r in enumerate(rsums)]
    if extra_iteration is not None:  # a mid-epoch validation before epoch 1's end: the last record counts
        records.insert(0, {"epoch": 1, "iteration": 5, "split": "dev", "rsum": extra_iteration})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_groups_by_folder_and_method_and_averages_each_epoch(tmp_path, capsys):
    write_run(tmp_path / "saf_fp32" / "method=mh,seed=0", [100.0, 110.0, 120.0], extra_iteration=1.0)
    write_run(tmp_path / "saf_fp32" / "method=mh,seed=1", [104.0, 90.0])  # still training
    write_run(tmp_path / "saf_fp32" / "method=lseh-svd,seed=0", [50.0])
    (tmp_path / "saf_fp32" / "method=lseh-svd,seed=1").mkdir()  # not validated yet: left out
    assert dev_curves.main([f"{tmp_path}/saf_fp32/*"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| runs | epoch 1 | epoch 2 | epoch 3 |"
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["saf_fp32/method=mh"][0] == "102.0 ± 2.8 (n 2: 100 104)"
    assert rows["saf_fp32/method=mh"][1] == "100.0 ± 14.1 (n 2: 110 90)"
    assert rows["saf_fp32/method=mh"][2] == "120.0 (n 1: 120)"
    assert rows["saf_fp32/method=lseh-svd"] == ["50.0 (n 1: 50)", "", ""]


def test_no_validated_run_is_an_error_naming_the_globs(tmp_path, capsys):
    assert dev_curves.main([f"{tmp_path}/*"]) == 1
    assert capsys.readouterr().err.strip() == f"error: no run with a metrics.jsonl matches {tmp_path}/*"
