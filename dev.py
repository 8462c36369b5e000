#!/usr/bin/env python3
"""One entry point for a fresh checkout; needs nothing but python3.

    python3 dev.py bench [lltm bench options]   # set up .venv, then `lltm bench`
    python3 dev.py test  [nox options]          # build and test every distribution (what CI runs)
    python3 dev.py info                         # set up .venv, then `lltm info`

`.venv/` gets the CPU build of torch (pinned: an unpinned install pulls a
multi-GB CUDA build), nox, and lltm-core, lltm-ref and lltm-cpu installed
editable with --no-build-isolation, so the C++ extension is compiled against
that very torch.  It is rebuilt when a source file of a distribution changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
TOOLS = ["torch==2.13.0", "nox", "ninja", "setuptools>=64", "wheel", "pytest", "numpy", "matplotlib"]
DISTRIBUTIONS = [".", "backends/lltm_ref", "backends/lltm_cpu"]
STAMP = VENV / ".lltm-dev-stamp"


def _run(*cmd, **kw) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, **kw)


def _sources_digest() -> str:
    h = hashlib.sha256(" ".join(TOOLS).encode())
    for dist in DISTRIBUTIONS:
        base = ROOT / dist
        files = [base / "VERSION", base / "setup.py", base / "pyproject.toml", base / "lltm_build.py"]
        for sub in ("csrc", "lltm_core", "lltm_ref", "lltm_cpu"):
            if (base / sub).is_dir():
                files += sorted(p for p in (base / sub).rglob("*") if p.suffix in {".py", ".cpp", ".h", ".cu", ".c"})
        for f in files:
            if f.is_file() and "_build_info" not in f.name:
                h.update(str(f.relative_to(ROOT)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def _create_venv() -> None:
    if not PY.exists():
        print(f"creating {VENV.relative_to(ROOT)}/", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)


def ensure_nox() -> None:
    """`test` needs only nox here: every nox session makes its own fresh venv."""
    _create_venv()
    if not (BIN / "nox").exists():
        _run(PY, "-m", "pip", "install", "-q", "nox")


def ensure_venv() -> None:
    digest = _sources_digest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    _create_venv()
    print("installing torch 2.13.0 (CPU) and building lltm-core, lltm-ref, lltm-cpu into .venv/", flush=True)
    _run(PY, "-m", "pip", "install", "-q", *TOOLS)
    editable = [arg for dist in DISTRIBUTIONS for arg in ("-e", dist)]
    env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))}
    _run(PY, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", *editable, env=env)
    STAMP.write_text(digest)


SESSION_GB = 8  # the oldest_torch session's venv (torch 2.10.0 with its CUDA 12 libraries, 7 GB) with its builds


def _free_disk_gb() -> float:
    """Said up front: a full disk otherwise shows only as pip's ENOSPC, mid-run."""
    free_gb = shutil.disk_usage(ROOT).free / 2**30
    print(f"dev.py test: {free_gb:.1f} GB free beside the checkout; the largest session needs about {SESSION_GB} GB",
          flush=True)
    if free_gb < SESSION_GB:
        print("dev.py test: WARNING: likely too little disk; free some, or run sessions alone (nox -s core ...)", flush=True)
    return free_gb


def _lanes(nox_args: list[str], free_gb: float) -> list[list[str]] | None:
    """noxfile.LANES, to run side by side: for the default sessions only (no nox option but posargs
    after "--"), with disk for two sessions at once and more than one core."""
    options = nox_args[: nox_args.index("--")] if "--" in nox_args else nox_args
    if options or free_gb < 2 * SESSION_GB or (os.cpu_count() or 1) < 2:
        return None
    code = "import json, noxfile; print(json.dumps(noxfile.LANES))"
    found = subprocess.run([str(PY), "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(found.stdout)


def _copy_of_tree(destination: Path) -> Path:
    """The checkout as it stands, uncommitted changes included, without its venvs and build output."""
    skip = shutil.ignore_patterns(".git", ".venv", ".nox", "build", "wheelhouse", "__pycache__", "*.egg-info")
    shutil.copytree(ROOT, destination, ignore=skip, symlinks=True)
    return destination


def _run_lanes(lanes: list[list[str]], nox_args: list[str], env: dict[str, str]) -> int:
    """Each lane's sessions in order, the lanes side by side, every line of output prefixed with
    its lane's first session; non-zero when any session fails."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lltm-lanes-") as scratch:
        runs = []
        for index, lane in enumerate(lanes):
            tree = ROOT if index == 0 else _copy_of_tree(Path(scratch) / f"lane{index + 1}")
            command = [str(BIN / "nox"), "-f", str(tree / "noxfile.py"), "-s", *lane, *nox_args]
            print(f"dev.py test: lane {index + 1}: {' '.join(lane)} (in {tree})", flush=True)
            process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, errors="replace", bufsize=1)
            runs.append((lane, process))

        def relay(prefix: str, stream) -> None:
            for line in stream:
                print(f"[{prefix}] {line}", end="", flush=True)

        relays = [threading.Thread(target=relay, args=(f"lane {i + 1}", p.stdout)) for i, (_, p) in enumerate(runs)]
        for thread in relays:
            thread.start()
        codes = [process.wait() for _, process in runs]
        for thread in relays:
            thread.join()
    minutes = (time.monotonic() - started) / 60
    for index, ((lane, _), code) in enumerate(zip(runs, codes)):
        print(f"dev.py test: lane {index + 1} ({' '.join(lane)}): {'passed' if code == 0 else f'FAILED (exit {code})'}",
              flush=True)
    print(f"dev.py test: {minutes:.1f} min in all", flush=True)
    return 0 if all(code == 0 for code in codes) else 1


def _nox_env(nox_args: list[str]) -> dict[str, str]:
    """Each session deletes its venv when it ends (see noxfile.py), so the disk holds one at a time.

    Not when the caller asked nox to reuse venvs, and not when LLTM_NOX_DISCARD_VENVS is already set.
    """
    reuse = any(a in {"-r", "-R", "--reuse-existing-virtualenvs", "--no-install"} or a.startswith("--reuse-venv")
                for a in nox_args)
    env = dict(os.environ)
    env.setdefault("LLTM_NOX_DISCARD_VENVS", "0" if reuse else "1")
    return env


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"bench", "test", "info"}:
        print(__doc__)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    command, rest = argv[0], argv[1:]
    if command == "test":
        ensure_nox()
        lanes = _lanes(rest, _free_disk_gb())
        if lanes is not None:
            return _run_lanes(lanes, rest, _nox_env(rest))
        return subprocess.run([str(BIN / "nox"), *rest], cwd=ROOT, env=_nox_env(rest)).returncode
    ensure_venv()
    return subprocess.run([str(BIN / "lltm"), command, *rest], cwd=ROOT).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
