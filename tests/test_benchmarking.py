"""lltm_core.benchmarking's interleaved timing: what it keeps and what it measures."""

import weakref

from lltm_core.benchmarking import PhaseTimes, interleaved


class _Output:
    """Stands for a candidate's result (a tensor and its autograd graph)."""


def test_a_candidates_results_are_not_kept_while_it_is_timed():
    # Holding results would make each later call allocate fresh memory: the timing would measure that.
    alive_at_call = []
    previous = []

    def candidate():
        alive_at_call.append(sum(ref() is not None for ref in previous))
        out = _Output()
        previous.append(weakref.ref(out))
        return out

    interleaved({"a": candidate}, calls=20, rounds=3, warmup=2)
    assert len(alive_at_call) == 2 + 3 * 20
    assert max(alive_at_call) == 0


def test_phase_times_are_one_sample_per_call():
    times = iter(range(1, 100))

    def candidate():
        t = next(times)
        return PhaseTimes((t, 2 * t))

    timings = interleaved({"a": candidate}, calls=4, rounds=2, warmup=1)
    assert [s[0] for s in timings.samples["a"]] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert timings.rounds[0]["a"] == (3.5, 7.0) and timings.rounds[1]["a"] == (7.5, 15.0)
    assert timings.ratios("a", "a", phase=1) == [1.0, 1.0]
