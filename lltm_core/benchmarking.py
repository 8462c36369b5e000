"""Interleaved timing: the one harness ``lltm bench`` and the scripts in ``benchmarks/`` share.

A shared machine's speed drifts; candidates timed one after another see
different machines, and their ratio measures the drift.  :func:`interleaved`
times them in rounds instead, each candidate in turn within a round and the
order rotating from round to round, so that every round sees all of them at
one speed and a ratio taken within a round (:meth:`Timings.ratios`) is
meaningful.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping


class PhaseTimes(tuple):
    """What a candidate that times itself returns: its phases' times, in order (see :func:`phased`)."""


@dataclass
class Timings:
    """What :func:`interleaved` measured.

    ``samples[name]``: one tuple per sample, in order.  A candidate that times
    itself (returns :class:`PhaseTimes`, as :func:`phased`'s do) gives one
    sample per call: its phases' times.  Any other gives one sample per round: ``(seconds per
    call,)`` over the round's calls.  ``rounds[i][name]`` is round i's mean of
    ``samples`` for each candidate, phase by phase.
    """

    samples: dict[str, list[tuple[float, ...]]]
    rounds: list[dict[str, tuple[float, ...]]] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # name -> "raised Type: message"
    interrupted: bool = False  # Ctrl-C ended the timing (only with keep_going)

    def median(self, name: str, phase: int = 0) -> float:
        return statistics.median(s[phase] for s in self.samples[name])

    def ratios(self, candidate: str, baseline: str, phase: int = 0) -> list[float]:
        """candidate's time / baseline's, one ratio per round."""
        return [r[candidate][phase] / r[baseline][phase] for r in self.rounds if candidate in r and baseline in r]


def phased(*phases: Callable, sync: Callable[[], None] = lambda: None) -> Callable[[], PhaseTimes]:
    """A candidate that times its own phases: each phase gets the previous one's result; ``sync`` after each."""

    def call() -> tuple[float, ...]:
        spent = []
        value = None
        for i, phase in enumerate(phases):
            start = time.perf_counter()
            value = phase() if i == 0 else phase(value)
            sync()
            spent.append(time.perf_counter() - start)
        return PhaseTimes(spent)

    return call


def calls_for(f: Callable, budget_s: float = 0.05) -> int:
    """How many calls of ``f`` fill about ``budget_s`` seconds (at least 3), from one call."""
    start = time.perf_counter()
    f()
    return max(3, int(budget_s / max(time.perf_counter() - start, 1e-7)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def interleaved(candidates: Mapping[str, Callable], *, calls: int = 10, rounds: int | None = None,
                total_calls: int | None = None, seconds: float | None = None, warmup: int = 3,
                keep_going: bool = False) -> Timings:
    """Time ``candidates`` (name -> zero-argument callable; a :class:`PhaseTimes` it returns is its own timing)
    in interleaved rounds of ``calls`` calls each.

    Stops after ``rounds`` rounds, or once each candidate has made ``total_calls``
    calls (the final round shortened to make it exact), or has spent ``seconds``.
    Each candidate is first called ``warmup`` times, untimed.  With
    ``keep_going``, a candidate that raises is dropped (its error in
    ``failures``) while the others go on, and Ctrl-C ends the timing with what
    was measured; without, both propagate.
    """
    if sum(x is not None for x in (rounds, total_calls, seconds)) != 1:
        raise ValueError("interleaved(): give exactly one of rounds, total_calls and seconds")
    live = dict(candidates)
    timings = Timings({name: [] for name in live})
    made = dict.fromkeys(live, 0)
    spent = dict.fromkeys(live, 0.0)

    def run(name: str, n: int) -> tuple[list[tuple[float, ...]], float] | None:
        """(samples, wall seconds) of ``n`` calls, or None if the candidate raised and was dropped."""
        f = live[name]
        phase_times = []
        try:
            start = time.perf_counter()
            for _ in range(n):
                # Only a candidate's own timings are kept: holding its results would keep n outputs (and
                # their autograd graphs) alive, so that its later calls run on fresh memory.
                result = f()
                if isinstance(result, PhaseTimes):
                    phase_times.append(result)
                result = None
            elapsed = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - with keep_going, whatever a candidate raises is its own failure
            if not keep_going:
                raise
            timings.failures[name] = f"raised {_first_line(exc)}"
            del live[name], timings.samples[name]
            return None
        if phase_times:
            return phase_times, elapsed
        return ([(elapsed / n,)] if n else []), elapsed

    try:
        for name in list(live):
            run(name, warmup)
        index = 0
        while live:
            names = list(live)
            shift = index % len(names)
            this_round = {}
            for name in names[shift:] + names[:shift]:
                n = calls if total_calls is None else min(calls, total_calls - made[name])
                if n <= 0:
                    continue
                measured = run(name, n)
                if measured is None:
                    continue
                got, spent_here = measured
                timings.samples[name].extend(got)
                made[name] += n
                spent[name] += spent_here
                this_round[name] = tuple(statistics.fmean(s[i] for s in got) for i in range(len(got[0])))
            timings.rounds.append(this_round)
            index += 1
            if rounds is not None and index >= rounds:
                break
            if total_calls is not None and all(made[n] >= total_calls for n in live):
                break
            if seconds is not None and all(spent[n] >= seconds for n in live):
                break
    except KeyboardInterrupt:
        if not keep_going:
            raise
        timings.interrupted = True
    return timings


# What a benchmark records beside its figures: the CPU, and whether other processes ran meanwhile.


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def busy_cpu_seconds() -> float | None:
    """CPU time all processes have used since boot (Linux), to tell whether others ran meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system
