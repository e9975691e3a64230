"""results.csv (one row per evaluated run) and the papers' results tables (md, LaTeX, csv).

Layouts: ``paper`` is the VSE++ / LSEH table (Caption Retrieval R@1 R@10 Med r | Image
Retrieval R@1 R@10 Med r); ``recall`` is R@1 R@5 R@10 per direction plus rsum. CS@K columns
are appended when the rows have them. The best value of each column is bold (the lowest for
Med r), compared as printed, so rows that tie on the page are all bold.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from .batch_eval import RUN_COLUMNS
from .errors import VseError
from .fsutil import atomic_path
from .metrics import METRIC_KEYS

TEXT_COLUMNS = {"run", "loss", "loss_options", "backbone", "train_set", "features", "split",
                "protocol", "checkpoint"}
LOWER_IS_BETTER = ("_medr", "_meanr", "epochs_to_best")
EPOCHS_COLUMN = ("Training", [("Epochs to best", "epochs_to_best")])  # LSEH's efficiency measure
FORMATS = ("md", "latex", "csv")
LAYOUTS = {
    "paper": [("Caption Retrieval", [("R@1", "i2t_r1"), ("R@10", "i2t_r10"), ("Med r", "i2t_medr")]),
              ("Image Retrieval", [("R@1", "t2i_r1"), ("R@10", "t2i_r10"), ("Med r", "t2i_medr")])],
    "recall": [("Caption Retrieval", [("R@1", "i2t_r1"), ("R@5", "i2t_r5"), ("R@10", "i2t_r10")]),
               ("Image Retrieval", [("R@1", "t2i_r1"), ("R@5", "t2i_r5"), ("R@10", "t2i_r10")]),
               ("", [("rsum", "rsum")])],
}


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


def table_columns(rows, layout: str = "paper", epochs: bool = False) -> list[tuple[str, list[tuple[str, str]]]]:
    """Column groups (title, [(header, key)]): the layout's, CS@K when rows have it, and the
    epochs to the best validation M-Recall when ``epochs``."""
    if layout not in LAYOUTS:
        raise VseError(f"unknown table layout {layout!r} (expected {', '.join(LAYOUTS)})")
    groups = [(title, [(h, k) for h, k in cols if any(row.get(k) is not None for row in rows)])
              for title, cols in LAYOUTS[layout]]
    cs = sorted({k for row in rows for k in row if "_cs@" in k},
                key=lambda k: (int(k.split("@")[1]), k))
    if cs:
        groups.append(("Coherent Score", [(("Caption" if k.startswith("i2t") else "Image") + f" CS@{k.split('@')[1]}", k)
                                          for k in cs]))
    if epochs:
        groups.append(EPOCHS_COLUMN)
    return [(title, cols) for title, cols in groups if cols]


def format_value(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if "_cs@" in key:
        return f"{value:.3f}"
    if key == "epochs_to_best":
        return f"{value:.0f}"
    if key.endswith(LOWER_IS_BETTER):
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{value:.1f}"


def best_cells(rows, keys) -> set[tuple[int, str]]:
    """(row index, key) of each column's best printed value (lowest for ranks)."""
    best = set()
    for key in keys:
        printed = [(i, format_value(key, row.get(key))) for i, row in enumerate(rows)]
        values = [(i, float(text)) for i, text in printed if text]
        if len(values) < 2:
            continue
        pick = min if key.endswith(LOWER_IS_BETTER) else max
        target = pick(v for _, v in values)
        best.update((i, key) for i, v in values if v == target)
    return best


def format_results(rows, fmt: str = "md", layout: str = "paper", label: str = "run",
                   bold: bool = True, epochs: bool = False) -> str:
    """The results table of ``rows`` in ``fmt`` (md | latex | csv), one line per row;
    ``epochs`` adds the epochs each run needed to reach its best validation M-Recall."""
    if fmt not in FORMATS:
        raise VseError(f"unknown table format {fmt!r} (expected {', '.join(FORMATS)})")
    if not rows:
        raise VseError("no results to tabulate")
    groups = table_columns(rows, layout, epochs)
    keys = [k for _, cols in groups for _, k in cols]
    best = best_cells(rows, keys) if bold and fmt != "csv" else set()
    cells = [[format_value(k, row.get(k)) for k in keys] for row in rows]
    labels = [str(row.get(label) if row.get(label) is not None else "") for row in rows]
    if fmt == "csv":
        return _csv_table(groups, labels, cells)
    marked = [[_bold(text, fmt) if (i, k) in best else text for k, text in zip(keys, line)]
              for i, line in enumerate(cells)]
    return (_latex_table if fmt == "latex" else _markdown_table)(groups, labels, marked)


def _bold(text: str, fmt: str) -> str:
    return f"\\textbf{{{text}}}" if fmt == "latex" else f"**{text}**"


def _markdown_table(groups, labels, cells) -> str:
    short = {"Caption Retrieval": "Caption", "Image Retrieval": "Image", "Coherent Score": "", "Training": ""}
    header = ["Model"] + [" ".join(p for p in (short.get(title, title), h) if p)
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
    writer.writerow(["Model"] + [" ".join(p for p in (title, h) if p) for title, cols in groups for h, _ in cols])
    writer.writerows([name, *line] for name, line in zip(labels, cells))
    return out.getvalue().rstrip("\n")
