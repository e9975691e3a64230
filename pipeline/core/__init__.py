"""The foundation every other package stands on: user errors (``errors``), atomic files and
output guards (``fsutil``), the one check of a vse file's format tag (``formats``), device,
precision and seeds (``runtime``), processes (``distributed``, ``runlock``), every training option
(``config``) and every list of built-in names (``registry``), checkpoints (``checkpoint``), a
user's ``FILE.py:Class`` (``plugin_import``), the one definition of an image–caption similarity
that networks, losses and metrics share (``similarity``) and what every contract check shares
(``checks``).

May import: nothing of vse (torch-free except ``runtime``, ``distributed``, ``checkpoint`` and
``similarity``).
"""
