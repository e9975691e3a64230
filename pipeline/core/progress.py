"""Progress of a long command: tqdm's bar on a terminal; off a terminal (a log file, a pipe,
CI) a plain line now and then, so a log holds lines, not one line of hundreds of carriage-return
updates (a full Flickr8k extraction's log was one 20,000-character line)."""

from __future__ import annotations

import sys
import time

PLAIN_EVERY = 30.0  # seconds between two plain lines


def progress_bar(total: int, *, desc: str = "", unit: str = "it", initial: int = 0, disable: bool = False,
                 stream=None, **tqdm_options):
    """A bar with tqdm's interface (``update``, ``set_postfix``, ``close``, a context manager)."""
    stream = stream if stream is not None else sys.stderr
    if disable or not _is_terminal(stream):
        return PlainProgress(total, desc=desc, unit=unit, initial=initial, stream=stream, silent=disable)
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=stream, dynamic_ncols=True,
                **tqdm_options)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class PlainProgress:
    """``desc: n/total unit (p%), rate/s`` on its own line at most every ``every`` seconds, and
    once at the end."""

    def __init__(self, total: int, *, desc: str = "", unit: str = "it", initial: int = 0, stream=None,
                 every: float = PLAIN_EVERY, silent: bool = False):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.stream, self.every, self.silent = stream if stream is not None else sys.stderr, every, silent
        self.started = self.last = time.monotonic()
        self.start_n, self.postfix, self.closed = initial, "", False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._line(now)

    def set_postfix(self, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.n > self.start_n:
                self._line(time.monotonic(), done=True)

    def _line(self, now: float, done: bool = False) -> None:
        if self.silent:
            return
        elapsed = max(now - self.started, 1e-9)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self.start_n) / elapsed
        extra = f", {self.postfix}" if self.postfix else ""
        tail = f" in {elapsed:.0f} s" if done else ""
        print(f"{self.desc + ': ' if self.desc else ''}{self.n}/{self.total} {self.unit}{share}, "
              f"{rate:.1f} {self.unit}/s{tail}{extra}", file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
