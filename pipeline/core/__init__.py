"""The foundation every other package stands on: user errors (``errors``), atomic files and
output guards (``fsutil``), the one check of a vse file's format tag (``formats``), device,
precision and seeds (``runtime``), processes (``distributed``, ``runlock``), every training option
(``config``) and every list of built-in names (``registry``), checkpoints (``checkpoint``) and a
user's ``FILE.py:Class`` (``plugin_import``).

May import: nothing of vse (torch-free except ``runtime``, ``distributed`` and ``checkpoint``).
"""
