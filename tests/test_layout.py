"""Where the scripts live (issue 60): bench/ holds the speed and memory benches only; a script that
makes a results table from runs lives in experiments/ beside its YAML, and a recipe (the Makefile or
a docs page) names it; every script path the Makefile, README.md and the docs name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every script of bench/, each timing something or measuring memory (its docstring says what). A new
# bench is added here; a script that makes a results table goes to experiments/ instead.
SPEED_BENCHES = (
    "bare_loop.py", "batch_eval.py", "cpu_bf16.py", "dual_step.py", "embed.py", "evaluate.py",
    "extract.py", "fast_train.py", "gpu_benches.sh", "gpu_goals.py", "gpu_smoke.sh", "noisy.py",
    "op_counts.py", "rc.py", "relevance.py", "rescore.py", "run_memory.py", "scale.py", "search.py",
    "search_consistency.py", "sets.py", "sgraf.py", "shortlist.py", "slurm_sweep.py", "text_tokens.py",
    "train.py", "train_pairwise.py", "vsrn.py",
)
HELPERS = ("benchkit.py",)  # what several benches measure the same way; not run on its own

# What a table driver imports: the results tables and claims of `vse report` / `vse claims`, and the
# statistics of a seed group's row.
TABLE_CODE = re.compile(r"pipeline\.reports\.(?:report|claims)\b"
                        r"|\b(?:format_results|read_results|welch_greater|mean_std)\b")

# A script path as recipes write it: bench/, experiments/ or scripts/, ending in .py or .sh.
SCRIPT = re.compile(r"(?<![\w/.-])((?:bench|experiments|scripts)/[\w./-]*\w\.(?:py|sh))\b")


def _recipes() -> list[Path]:
    return [ROOT / "Makefile", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _named() -> dict[str, list[str]]:
    """Each script path the recipes name, with the files naming it."""
    named: dict[str, list[str]] = {}
    for source in _recipes():
        for path in SCRIPT.findall(source.read_text(encoding="utf-8")):
            named.setdefault(path, []).append(source.relative_to(ROOT).as_posix())
    return named


def test_a_script_path_is_read_as_recipes_write_it():
    text = ("run `python experiments/tune_table.py experiments/f8k_tune.yaml`, then bench/gpu_smoke.sh;\n"
            "not bench/results/f8k_noisy/moved.json, nor ../bench/x.py or pipeline/models/vsrn.py")
    assert SCRIPT.findall(text) == ["experiments/tune_table.py", "bench/gpu_smoke.sh"]


def test_bench_holds_only_the_speed_benches():
    found = sorted(p.name for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh"))
    assert found == sorted(SPEED_BENCHES + HELPERS), (
        "bench/ keeps the speed and memory benches (SPEED_BENCHES); a results table's driver goes to "
        "experiments/ beside its YAML")


def test_no_speed_bench_imports_the_code_that_makes_results_tables():
    drivers = [name for name in SPEED_BENCHES + HELPERS
               if TABLE_CODE.search((ROOT / "bench" / name).read_text(encoding="utf-8"))]
    assert drivers == [], f"bench/{drivers[0]} makes a results table: it belongs in experiments/"


def test_every_experiments_script_is_named_by_a_recipe():
    named = _named()
    unnamed = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "experiments").glob("*.py"))
               if p.relative_to(ROOT).as_posix() not in named]
    assert unnamed == [], f"no Makefile recipe, README.md or docs page names {unnamed}"


def test_every_script_path_the_makefile_and_the_docs_name_exists():
    missing = [f"{source} names {path}" for path, sources in sorted(_named().items())
               for source in sources if not (ROOT / path).is_file()]
    assert missing == []
