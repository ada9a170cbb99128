"""Progress for the CLI: one helper every subcommand uses (rich, on stderr).

    progress = Progress.for_args(args)        # shown only on a terminal and without --json
    with progress:
        progress("loading specc-tiny")        # a stage: spinner + elapsed time, ticked when the next begins
        tick = progress.counter("stock reference")
        for i, prompt in enumerate(prompts):  # a counted bar: tick(done, total)
            ...; tick(i + 1, len(prompts))

A ``Progress`` is a plain ``callable(str)``, so it goes wherever the Python API takes a
``progress=`` message callback (``compile_artifact``, ``calibrate``); per-item loops take
``progress=progress.counter(label)`` (``run_stock_reference``, ``verify_system``). The Python API
itself stays silent unless given a callback. Disabled, every method is a no-op.
"""

from __future__ import annotations

import sys
from typing import Callable


def interactive() -> bool:
    """Both stdout and stderr are terminals (piped or redirected output gets no progress)."""
    return all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))


class Progress:
    def __init__(self, enabled: bool | None = None):
        self.enabled = interactive() if enabled is None else enabled
        self._rich = None
        self._stage = None

    @classmethod
    def for_args(cls, args) -> "Progress":
        return cls(enabled=not getattr(args, "json", False) and interactive())

    # -- rich plumbing -------------------------------------------------------------------------
    def _live(self):
        if self._rich is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._rich = RichProgress(SpinnerColumn(finished_text="[green]✓[/green]"),
                                      TextColumn("{task.description}"), BarColumn(bar_width=24),
                                      TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=False)
            self._rich.start()
        return self._rich

    def _end_stage(self) -> None:
        if self._stage is not None:
            self._rich.update(self._stage, total=1, completed=1)
            self._rich.stop_task(self._stage)
            self._stage = None

    # -- API -----------------------------------------------------------------------------------
    def __call__(self, message: str) -> None:
        self.stage(message)

    def stage(self, message: str) -> None:
        """Begin a stage (the previous one is marked done)."""
        if not self.enabled:
            return
        live = self._live()
        self._end_stage()
        self._stage = live.add_task(message, total=None, count="")

    def counter(self, label: str) -> Callable[[int, int], None] | None:
        """A ``tick(done, total)`` callback drawing a bar over items; None when disabled."""
        if not self.enabled:
            return None
        state = {}

        def tick(done: int, total: int) -> None:
            live = self._live()
            if "task" not in state:
                state["task"] = live.add_task(label, total=total, count=f"0/{total}")
            live.update(state["task"], completed=done, total=total, count=f"{done}/{total}")
            if done >= total:
                live.stop_task(state["task"])

        return tick

    def done(self) -> None:
        """Finish the current stage and stop drawing."""
        if self._rich is not None:
            self._end_stage()
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.done()
