"""Training runs: the ``Trainer`` (fit, step, validate, save; ``trainer``), ``build_run`` that
derives each part's settings once (``settings``) and builds the ``RunParts`` (``parts``) the Trainer
is handed (``build``), the factories of each part (``factories``), the run folder with its files
and rules, its one owner (``run_folder``), TensorBoard curves (``curves``), grids of runs
(``sweep``) and Optuna searches over options (``tune_spec``: the file; ``tune``: the study;
``tune_plots``), Slurm jobs (``launchers``) and ``vse torchrun`` (``torchrun``: torchrun's agent,
its failures to meet in one line).

May import: ``pipeline.core``, ``networks``, ``losses``, ``backbones``, ``text``, ``data``,
``relevance``, ``evaluation``.
"""
