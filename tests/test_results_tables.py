"""Every results table in bench/results/ is what `vse report` makes of its folder's CSV today: a
table cannot go stale beside the CSV it was made from.

Where each table comes from is written once: the Makefile's ``$(VSE) report CSV ARGS | tee TABLE``
lines (read here, variables and ``for X in …`` loops expanded), and, for the few tables that no
Makefile line makes, ``OTHER_REPORTS`` below. Tables that a bench script makes from run folders
that are not committed are ``NOT_FROM_A_CSV``, each with its reason. A table in none of the three
fails the test, so a new table gets a maker. Each table is rendered in this process (click's
runner: no training, no subprocess) and must equal the committed file byte for byte; to
regenerate one, run the command the failure prints from the repository root.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TABLE_GLOBS = ("*/table*.md", "*/table*.tex", "*/table*.csv")

# Tables made by `vse report` of their folder's CSV with no Makefile line: TABLE: (CSV, ARGS).
OTHER_REPORTS = {
    # the folder's README gives the command (a one-off pipeline, no make target)
    "f8k_backbones/table_recall.md": ("f8k_backbones/results.csv", "--columns recall --epochs-to-best"),
    "f8k_losses/table.md": ("f8k_losses/results.csv", "--columns recall --epochs-to-best"),
    # the recall table beside the target's noisy and human ones (same folder, same CSV)
    "f8k_noisy/table_recall.md": ("f8k_noisy/results.csv", "--columns recall --epochs-to-best"),
    "f8k_noisy_sgr/table_human.md": ("f8k_noisy_sgr/results.csv", "--columns human"),
    "f8k_sets/table_human.md": ("f8k_sets/results.csv", "--columns human"),
    # `vse sweep experiments/f8k_saf_short_bf16.yaml --network sgr --name sgr_short_bf16` (Makefile,
    # f8k-sgraf-bf16's comment), evaluated and reported as its SAF twin
    "f8k_sgr_short_bf16/table_recall.md": ("f8k_sgr_short_bf16/results.csv",
                                           "--columns recall --epochs-to-best"),
}

# Tables not rendered from a committed CSV alone, and why.
TUNED_LABELS = "experiments/tune_table.py: each label's '(tuned B)' is read from the run folders"
NOT_FROM_A_CSV = {
    "f8k_tuned/table_noisy.md": TUNED_LABELS,
    "f8k_tuned/table_human.md": TUNED_LABELS,
    "f8k_tuned_pilot/table_noisy.md": TUNED_LABELS,
    "f8k_tuned_pilot/table_human.md": TUNED_LABELS,
    "f8k_hubness/table.md": "experiments/hubness.py, from results.csv with claims.json's verdicts and "
                            "rescore_cost.json's cost (tests/test_hubness_driver.py)",
    "f8k_hubness_bank1000/table.md": "the same, with a bank of 1,000 training images",
    "f8k_hubness_bank500/table.md": "the same, with a bank of 500 training images",
    "f8k_hubness_vse_infty/table.md": "the same, VSE∞'s runs and experiments/claims/hubness_vse_infty.yaml",
    "f8k_hubness_saf/table.md": "the same, SAF's fp32 runs and experiments/claims/hubness_saf.yaml",
    "f8k_hubness_saf_bf16/table.md": "the same, SAF's bf16 runs and experiments/claims/hubness_saf_bf16.yaml",
    "f8k_hubness/bank_sizes.md": "experiments/hubness.py --bank-table, from the three arms' results.csv and "
                                 "claims.json (tests/test_hubness_driver.py)",
    "f8k_hubness/bank_costs.md": "experiments/hubness.py --bank-table, from the cost benches' JSON "
                                 "(tests/test_hubness_driver.py)",
    "precision_saf_cpu/table.md": "experiments/precision_table.py, from runs/*.json (no results CSV); "
                                  "tests/test_precision_arms.py checks it",
}

REPORT_LINE = re.compile(r"\$\(VSE\) report (?P<csv>\S+)(?P<args>[^|&;]*?)\s*\|\s*tee (?P<out>\S+)")
LOOP = re.compile(r"\bfor (\w+) in ([^;]+);")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[?:]?=\s*(.*?)\s*$", re.M)


def makefile_reports(text: str) -> dict[str, tuple[str, list[str]]]:
    """The ``$(VSE) report CSV ARGS | tee TABLE`` lines of a Makefile: TABLE → (CSV, ARGS), paths
    as written after expanding ``$(NAME)`` variables and the ``$$X`` of a ``for X in A B;`` loop
    on the same (continued) line."""
    text = text.replace("\\\n", " ")
    variables = {m[1]: m[2] for m in ASSIGN.finditer(text)}

    def expand(value: str) -> str:
        for _ in range(10):
            value, count = re.subn(r"\$\((\w+)\)", lambda m: variables.get(m[1], m[0]), value)
            if not count:
                break
        return value

    found = {}
    for line in text.splitlines():
        loops = LOOP.findall(line)
        choices = [dict()]
        for name, values in loops:
            choices = [{**c, name: v} for c in choices for v in values.split()]
        for match in REPORT_LINE.finditer(line):
            for choice in choices:
                def bind(s: str, choice=choice) -> str:
                    for name, value in choice.items():
                        s = s.replace(f"$${{{name}}}", value).replace(f"$${name}", value)
                    return expand(s)
                found[bind(match["out"])] = (bind(match["csv"]), shlex.split(bind(match["args"])))
    return found


def makers() -> dict[Path, tuple[Path, list[str]]]:
    """Every table that `vse report` makes from a committed CSV: TABLE → (CSV, ARGS)."""
    made = {ROOT / out: (ROOT / csv, args)  # a target not run yet has no table: nothing to check
            for out, (csv, args) in makefile_reports((ROOT / "Makefile").read_text(encoding="utf-8")).items()
            if (ROOT / out).parent.parent == RESULTS and (ROOT / out).is_file()}
    for table, (csv, args) in OTHER_REPORTS.items():
        assert RESULTS / table not in made, f"{table}: the Makefile makes it; drop it from OTHER_REPORTS"
        made[RESULTS / table] = (RESULTS / csv, args.split())
    return made


def tables() -> list[Path]:
    return sorted(p for pattern in TABLE_GLOBS for p in RESULTS.glob(pattern))


def _name(path: Path) -> str:
    return str(path.relative_to(RESULTS))


def test_the_makefile_reader_expands_variables_and_loops():
    text = ("OUT = bench/results/x\nVSE = .venv/bin/vse\n"
            "t:\n\tfor prec in fp32 bf16; do \\\n"
            "\t  $(VSE) report $(OUT)/results_$$prec.csv --columns recall \\\n"
            "\t    | tee $(OUT)/table_$$prec.md || exit 1; done\n"
            "\t$(VSE) report $(OUT)/results.csv --columns human | tee $(OUT)/table_human.md\n"
            "\t$(VSE) report $(OUT)/results.csv --columns noisy\n")  # no tee: no table
    assert makefile_reports(text) == {
        "bench/results/x/table_fp32.md": ("bench/results/x/results_fp32.csv", ["--columns", "recall"]),
        "bench/results/x/table_bf16.md": ("bench/results/x/results_bf16.csv", ["--columns", "recall"]),
        "bench/results/x/table_human.md": ("bench/results/x/results.csv", ["--columns", "human"]),
    }


def test_every_table_has_one_known_maker():
    made = makers()
    orphans = [_name(t) for t in tables() if t not in made and _name(t) not in NOT_FROM_A_CSV]
    assert not orphans, (f"no command is known to make {', '.join(orphans)}: add a Makefile `$(VSE) report "
                         "… | tee` line or an entry of OTHER_REPORTS / NOT_FROM_A_CSV")
    both = [name for name in NOT_FROM_A_CSV if RESULTS / name in made]
    assert not both, f"{both}: listed as not made from a CSV, but a report line makes them"
    gone = [n for n in [*OTHER_REPORTS, *NOT_FROM_A_CSV] if not (RESULTS / n).is_file()]
    assert not gone, f"listed here but not committed (drop the entry): {gone}"
    missing_csv = [str(csv.relative_to(ROOT)) for csv, _ in made.values() if not csv.is_file()]
    assert not missing_csv, f"results files named by a maker are missing: {missing_csv}"


@pytest.mark.parametrize("table", sorted(makers()), ids=_name)
def test_the_table_is_a_fresh_rendering_of_its_csv(table):
    from cli.main import cli

    csv, args = makers()[table]
    command = ["report", str(csv.relative_to(ROOT)), *args]
    result = CliRunner().invoke(cli, ["report", str(csv), *args], prog_name="vse")
    assert result.exit_code == 0, f"vse {shlex.join(command)}\n{result.output}"
    assert table.read_text(encoding="utf-8") == result.stdout, (
        f"{_name(table)} is stale; regenerate it: .venv/bin/vse {shlex.join(command)} > "
        f"{table.relative_to(ROOT)}")
