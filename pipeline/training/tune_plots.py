"""The pictures of a tune (``vse tune``): Optuna's own matplotlib views of a study under
TUNE/plots/ (pipeline.training.tune runs the study)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.fsutil import atomic_path

PLOTS = ("history", "importance", "slice", "contour")


def write_plots(study, root: Path, echo=print) -> list[Path]:
    """TUNE/plots/*.png from optuna.visualization.matplotlib: the optimisation history, the
    parameters' importance, a slice per parameter, and contours when two or more are searched.
    A plot the trials cannot make yet (importance needs two complete trials) is skipped."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import NullFormatter
    from optuna.visualization import matplotlib as vis

    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if not complete:
        return []
    makers = {"history": vis.plot_optimization_history, "importance": vis.plot_param_importances,
              "slice": vis.plot_slice}
    if len({k for t in complete for k in t.params}) >= 2:
        makers["contour"] = vis.plot_contour
    folder = root / "plots"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in makers.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = make(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as exc:
            echo(f"plot {name}: skipped ({str(exc).splitlines()[0][:120]})")
            continue
        axes = np.ravel(axes)
        figure = axes[0].figure
        if name == "slice":
            figure.set_size_inches(max(6.4, 3.2 * len(axes) + 1), 4.8)
        elif name == "contour" and len(axes) > 1:  # a k × k grid of panels
            side = round(len(axes) ** 0.5)
            figure.set_size_inches(3.6 * side + 1.5, 3.6 * side)
        for ax in axes:  # a log axis' minor labels overlap
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
        path = folder / f"{name}.png"
        with atomic_path(path, suffix=".tmp.png") as tmp:
            figure.savefig(tmp, dpi=100, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written
