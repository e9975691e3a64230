"""Results over many runs: one evaluation pass over run folders (``batch_eval``; `vse evaluate
--runs` around it: ``runs_command``), tables (``report``), two runs compared (``compare``),
figures (``plots``) and the HTML gallery (``gallery``). They read runs; they never train.

May import: every package above but ``search``.
"""
