"""The papers' figures as PNG and PDF (matplotlib, no display needed).

- ``validation_curves``: validation R@1 (both directions) and rsum per epoch for several runs
  on one figure (VSE++ Fig. 2a, SH vs MH).
- ``negative_set_size``: R@1 against the size of the negative set the hardest negative is
  searched in (VSE++ Fig. 2b), mean ± std over seeds.
- ``epochs_to_best``: epochs to the best validation M-Recall per loss (LSEH's
  training-efficiency figure), mean over runs with each run as a dot.
- ``pool_weights``: the weight a learned pool (VSE∞'s GPO) gives each rank of a full set, per
  run and side, from the "pool_weights" its best checkpoint keeps (VSE∞ Fig. 4).

Figures are built with ``matplotlib.figure.Figure`` (Agg canvas), never pyplot, so no GUI
backend or global state is involved.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from pipeline.core.fsutil import atomic_path, guard_output
from pipeline.training.run_folder import fractional_epochs

FORMAT = "vse-plot"
_FORMAT_TAG = {".png": {"format": FORMAT}, ".pdf": {"Creator": FORMAT}}  # read by fsutil.output_format
FIGURES = ("validation_curves", "negative_set_size", "epochs_to_best", "pool_weights")


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def save_figure(fig, out_stem) -> list[Path]:
    """``out_stem``.png (150 dpi) and ``out_stem``.pdf, each written atomically."""
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix in (".png", ".pdf"):
        path = out_stem.with_name(out_stem.name + suffix)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=150, metadata=_FORMAT_TAG[suffix])
        paths.append(path)
    return paths


def validation_curves(curves: dict[str, list[dict]], out_stem) -> list[Path]:
    """``curves``: run name → its validation records (``runs.read_validation_log``)."""
    fig, axes = _figure(14, 4, 3)
    panels = (("i2t_r1", "caption retrieval R@1"), ("t2i_r1", "image retrieval R@1"), ("rsum", "rsum"))
    for color, (name, records) in zip(_colors(len(curves)), curves.items()):
        x = fractional_epochs(records)
        for ax, (key, _) in zip(axes, panels):
            ax.plot(x, [r[key] for r in records], "-o", ms=3, color=color, label=name)
    for ax, (_, title) in zip(axes, panels):
        ax.set(xlabel="epoch", ylabel=f"validation {title}", title=title)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small")
    return save_figure(fig, out_stem)


def negative_set_size(rows, out_stem, metric: str = "R@1") -> list[Path]:
    """``rows``: dicts with loss, negative_set_size, batch_size, i2t_r1, t2i_r1 (rows without
    a negative set are left out). One line per loss and direction."""
    groups = defaultdict(lambda: defaultdict(lambda: ([], [])))
    for row in rows:
        size = negative_set(row)
        if size is None or row.get("i2t_r1") is None:
            continue
        for direction in ("i2t", "t2i"):
            groups[row.get("loss")][int(size)][direction == "t2i"].append(row[f"{direction}_r1"])
    fig, (ax,) = _figure(6, 4)
    by_loss = sorted(groups.items(), key=lambda kv: str(kv[0]))
    for color, (loss, by_size) in zip(_colors(len(groups)), by_loss):
        sizes = sorted(by_size)
        for index, (direction, style) in enumerate((("caption", "-o"), ("image", "--s"))):
            values = [np.asarray(by_size[s][index], dtype=float) for s in sizes]
            ax.errorbar(sizes, [v.mean() for v in values], yerr=[v.std() for v in values], fmt=style,
                        ms=4, capsize=3, color=color, label=f"{loss} ({direction} retrieval)")
    ax.set_xscale("log", base=2)
    ticks = sorted({size for by_size in groups.values() for size in by_size})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set(xlabel="negative set size (hardest negative searched among k)", ylabel=metric,
           title=f"{metric} against negative set size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, out_stem)


def negative_set(row) -> int | None:
    """How many negatives the hardest one is searched among: the run's negative_set_size,
    or all batch_size - 1 for a plain max-of-hinges run; None where that means nothing."""
    if row.get("negative_set_size") is not None:
        return int(row["negative_set_size"])
    if row.get("loss") == "mh" and row.get("batch_size"):
        return int(row["batch_size"]) - 1
    return None


def epochs_to_best(rows, out_stem) -> list[Path]:
    """``rows``: dicts with loss and epochs_to_best (runs without one are left out)."""
    by_loss = defaultdict(list)
    for row in rows:
        if row.get("epochs_to_best") is not None:
            by_loss[str(row.get("loss"))].append(row["epochs_to_best"])
    losses = sorted(by_loss)
    fig, (ax,) = _figure(max(4.0, 1.2 * len(losses) + 2), 4)
    means = [float(np.mean(by_loss[loss])) for loss in losses]
    ax.bar(range(len(losses)), means, color=_colors(len(losses)), alpha=0.6)
    for i, loss in enumerate(losses):
        ax.plot([i] * len(by_loss[loss]), by_loss[loss], "ko", ms=4)
        ax.annotate(f"{means[i]:.1f}", (i, means[i]), ha="center", va="bottom", xytext=(0, 6),
                    textcoords="offset points")
    ax.set_xticks(range(len(losses)), losses)
    ax.set(xlabel="loss", ylabel="epochs to best validation M-Recall",
           title="Training efficiency (bars: mean, dots: runs)")
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out_stem)


def pool_weights(tables: dict[str, dict], out_stem) -> list[Path]:
    """``tables``: run name → {side: table} (``VSEModel.pool_weights``); the last row of each
    table (the widest set) is drawn over its ranks, image and caption side in two panels."""
    sides = [side for side in ("image", "text") if any(side in t for t in tables.values())]
    fig, axes = _figure(6 * len(sides), 4, len(sides))
    for color, (name, by_side) in zip(_colors(len(tables)), tables.items()):
        for ax, side in zip(axes, sides):
            if side in by_side:
                row = by_side[side][-1]
                ax.plot(range(1, len(row) + 1), row, "-o", ms=3, color=color, label=name)
    for ax, side in zip(axes, sides):
        ax.set(xlabel="rank k (1: the largest value of a dimension)", ylabel="weight θ_k",
               title=f"{'image' if side == 'image' else 'caption'} pool weights, largest set")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="small")
    return save_figure(fig, out_stem)


def run_pool_weights(run_dirs) -> dict[str, dict]:
    """run name → the pool weight tables its best.pt (else last.pt) keeps; runs without any,
    or whose checkpoint cannot be read, are left out.  Loads checkpoints, so torch is imported
    only when a run has one."""
    from pipeline.training.run_folder import RunFolder, run_names

    out = {}
    for name, path in zip(run_names(run_dirs), run_dirs):
        folder = RunFolder(path)
        checkpoint = next((p for p in (folder.best, folder.last) if p.is_file()), None)
        if checkpoint is not None:
            from pipeline.core.checkpoint import load_checkpoint
            from pipeline.core.errors import VseError

            try:
                tables = load_checkpoint(checkpoint).get("pool_weights")
            except VseError:  # the figure is extra: an unreadable checkpoint only loses its line
                continue
            if tables:
                out[name] = tables
    return out


def _colors(n: int):
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def plot_runs(run_dirs, out_dir, results=None, overwrite: bool = False) -> dict[str, list[Path]]:
    """Every figure the runs (and optional results rows) allow, into ``out_dir``.

    Curves come from each run's metrics.jsonl. The other two figures use ``results``
    (test metrics from results.csv) when given, else each run's best validation record.
    Returns figure name → written paths; a figure without enough data is left out.
    """
    from pipeline.reports.batch_eval import validation_rows
    from pipeline.training.run_folder import read_validation_log, run_names

    out_dir = Path(out_dir)
    for name in FIGURES:
        for suffix in _FORMAT_TAG:
            guard_output(out_dir / f"{name}{suffix}", FORMAT, "a vse figure", overwrite)
    run_dirs = [Path(p) for p in run_dirs]
    written = {}
    curves = {name: records for name, records in
              zip(run_names(run_dirs) if run_dirs else [], map(read_validation_log, run_dirs)) if records}
    if curves:
        written["validation_curves"] = validation_curves(curves, out_dir / FIGURES[0])
    rows = list(results) if results else validation_rows(run_dirs)
    metric = "test R@1" if results else "validation R@1"
    sizes = {negative_set(row) for row in rows if row.get("i2t_r1") is not None}
    if len(sizes - {None}) >= 2:
        written["negative_set_size"] = negative_set_size(rows, out_dir / FIGURES[1], metric)
    if any(row.get("epochs_to_best") is not None for row in rows):
        written["epochs_to_best"] = epochs_to_best(rows, out_dir / FIGURES[2])
    tables = run_pool_weights(run_dirs) if run_dirs else {}
    if tables:
        written["pool_weights"] = pool_weights(tables, out_dir / FIGURES[3])
    return written
