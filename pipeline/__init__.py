"""vse: visual-semantic embedding research toolkit (library layer)."""

__version__ = "0.1.0"
