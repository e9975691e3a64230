"""Training runs: the ``Trainer`` (fit, step, validate, save) and ``build_run`` that hands it
its parts (``trainer``), the factories of each part (``factories``), the run folder with its
files and rules (``run_folder``), TensorBoard curves (``curves``) and grids of runs (``sweep``).

May import: ``pipeline.core``, ``models``, ``text``, ``data``, ``relevance``, ``evaluation``.
"""
