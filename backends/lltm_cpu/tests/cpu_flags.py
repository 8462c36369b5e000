"""This CPU's feature flags, for the tests that choose what to run by them."""

import os


def cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo lists (none where there is no /proc/cpuinfo)."""
    if not os.path.exists("/proc/cpuinfo"):
        return set()
    with open("/proc/cpuinfo") as f:
        return set(next((line for line in f if line.startswith("flags")), "").split())
