"""Elapsed time and ETAs of a sweep's runs, for the runner's progress lines (runner/sweep.py).

``Progress`` is given the estimate of each run still to launch (``runner.estimate.estimate``,
made when the launch starts) and a clock; the sweep tells it when a run starts and ends, and
the progress printer shows, on the ``[i/n]`` line of each run and after every ``round k/N``
line the server prints, the time spent and the time left:

- a run's time left: its rounds' mean seconds so far (the server's round lines end with them)
  times the rounds left; before its first round, its estimate less its elapsed time;
- the sweep's time left: the estimates of the runs not finished, scaled by what the finished
  ones took against their estimates (so an estimate that was short by a third is corrected after
  the first run), less the running runs' elapsed time, divided by the runs going at once.

At the end, ``summary`` compares the time the runs took with the estimate made before them.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.estimate import minutes

ROUND_LINE = re.compile(r"\bround (\d+)/(\d+):")
ROUND_SECONDS = re.compile(r", ([\d.]+)s\s*$")  # the server's round line ends with the round's seconds


@dataclass
class Progress:
    """``estimates``: run index (the sweep's ``[i/n]``) -> estimated seconds of that run (runs
    without one count as the mean of the others); ``low`` / ``high``: the estimate's range of
    all of them; ``workers``: runs going at once; ``clock``: seconds (``time.monotonic``; a test
    passes its own)."""

    estimates: dict[int, float]
    low: float = 0.0
    high: float = 0.0
    workers: int = 1
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    runs: dict[int, dict] = field(default_factory=dict)  # index -> {"start", "end", "rounds": [(k, t)], "of"}
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.started = self.clock() if self.started is None else self.started

    def start(self, i: int) -> str:
        """Run ``i`` starts now: the sweep's elapsed time and time left, for its ``[i/n]`` line."""
        with self.lock:
            self.runs[i] = {"start": self.clock(), "end": None, "rounds": [], "of": None}
            return self.sweep_text()

    def finish(self, i: int) -> None:
        with self.lock:
            if i in self.runs:
                self.runs[i]["end"] = self.clock()

    def line(self, i: int, text: str) -> str:
        """``text`` (a line of run ``i``'s output) with its times appended when it is a
        ``round k/N:`` line of the server; other lines unchanged."""
        found = ROUND_LINE.search(text)
        if not found or i not in self.runs:
            return text
        with self.lock:
            run = self.runs[i]
            k, n = int(found.group(1)), int(found.group(2))
            took = ROUND_SECONDS.search(text)
            run["rounds"].append((k, self.clock(), float(took.group(1)) if took else None))
            run["of"] = n
            return f"{text}  [{self.run_text(i)}; {self.sweep_text()}]"

    def run_text(self, i: int) -> str:
        run, now = self.runs[i], self.clock()
        elapsed = now - run["start"]
        left = self.run_left(i, now)
        return f"run {minutes(elapsed)}" + ("" if left is None else f", ~{minutes(left)} left")

    def run_left(self, i: int, now: float) -> float | None:
        """Seconds run ``i`` has left: its rounds' pace (the seconds the server's round lines
        give, else the time between two round lines), else the scaled estimate less its elapsed
        time; None when it is not known."""
        run = self.runs[i]
        rounds, n = run["rounds"], run["of"]
        given = [s for _, _, s in rounds if s is not None]
        if n and rounds and len(given) == len(rounds):
            return max(0.0, sum(given) / len(given) * (n - rounds[-1][0]))
        if n and len(rounds) >= 2:
            (k0, t0, _), (k1, t1, _) = rounds[0], rounds[-1]
            pace = (t1 - t0) / max(1, k1 - k0)
            return max(0.0, pace * (n - k1))
        estimate = self.estimate_of(i)
        if estimate is None:
            return None
        return max(0.0, estimate * self.scale() - (now - run["start"]))

    def estimate_of(self, i: int) -> float | None:
        if i in self.estimates:
            return self.estimates[i]
        known = list(self.estimates.values())
        return sum(known) / len(known) if known else None

    def scale(self) -> float:
        """What the finished runs took against their estimates (1 before any finished)."""
        done = [(r["end"] - r["start"], self.estimate_of(i)) for i, r in self.runs.items() if r["end"] is not None]
        took, thought = sum(t for t, _ in done), sum(e or 0.0 for _, e in done)
        return took / thought if done and thought > 0 else 1.0

    def sweep_left(self) -> float | None:
        if not self.estimates:
            return None
        now = self.clock()
        left = 0.0
        for i in self.estimates:
            run = self.runs.get(i)
            if run is None:
                left += self.estimates[i] * self.scale()
            elif run["end"] is None:
                left += self.run_left(i, now) or 0.0
        return left / max(1, self.workers)

    def sweep_text(self) -> str:
        elapsed = self.clock() - self.started
        left = self.sweep_left()
        return f"sweep {minutes(elapsed)}" + ("" if left is None else f", ~{minutes(left)} left")

    def summary(self) -> str:
        """The time the runs took against the estimate made before they started."""
        took = self.clock() - self.started
        n = len(self.runs)
        if not self.estimates:
            return f"time: {n} runs took {minutes(took)} (no estimate was made)"
        thought = sum(self.estimates.values())
        inside = self.low <= took <= self.high if self.high else None
        where = ("" if inside is None else ", inside its range" if inside else
                 f", {'above' if took > self.high else 'below'} its range")
        return (f"time: {n} runs took {minutes(took)}; estimated {minutes(thought)} (range {minutes(self.low)} to "
                f"{minutes(self.high)}) before they started: {took / thought:.2f}x the estimate{where}")
