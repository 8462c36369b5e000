"""Where lltm-cuda's setup.py finds the CUDA toolkit it builds with, and what it tells a machine
that cannot build it.

Beside setup.py, not in the package: only the build uses it, and its tests import it with no
lltm-cuda installed.  The standard library only.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path

# Where CUDA's installers put toolkits, looked at in this order (newest release first within a glob).
CONVENTIONAL_ROOTS = ("/usr/local/cuda", "/usr/local/cuda-*", "/opt/cuda")


def nvcc_release(cuda_home: str) -> str | None:
    """The CUDA release of ``cuda_home/bin/nvcc`` ("13.0"), or None if it does not run."""
    try:
        out = subprocess.run(
            [str(Path(cuda_home, "bin", "nvcc")), "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def is_toolkit_root(path: str | None) -> bool:
    """Whether ``path`` is a CUDA toolkit's root: an executable bin/nvcc and include/cuda_runtime.h."""
    if not path:
        return False
    nvcc = Path(path, "bin", "nvcc")
    return nvcc.is_file() and os.access(nvcc, os.X_OK) and Path(path, "include", "cuda_runtime.h").is_file()


def nvccs_behind(nvcc: str) -> list[tuple[str, str]]:
    """[(path, how)] of the real nvcc that the nvcc on PATH stands for: itself, symbolic links
    resolved, and, for a shell script that runs another nvcc (``exec /usr/local/cuda-13.0/bin/nvcc
    "$@"``), each absolute .../bin/nvcc path the script names."""
    real = os.path.realpath(nvcc)
    found = [(real, f"the nvcc on PATH, {nvcc}" + (f" (a link to {real})" if real != nvcc else ""))]
    try:
        with open(nvcc, "rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return found
    if head.startswith(b"#!"):
        for match in re.finditer(rb"(/[^\s'\"`;|&<>()$]*/bin/nvcc)(?![\w.-])", head):
            named = match.group(1).decode(errors="replace")
            found.append((os.path.realpath(named), f"the nvcc that the wrapper script {nvcc} runs, {named}"))
    return found


def _release_key(path: str) -> tuple[int, ...]:
    """(13, 0) for /usr/local/cuda-13.0: sorts the globbed toolkits newest first."""
    numbers = re.findall(r"\d+", Path(path).name)
    return tuple(int(n) for n in numbers) or (-1,)


def find_cuda_home(explicit: tuple[str, str] | None, torch_guess: str | None, nvcc_on_path: str | None,
                   torch_cuda: str | None = None, release=None,
                   conventional=CONVENTIONAL_ROOTS) -> tuple[str | None, str]:
    """(the toolkit root to build with, why that one): what lltm-cuda builds against.

    ``explicit`` is ("CUDA_HOME", value) when the user set one: used as it is (a wrong one is
    reported, never overridden).  ``torch_guess`` is torch's CUDA_HOME, ``nvcc_on_path`` what
    ``shutil.which("nvcc")`` gives.  The candidates are torch's guess, the nvcc the one on PATH
    stands for, then ``conventional`` (globs allowed, newest release first); of the toolkit roots
    among them the first whose nvcc ``release(root)`` has torch's CUDA major version wins, else
    the first (toolchain_problems then reports the mismatch).  So torch's guess is kept when it
    is a toolkit of the right major, and passed over, saying so, for one that is.  If there is
    no toolkit at all, torch's guess stays (the build then stops with its problem) and the
    reason names every place looked at.
    """
    if explicit is not None:
        return explicit[1], f"{explicit[0]} is set"
    candidates = []  # (root, how it was found), in order of preference
    if torch_guess:
        candidates.append((torch_guess, "torch's guess" + (f" from the nvcc on PATH, {nvcc_on_path}" if nvcc_on_path else "")))
    if nvcc_on_path:
        candidates += [(os.path.dirname(os.path.dirname(path)), how) for path, how in nvccs_behind(nvcc_on_path)]
    empty_patterns = []
    for pattern in conventional:
        roots = sorted(glob.glob(pattern), key=_release_key, reverse=True)
        candidates += [(root, "a usual place for CUDA") for root in roots]
        if not roots:
            empty_patterns.append(pattern)
    toolkits, looked = {}, []
    for root, how in candidates:
        if root in toolkits or root in looked:
            continue
        if is_toolkit_root(root):
            toolkits[root] = how
        else:
            looked.append(root)
    if not toolkits:
        guessed = f"torch guessed {torch_guess}, which is no toolkit root" if torch_guess else "torch found no toolkit"
        return torch_guess, f"{guessed}, and none is in {', '.join(looked + empty_patterns)}"
    roots = list(toolkits)
    passed_over = ""
    if torch_cuda and release is not None:
        major = torch_cuda.split(".")[0]
        releases = {r: release(r) for r in roots}
        matching = [r for r in roots if (releases[r] or "").split(".")[0] == major]
        if matching and matching[0] != roots[0]:
            passed_over = "; ".join(f"{r} has nvcc {releases[r] or '(none that runs)'}" for r in roots[:roots.index(matching[0])])
            passed_over = f"; passed over for torch's CUDA {torch_cuda}: {passed_over}"
        roots = matching or roots
    chosen = roots[0]
    if torch_guess == chosen:
        return chosen, toolkits[chosen] + passed_over
    guessed = (f"torch guessed {torch_guess}" + (", which is no toolkit root" if torch_guess not in toolkits else "")
               if torch_guess else "torch found no toolkit")
    return chosen, f"{toolkits[chosen]}; {guessed}{passed_over}"


def toolchain_problems(torch_version: str, torch_cuda: str | None, cuda_home: str | None, nvcc: str | None) -> list[str]:
    """Why lltm-cuda cannot be built with this torch and CUDA toolkit; empty if it can.

    ``torch_cuda`` is ``torch.version.cuda`` (None for a CPU-only torch),
    ``cuda_home`` the toolkit root torch found (None if none), ``nvcc`` the
    release its bin/nvcc reports (None if it did not run).
    """
    torch_public = torch_version.split("+")[0]
    # The torch build to suggest: one for the CUDA that nvcc provides.
    cu_tag = "cu" + (nvcc or "13.0").replace(".", "")
    problems = []
    if torch_cuda is None:
        problems.append(
            f"torch {torch_version} is a CPU-only build (torch.version.cuda is None): install a CUDA build "
            f"of torch whose CUDA major version matches nvcc's, e.g. torch=={torch_public}+{cu_tag}, "
            f"then build with --no-build-isolation so that torch is used"
        )
    if cuda_home is None:
        problems.append(
            "no CUDA toolkit found: set CUDA_HOME to the toolkit's root (the folder holding bin/nvcc, "
            "e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH"
        )
    elif nvcc is None:
        problems.append(
            f"CUDA_HOME={cuda_home} has no working bin/nvcc: point CUDA_HOME at a CUDA toolkit's root"
        )
    elif not Path(cuda_home, "include", "cuda_runtime.h").is_file():
        # e.g. an nvcc wrapper script in /usr/local/bin made torch guess CUDA_HOME=/usr/local
        problems.append(
            f"CUDA_HOME={cuda_home} is not a CUDA toolkit's root (no include/cuda_runtime.h): set CUDA_HOME "
            f"to the folder holding bin/nvcc, include/ and lib64/, e.g. CUDA_HOME=/usr/local/cuda"
        )
    if torch_cuda is not None and nvcc is not None and torch_cuda.split(".")[0] != nvcc.split(".")[0]:
        problems.append(
            f"nvcc is CUDA {nvcc} but torch {torch_version} was built with CUDA {torch_cuda}; the major "
            f"versions must match: install torch=={torch_public}+{cu_tag}, or set CUDA_HOME to a CUDA "
            f"{torch_cuda.split('.')[0]}.x toolkit"
        )
    return problems
