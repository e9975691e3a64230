"""results.csv (one row per evaluated run) and the papers' results tables (md, LaTeX, csv).

Layouts: ``paper`` is the VSE++ / LSEH table (Caption Retrieval R@1 R@10 Med r | Image
Retrieval R@1 R@10 Med r); ``recall`` is R@1 R@5 R@10 per direction plus rsum; ``human`` the
agreement with human judgments (tau, NDCG@K, plausible-match R@K, R-precision per direction,
Spearman) plus rsum. CS@K columns are appended when the rows have them.

Runs that differ only by their seed (the same ``config_id``, see ``pipeline.training.run_folder.config_id``)
are one row of the table: every cell is ``mean ± std (n)`` over the seeds.  Bold marks
(``bold``): ``significant`` (the default) bolds a column's best mean only when Welch's
one-sided t-test over the seeds puts it above the runner-up at p < 0.05 (pipeline.evaluation.stats), so
a single seed is never bold; ``best`` bolds the best printed value whatever the noise (ties
all bold, the lowest for Med r); ``none`` bolds nothing.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import code_identity, precision
from pipeline.core.errors import VseError
from pipeline.core.fsutil import atomic_path
from pipeline.evaluation.chance import row_at_chance
from pipeline.evaluation.metrics import METRIC_KEYS, is_metric, metric_keys, metric_of, metric_order
from pipeline.evaluation.stats import ALPHA, mean_std, welch_greater
from pipeline.reports.batch_eval import ENSEMBLE, MEMBER, RUN_COLUMNS

TEXT_COLUMNS = {"run", "loss", "loss_options", "backbone", "train_set", "features", "split",
                "protocol", "checkpoint", "config_id", "checkpoint_sha256", "evaluation_id", "tune_budget",
                precision.COLUMN, code_identity.COLUMN, "rescore"}
FORMATS = ("md", "latex", "csv")
BOLD_MODES = ("significant", "best", "none")
# Columns that describe one run rather than its configuration: left out of a seed group's key.
PER_RUN_COLUMNS = ("run", "seed", "checkpoint", "checkpoint_iteration", "epochs_to_best", "best_val_mrecall",
                   "config_id", "images", "checkpoint_sha256")
# Each layout's metrics (keys of pipeline.evaluation.metrics.METRICS; a family such as human_i2t_r@{k}
# brings every K the rows have). Headers, groups, formats and which way is better come from
# the metric table; CS@K columns follow when the rows have them.
LAYOUTS = {
    "paper": ("i2t_r1", "i2t_r10", "i2t_medr", "t2i_r1", "t2i_r10", "t2i_medr"),
    "recall": (*metric_keys("recall"), "rsum"),
    "human": (*metric_keys("human"), "rsum"),
    # training on noisy pairs: recall, agreement with people (mAP@R), and the method's division
    "noisy": ("i2t_r1", "t2i_r1", "rsum", "human_i2t_map@r", "human_t2i_map@r", "division_auc"),
}
EPOCHS = "epochs_to_best"  # the --epochs-to-best column
HEADLINE = "rsum"  # the metric of --baseline's p column, whatever the layout shows
NEVER_BEGAN = " (its method never began: see below)"  # a row's mark: the run ended before its method began
AT_CHANCE = " (at chance: see below)"  # a row's mark: its rsum is within the noise of chance (chance.py)
# The title of a metric's column group, by group and direction (Caption Retrieval = i2t).
TITLES = {("recall", "i2t"): "Caption Retrieval", ("recall", "t2i"): "Image Retrieval",
          ("rank", "i2t"): "Caption Retrieval", ("rank", "t2i"): "Image Retrieval",
          ("human", "i2t"): "Caption Retrieval (human)", ("human", "t2i"): "Image Retrieval (human)",
          ("cs", "i2t"): "Coherent Score", ("cs", "t2i"): "Coherent Score", ("training", "both"): "Training"}
# The same titles as markdown headers' prefixes.
SHORT_TITLES = {"Caption Retrieval": "Caption", "Image Retrieval": "Image", "Coherent Score": "",
                "Training": "", "Caption Retrieval (human)": "Caption (human)",
                "Image Retrieval (human)": "Image (human)"}


# ---------------------------------------------------------------------------- results.csv


def result_columns(rows) -> list[str]:
    """Run columns, then the metrics, then anything else (CS@K) in first-seen order."""
    present = list(dict.fromkeys(k for row in rows for k in row))
    known = [c for c in (*RUN_COLUMNS, *METRIC_KEYS) if c in present]
    return known + [c for c in present if c not in known]


def write_results(rows, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = result_columns(rows)
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return path


def read_results(path) -> list[dict]:
    """Rows of a results.csv with numbers as int/float and empty cells as None."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise VseError(f"cannot read results ({str(exc).splitlines()[0][:120]})", path) from exc
    if not rows:
        raise VseError("results file has no rows", path)
    if "run" not in rows[0]:
        raise VseError("not a results file: no 'run' column (written by `vse evaluate --runs`)", path)
    try:
        return [{k: _cell(k, v) for k, v in row.items()} for row in rows]
    except ValueError as exc:
        raise VseError(f"bad value in results ({exc})", path) from None


def _cell(column: str, value: str):
    if value is None or value == "":
        return None
    if column in TEXT_COLUMNS:
        return value
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"column {column!r} holds {value!r}, expected a number") from None


# ---------------------------------------------------------------------------- tables


def table_columns(rows, layout: str = "paper",
                  epochs: bool = False) -> list[tuple[str, list[tuple[str, str]]]]:
    """Column groups (title, [(header, key)]): the layout's metrics that some row has, CS@K
    when rows have it, and the epochs to the best validation M-Recall when ``epochs``."""
    if layout not in LAYOUTS:
        raise VseError(f"unknown table layout {layout!r} (expected {', '.join(LAYOUTS)})")
    keys = [k for entry in LAYOUTS[layout] for k in _present(entry, rows)]
    keys += sorted({k for row in rows for k in row if is_metric(k) and metric_of(k).group == "cs"},
                   key=lambda k: (int(k.split("@")[1]), k))
    if epochs:
        keys.append(EPOCHS)
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    for key in keys:
        metric = metric_of(key)
        title = TITLES.get((metric.group, metric.direction), "")
        if not groups or groups[-1][0] != title:
            groups.append((title, []))
        groups[-1][1].append((metric.label, key))
    return groups


def _present(entry: str, rows) -> list[str]:
    """A layout entry's keys that some row has a value of: the key itself, or a family's
    members in K order."""
    if "{k}" not in entry:
        return [entry] if any(row.get(entry) is not None for row in rows) else []
    prefix = entry.split("{k}")[0]
    found = {k for row in rows for k in row
             if k.startswith(prefix) and k[len(prefix):].isdigit() and row.get(k) is not None}
    return sorted(found, key=metric_order)


def format_value(key: str, value) -> str:
    """A cell of ``key`` (a metric of ``metrics.METRICS``) as the table prints it; "" when missing."""
    return metric_of(key).format(value)


def _lower_is_better(key: str) -> bool:
    return not metric_of(key).higher_is_better


def best_cells(rows, keys) -> set[tuple[int, str]]:
    """(row index, key) of each column's best printed value (lowest for ranks)."""
    best = set()
    for key in keys:
        printed = [(i, format_value(key, row.get(key))) for i, row in enumerate(rows)]
        values = [(i, float(text)) for i, text in printed if text]
        if len(values) < 2:
            continue
        pick = min if _lower_is_better(key) else max
        target = pick(v for _, v in values)
        best.update((i, key) for i, v in values if v == target)
    return best


@dataclass
class SeedGroup:
    """The runs of one configuration: ``samples[key]`` holds one value per seed."""

    label: str
    rows: list[dict]
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.rows)

    def mean(self, key: str):
        return mean_std(self.samples.get(key, []))[0] if self.samples.get(key) else None


def config_key(row: dict) -> tuple:
    """Rows with equal keys differ only by seed: the ``config_id`` column when present (runs
    evaluated by this vse), else the run name without its ``seed=N`` part together with every
    configuration-describing column of results.csv. Runs of one config in different precisions
    (the same options on a CPU and under a GPU's autocast) are different groups, and so are runs
    of different code (``code_id``: another vse version, an edited built-in loss or network file;
    a plug-in's sha256 is in the config_id already), a run saved before it was recorded included:
    their labels say so (``code_identity.labelled``). Rows averaging different numbers of networks'
    scores (``row_ensemble``: ncr's two against one of them, ``--member``) are different groups too."""
    if row.get("config_id"):
        return ("config_id", row["config_id"], row_precision(row), str(row.get(code_identity.COLUMN) or ""),
                str(row.get("rescore") or ""),  # a re-scored row (issue 61) is a configuration of its own
                row_ensemble(row), row.get(MEMBER))
    # an older results.csv: the same name apart from "seed=N" and the same described options
    return (without_seed(str(row.get("run") or "")), (ENSEMBLE, row_ensemble(row)),
            *((k, row.get(k)) for k in RUN_COLUMNS if k not in PER_RUN_COLUMNS))


def row_ensemble(row: dict) -> int:
    """How many networks' scores a results row averages (its ``ensemble`` column; docs/PROTOCOL.md,
    "Ensemble size"). A row evaluated before vse recorded it: read from its method, as a checkpoint
    says it (a loss that trains k networks together declares ``networks = k``: ncr's 2; a plug-in's:
    1), times the runs an average of runs ('A + B', SGRAF) holds."""
    if row.get(ENSEMBLE) is not None:
        return int(row[ENSEMBLE])
    return len(str(row.get("run") or "").split(" + ")) * _loss_networks(str(row.get("loss") or ""))


def _loss_networks(name: str) -> int:
    """The networks a built-in loss trains together (``networks``, losses/noisy/base.py), else 1."""
    from pipeline.core.registry import LOSSES

    return int(getattr(LOSSES.get_part(name), "networks", 1)) if name in LOSSES.names else 1


def mixed_ensembles(sizes: dict) -> str | None:
    """None when every one of ``sizes`` (name → networks averaged) is one size, else the line saying
    which differ (as ``core.precision.mixed`` says it of precisions)."""
    groups: dict[int, list[str]] = {}
    for name, size in sizes.items():
        groups.setdefault(int(size), []).append(str(name))
    if len(groups) < 2:
        return None
    parts = [f"{size} network{'s' * (size > 1)}: {', '.join(sorted(names)[:3])}" + " …" * (len(names) > 3)
             for size, names in sorted(groups.items())]
    return "ensembles of different size (networks whose scores are averaged) — " + "; ".join(parts)


def ensemble_label(row: dict) -> str:
    """' (2 networks)' for a row averaging several networks' scores, '' for one network."""
    size = row_ensemble(row)
    return f" ({size} networks)" if size > 1 else ""


def seed_groups(rows, label: str = "run") -> list[SeedGroup]:
    """Group rows by configuration, in first-seen order; a group's label is its first row's
    ``label`` with any ``seed=N`` part of a sweep's run name removed."""
    grouped: dict[tuple, list[dict]] = {}
    for row in rows:
        grouped.setdefault(config_key(row), []).append(row)
    return [seed_group(without_seed(str(members[0].get(label) or "")), members)
            for members in grouped.values()]


def seed_group(label: str, members: list[dict]) -> SeedGroup:
    """The SeedGroup of ``members`` (rows of one configuration, or rows pooled on purpose: `vse compare
    --across-precision`): each numeric column's values, one per row that has it."""
    group = SeedGroup(label, members)
    for key in {k for row in members for k in row}:
        values = [row[key] for row in members if isinstance(row.get(key), (int, float))
                  and not isinstance(row.get(key), bool)]
        if values:
            group.samples[key] = [float(v) for v in values]
    return group


def without_seed(name: str) -> str:
    """A run name without its ``seed=N`` part; an average of runs ("A + B") without each one's."""
    if " + " in name:
        return " + ".join(map(without_seed, name.split(" + ")))
    name = re.sub(r"/seed=\d+(?=$|,)", "", name)  # an exported sweep's STUDY-best/seed=N(,member=K)
    parts = [p for p in name.split(",") if not re.fullmatch(r"seed=\d+", p.strip())]
    return ",".join(parts) or name


def significant_cells(groups: list[SeedGroup], keys) -> set[tuple[int, str]]:
    """(group index, key) where the group's mean is the column's best and Welch's one-sided
    t-test over seeds puts it above the runner-up at p < ALPHA."""
    marked = set()
    for key in keys:
        ranked = [(g.mean(key), i) for i, g in enumerate(groups) if g.samples.get(key)]
        if len(ranked) < 2:
            continue
        lower = _lower_is_better(key)
        ranked.sort(key=lambda t: t[0], reverse=not lower)
        (_, best), (_, runner_up) = ranked[0], ranked[1]
        a, b = groups[best].samples[key], groups[runner_up].samples[key]
        p = welch_greater([-v for v in a], [-v for v in b]) if lower else welch_greater(a, b)
        if p < ALPHA:
            marked.add((best, key))
    return marked


def welch_two_sided(a, b) -> float | None:
    """Two-sided p-value of Welch's t-test over seeds (``scipy.stats.ttest_ind(a, b, equal_var=False)``);
    None with fewer than two values on a side. Two samples with no spread at all: p = 0 when their
    means differ, 1 when not (as ``stats.welch_greater``)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return None
    if a.var() == 0 and b.var() == 0:
        return 0.0 if a.mean() != b.mean() else 1.0
    from scipy.stats import ttest_ind

    return float(ttest_ind(a, b, equal_var=False).pvalue)


def paired_two_sided(a, b) -> float | None:
    """Two-sided p-value of the paired t-test over seeds (``scipy.stats.ttest_rel(a, b)``: ``a[i]`` and
    ``b[i]`` one seed's values); None with fewer than two pairs. Differences that are all equal: p = 0
    when they are not 0, 1 when they are."""
    import numpy as np

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) < 2:
        return None
    if d.var() == 0:
        return 0.0 if d.mean() != 0 else 1.0
    from scipy.stats import ttest_rel

    return float(ttest_rel(a, b).pvalue)


def format_p(p: float | None) -> str:
    """A p-value as the tables print it ("" when untested)."""
    return "" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def find_group(groups: list[SeedGroup], name: str, what: str = "--baseline") -> SeedGroup:
    """The seed group named ``name``: by its label, else by its loss when one group has that loss;
    one VseError when none or several answer to it."""
    found = [g for g in groups if g.label == name] or [g for g in groups if g.rows[0].get("loss") == name]
    if not found:
        labels = ", ".join(g.label for g in groups)
        raise VseError(f"{what} {name!r} names no configuration (one of {labels})")
    if len(found) > 1:
        raise VseError(f"{what} {name!r} names {len(found)} configurations (another code, precision or "
                       "options): give the run name of one")
    return found[0]


def format_cell(key: str, group: SeedGroup, fmt: str) -> str:
    """``mean ± std (n)``; one seed prints its value and ``(1)``."""
    mean, std, n = mean_std(group.samples.get(key, []))
    if n == 0:
        return ""
    text = format_value(key, mean)
    if n > 1:
        text += (r" $\pm$ " if fmt == "latex" else " ± ") + format_value(key, std)
    return f"{text} ({n})"


def format_results(rows, fmt: str = "md", layout: str = "paper", label: str = "run",
                   bold="significant", epochs: bool = False, seeds: bool | None = None,
                   baseline: str | None = None) -> str:
    """The results table of ``rows`` in ``fmt`` (md | latex | csv), one line per row, or per
    configuration with ``seeds`` (default: when some configuration has several seeds);
    ``epochs`` adds the epochs each run needed to reach its best validation M-Recall.
    ``bold``: one of BOLD_MODES (True/False mean "best"/"none", as older callers pass).
    ``baseline``: a configuration (``find_group``); a last column gives each row's p against it,
    Welch's two-sided t-test over seeds of ``HEADLINE`` (one row per configuration)."""
    if fmt not in FORMATS:
        raise VseError(f"unknown table format {fmt!r} (expected {', '.join(FORMATS)})")
    bold = {True: "best", False: "none"}.get(bold, bold)
    if bold not in BOLD_MODES:
        raise VseError(f"unknown bold mode {bold!r} (expected {', '.join(BOLD_MODES)})")
    if not rows:
        raise VseError("no results to tabulate")
    groups = table_columns(rows, layout, epochs)
    keys = [k for _, cols in groups for _, k in cols]
    by_seed = seed_groups(rows, label)
    if seeds is None:
        seeds = any(g.n > 1 for g in by_seed) or baseline is not None
    if baseline is not None and not seeds:
        raise VseError("--baseline compares configurations over their seeds: not with --per-run")
    shown = _precision_shown(rows)
    if seeds:
        labels = [g.label + _tuned(g.rows[0]) + shown(g.rows[0]) + ensemble_label(g.rows[0]) for g in by_seed]
        cells = [[format_cell(k, g, fmt) for k in keys] for g in by_seed]
        best = significant_cells(by_seed, keys) if bold == "significant" else set()
        if bold == "best":
            best = best_cells([{k: g.mean(k) for k in keys} for g in by_seed], keys)
    else:
        labels = [str(row.get(label) if row.get(label) is not None else "") + _tuned(row) + shown(row)
                  + ensemble_label(row) for row in rows]
        cells = [[format_value(k, row.get(k)) for k in keys] for row in rows]
        best = best_cells(rows, keys) if bold == "best" else set()
        # one seed per row: no noise estimate, so "significant" bolds nothing
    firsts = ([(g.label, g.rows[0]) for g in by_seed] if seeds
              else [(str(row.get(label) or ""), row) for row in rows])
    missed = [(name, _unreached(row)) for name, row in firsts]  # the method never began: never a silent row
    labels = code_identity.labelled(labels, [row for _, row in firsts])  # alike names, other code
    labels = [text + (NEVER_BEGAN if note else "") for text, (_, note) in zip(labels, missed)]
    rsums = [g.mean("rsum") for g in by_seed] if seeds else [row.get("rsum") for row in rows]
    at_chance = [row_at_chance(row, rsum) for (_, row), rsum in zip(firsts, rsums)]  # learnt nothing
    labels = [text + (AT_CHANCE if chance else "") for text, chance in zip(labels, at_chance)]
    against = _baseline_column(by_seed, baseline) if baseline is not None else None
    if against is not None:
        groups = [*groups, ("", [(against[0], HEADLINE)])]
    if fmt == "csv":
        return _csv_table(groups, labels, [line + ([against[1][i]] if against else [])
                                           for i, line in enumerate(cells)])
    marked = [[_bold(text, fmt) if (i, k) in best else text for k, text in zip(keys, line)]
              + ([against[1][i]] if against else []) for i, line in enumerate(cells)]
    table = (_latex_table if fmt == "latex" else _markdown_table)(groups, labels, marked)
    mixed = "(network/loss/evaluation precision): the rows differ in it" if shown(rows[0]) else ""
    sizes = "" if len({row_ensemble(row) for row in rows}) < 2 else (
        "(k networks): the mean of k networks' scores; the rows differ in it: compare at equal size "
        "(PROTOCOL, Ensemble size)")
    p_note = (f"p vs {baseline}: Welch's two-sided t-test over seeds of {HEADLINE} against that row"
              if against else "")
    note = "; ".join(part for part in (_table_note(seeds, bold), mixed, sizes, p_note) if part)
    lines = [note] if note else []
    lines += [f"{name}: {missing}" for name, missing in missed if missing]
    lines += [f"{name}: {chance.says(rsum)}"
              for (name, _), rsum, chance in zip(firsts, rsums, at_chance) if chance]
    return table + "".join(("\n\n" if fmt == "md" else "\n% ") + line for line in lines)


def _baseline_column(groups: list[SeedGroup], baseline: str) -> tuple[str, list[str]]:
    """(header, one cell per group): each group's p against the baseline group on ``HEADLINE``."""
    base = find_group(groups, baseline)
    cells = ["(baseline)" if g is base else format_p(welch_two_sided(g.samples.get(HEADLINE, []),
                                                                       base.samples.get(HEADLINE, [])))
             for g in groups]
    return f"p vs {baseline} ({HEADLINE})", cells


def _unreached(row: dict) -> str | None:
    """``training.settings.unreached_phases`` of a row's run (its config.json beside the checkpoint):
    the run's epochs ended before its loss's method began, so the row is another method under that
    loss's name (issue 49). None otherwise, or when the run's folder is not at hand."""
    from pipeline.training.factories import run_schedule_note

    return run_schedule_note(Path(row["checkpoint"]).parent) if row.get("checkpoint") else None


def _tuned(row: dict) -> str:
    """' (tuned 20×3)' for a run whose options `vse tune` chose: its ``tune_budget`` column, else the
    tune.json beside its checkpoint (``training.tune.tune_budget``); '' otherwise."""
    from pipeline.training.tune import tune_budget

    budget = row.get("tune_budget") or (tune_budget(Path(row["checkpoint"]).parent)
                                        if row.get("checkpoint") else None)
    return f" (tuned {budget})" if budget else ""


def row_precision(row: dict) -> str:
    """A results row's precision label (``core.precision``); rows evaluated before it was recorded
    say so."""
    return str(row.get(precision.COLUMN) or precision.UNRECORDED)


def _precision_shown(rows):
    """Row → ' (bf16/fp32/fp32)' when the rows differ in precision (never side by side silently),
    else ''."""
    if len({row_precision(row) for row in rows}) < 2:
        return lambda row: ""
    return lambda row: f" ({row_precision(row)})"


def _table_note(seeds: bool, bold: str) -> str:
    parts = ["mean ± std (n seeds)"] if seeds else []
    if bold == "significant":
        parts.append(f"bold: better than the runner-up by Welch's one-sided t-test over seeds, p < {ALPHA}"
                     if seeds else "no bold: one seed per row gives no noise estimate (--bold best marks "
                     "the best printed value)")
    elif bold == "best":
        parts.append("bold: best value, without a significance test")
    return "; ".join(parts)


def _bold(text: str, fmt: str) -> str:
    return f"\\textbf{{{text}}}" if fmt == "latex" else f"**{text}**"


def _markdown_table(groups, labels, cells) -> str:
    header = ["Model"] + [" ".join(p for p in (SHORT_TITLES.get(title, title), h) if p)
                          for title, cols in groups for h, _ in cols]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for name, line in zip(labels, cells):
        lines.append("| " + " | ".join([_markdown_escape(name), *line]) + " |")
    return "\n".join(lines)


def _markdown_escape(text: str) -> str:
    for ch in "\\|*_`[]<>":
        text = text.replace(ch, "\\" + ch)
    return text


LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                  "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                  "^": r"\textasciicircum{}", "|": r"\textbar{}", "<": r"\textless{}",
                  ">": r"\textgreater{}"}


def latex_escape(text: str) -> str:
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in text)


def _latex_table(groups, labels, cells) -> str:
    """A booktabs tabular (needs \\usepackage{booktabs})."""
    widths = [len(cols) for _, cols in groups]
    lines = [r"\begin{tabular}{l" + "".join("r" * w for w in widths) + "}", r"\toprule"]
    top, rules, column = ["", ], [], 2
    for (title, cols), width in zip(groups, widths):
        top.append(rf"\multicolumn{{{width}}}{{c}}{{{latex_escape(title)}}}" if title else
                   " & ".join([""] * width))
        if title:
            rules.append(rf"\cmidrule(lr){{{column}-{column + width - 1}}}")
        column += width
    lines.append(" & ".join(top) + r" \\")
    if rules:
        lines.append("".join(rules))
    lines.append(" & ".join(["Model"] + [latex_escape(h) for _, cols in groups for h, _ in cols]) + r" \\")
    lines.append(r"\midrule")
    for name, line in zip(labels, cells):
        lines.append(" & ".join([latex_escape(name), *line]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def _csv_table(groups, labels, cells) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["Model"] + [" ".join(p for p in (title, h) if p)
                                 for title, cols in groups for h, _ in cols])
    writer.writerows([name, *line] for name, line in zip(labels, cells))
    return out.getvalue().rstrip("\n")
