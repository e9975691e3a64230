"""Live training curves: TensorBoard scalars in RUN/tb/ (``tensorboard --logdir runs/``).

TensorBoard's own event files, written by ``torch.utils.tensorboard.SummaryWriter`` while the
run trains (flushed every few seconds and after each validation), so the curves can be
watched live. x is the optimizer step (the number of steps done). Tags: ``train/loss``,
``train/lr``, ``train/steps_per_s`` every ``log_every`` steps, and ``val/<metric>`` for every
metric of a validation (the keys of ``metrics.METRICS``, as metrics.jsonl has them).

A resumed run continues its curves without duplicate steps: its writer starts with
``purge_step`` one past the checkpoint's step, TensorBoard's mechanism that discards what an
interrupted process logged after the checkpoint it resumes from. Only rank 0 writes. An
--overwrite run holds its scalars back until it has replaced the old run's files.
"""

from __future__ import annotations

from pathlib import Path

FLUSH_SECONDS = 5


class Curves:
    """The scalars of one run; ``enabled=False`` (ranks other than 0) makes every call a no-op."""

    def __init__(self, folder: Path, purge_step: int | None = None, enabled: bool = True):
        self.folder = Path(folder)
        self.purge_step = purge_step
        self.enabled = enabled
        self._writer = None
        self._held: list[tuple[str, float, int]] = []

    def scalar(self, tag: str, value: float, step: int, hold: bool = False) -> None:
        """Log ``value`` at ``step``; ``hold``: keep it until a call without ``hold``."""
        if not self.enabled:
            return
        self._held.append((tag, float(value), int(step)))
        if not hold:
            writer = self._open()
            for held in self._held:
                writer.add_scalar(*held)
            self._held = []

    def validation(self, metrics: dict, step: int, hold: bool = False) -> None:
        for key, value in metrics.items():
            self.scalar(f"val/{key}", value, step, hold=hold)
        if not hold:
            self.flush()

    def _open(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.folder), purge_step=self.purge_step,
                                         flush_secs=FLUSH_SECONDS)
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
