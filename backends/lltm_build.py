"""What lltm-cpu's and lltm-cuda's setup.py share: the version, the target torch, the abi3
arithmetic, and the _build_info.py each writes beside its library.

Each of those folders links to this file and to the repository's VERSION, so that its sdist
carries both as plain files.  Only the standard library at import: setup.py imports this before
torch, and lltm_cpu's LLTM_CPU_JIT build reads it for TARGET_MACRO.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The oldest torch the libraries are built for: their stable ABI's version, and the wheels' floor.
TARGET_TORCH = (2, 10)
TARGET = ".".join(map(str, TARGET_TORCH))
#: Under it any ATen/c10 header, or a stable function newer than the target, is a compile error
#: (torch/csrc/stable/version.h reads the value).
TARGET_MACRO = f"-DTORCH_TARGET_VERSION=0x{TARGET_TORCH[0]:02x}{TARGET_TORCH[1]:02x}000000000000"


def version() -> str:
    """One version for every lltm distribution: the VERSION beside this file as imported (not
    resolved: in the source tree that is the backend folder's link to the repository's VERSION)."""
    return (Path(os.path.abspath(__file__)).parent / "VERSION").read_text().strip()


def require_build_torch(distribution: str) -> None:
    """Stop the build early if the torch building it is older than TARGET_TORCH."""
    import torch

    release = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if release < TARGET_TORCH:
        raise SystemExit(f"{distribution} builds against torch >= {TARGET}, and this torch is {torch.__version__}")


def oldest_python() -> str:
    """The Python whose limited API BuildExtension compiles against (0x030A0000 -> "3.10"):
    the wheel's abi3 tag and python_requires must say the same."""
    from torch.utils import cpp_extension

    limited_api = int(cpp_extension.min_supported_cpython, 16)
    return f"{limited_api >> 24}.{(limited_api >> 16) & 0xFF}"


def setup_kwargs(**options) -> dict:
    """setup()'s arguments that both backends share; ``options`` adds commands' options."""
    release, python = version(), oldest_python()
    return {
        "version": release,
        "python_requires": f">={python}",
        # The stable ABI: any torch from the target on, never the one that built it.
        "install_requires": [f"lltm-core=={release}", f"torch>={TARGET}"],
        "options": {"bdist_wheel": {"py_limited_api": "cp" + python.replace(".", "")}, **options},
    }


def library_fingerprint(path) -> tuple[int, str]:
    """(size in bytes, sha256 hex digest): lltm_core.extension.library_fingerprint's computation,
    repeated because an isolated build has no lltm-core to import."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def build_info(library: Path, extra: str = "") -> str:
    """_build_info.py's text: what the backend checks before it loads ``library``, then ``extra``
    (the backend's own lines)."""
    import torch

    size, digest = library_fingerprint(library)
    return (
        "# Written by setup.py beside the library it built: what the backend checks before loading it.\n"
        f"LIBRARY_NAME = {library.name!r}\n"
        f"LIBRARY_SIZE = {size}  # bytes\n"
        f"LIBRARY_SHA256 = {digest!r}  # of the whole file\n"
        f"TORCH_VERSION = {str(torch.__version__)!r}  # the torch that built it\n"
        f"TARGET_TORCH = {TARGET_TORCH!r}  # the oldest torch it loads on (stable ABI)\n"
        + extra
    )


def build_ext(base, extra_info: str = ""):
    """``base`` (torch's BuildExtension, or a subclass) that always rebuilds and writes
    _build_info.py (build_info with ``extra_info``) beside each library it links."""

    class BuildExtensionWithInfo(base):
        def finalize_options(self):
            super().finalize_options()
            # Without ninja, setuptools skips a library newer than its sources, even one built
            # against another torch; with ninja, BuildExtension already forces and ninja decides.
            self.force = True

        def run(self):
            super().run()
            # Beside the library as linked: build/lib for a wheel, the source tree for an editable
            # install (setuptools has copied it there by now).  Never elsewhere: a wheel built with
            # another torch must not relabel an editable install's library.
            for ext in self.extensions:
                library = Path(self.get_ext_fullpath(ext.name))
                library.with_name("_build_info.py").write_text(build_info(library, extra_info))

    return BuildExtensionWithInfo
