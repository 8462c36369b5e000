"""Run by `nox -s wheels` in a venv that installed lltm-core and lltm-cpu from wheels by name."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

import lltm_core

SOURCE_TREE = Path(__file__).resolve().parents[2]


def test_packages_come_from_site_packages_not_the_source_tree():
    import lltm_cpu
    import lltm_ref

    paths = sysconfig.get_paths()
    site_packages = {Path(paths["purelib"]).resolve(), Path(paths["platlib"]).resolve()}
    for module in (lltm_core, lltm_ref, lltm_cpu):
        where = Path(module.__file__).resolve()
        assert site_packages & set(where.parents), f"{module.__name__} imported from {where}, not {site_packages}"


def test_info_shows_installed_backends_with_versions():
    out = subprocess.run([sys.executable, "-m", "lltm_core", "info", "--json"], check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    version = (SOURCE_TREE / "VERSION").read_text().strip()
    rows = {b["name"]: b for b in data["backends"]}
    assert rows["cpu"]["distribution"] == "lltm-cpu" and rows["cpu"]["version"] == version
    assert rows["ref"]["distribution"] == "lltm-ref" and rows["ref"]["version"] == version
    assert rows["cpu"]["status"] == "available", rows["cpu"]
    chosen = {(s["device"], s["dtype"]): s["backend"] for s in data["selection"]}
    assert chosen[("cpu", "float32")] == "cpu" and chosen[("cpu", "float64")] == "cpu"


def test_wheel_metadata_asks_for_any_torch_of_the_stable_abi():
    """Every wheel requires torch >= 2.10, the oldest torch `nox -s oldest_torch` runs them on; the
    stable-ABI one never pins the torch it was built with."""
    from importlib.metadata import requires

    for distribution in ("lltm-core", "lltm-ref", "lltm-cpu"):
        reqs = [r.replace(" ", "") for r in requires(distribution)]
        assert "torch>=2.10" in reqs and not any(r.startswith("torch==") for r in reqs), (distribution, reqs)


def test_the_kit_passes_from_the_installed_wheels():
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "lltm_core.testing",
         "--lltm-backend", "cpu", "-k", "matches_reference or gradcheck"],
        check=True,
    )
