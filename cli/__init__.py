"""The `vse` command-line interface (click). Commands are thin: parse, call pipeline, print."""
