"""Progress off a terminal is plain lines (a log file or a pipe), tqdm's bar on one."""

from __future__ import annotations

import io

from pipeline.core.progress import PlainProgress, progress_bar


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_off_a_terminal_progress_is_lines_not_carriage_returns():
    out = io.StringIO()
    bar = progress_bar(total=1000, desc="extract", unit="img", stream=out)
    assert isinstance(bar, PlainProgress)
    bar.every = 0.0  # a line at every update, to see them
    with bar:
        for _ in range(3):
            bar.update(100)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("extract: 100/1000 img (10%), ") and len(lines) == 4
    assert lines[-1].startswith("extract: 300/1000 img (30%)") and " in " in lines[-1]


def test_lines_come_at_most_every_interval_and_nothing_when_disabled():
    out = io.StringIO()
    with progress_bar(total=10, desc="x", stream=out) as bar:  # default interval: 30 s
        for _ in range(10):
            bar.update()
    assert out.getvalue().count("\n") == 1  # only the closing line
    quiet = io.StringIO()
    with progress_bar(total=10, stream=quiet, disable=True) as bar:
        bar.update(10)
    assert quiet.getvalue() == ""


def test_on_a_terminal_it_is_tqdm():
    from tqdm import tqdm

    bar = progress_bar(total=5, stream=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()
