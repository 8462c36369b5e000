import hashlib
import runpy
from pathlib import Path

import torch
from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = Path(__file__).resolve().parent
# One version for every lltm distribution: the repository's VERSION file.
version = (here.parents[1] / "VERSION").read_text().strip()
config = runpy.run_path(str(here / "lltm_cpu" / "_build_config.py"))

# The library uses only torch's stable ABI of TARGET_TORCH (see
# _build_config.py), so the package takes any torch from that version on.
target = ".".join(map(str, config["TARGET_TORCH"]))
if tuple(int(part) for part in torch.__version__.split(".")[:2]) < config["TARGET_TORCH"]:
    raise RuntimeError(f"lltm-cpu builds against torch >= {target}, and this torch is {torch.__version__}")


def build_info(library: Path) -> str:
    """_build_info.py's text: the torch built against, and the library's size and sha256,
    which lltm_cpu checks before loading it (a truncated or replaced file is then an
    unavailable backend with the reason, not a crashed process)."""
    data = library.read_bytes()
    return (
        "# Written by setup.py beside the library it built: what lltm_cpu checks before loading it.\n"
        f"TORCH_VERSION = {str(torch.__version__)!r}  # built against; it runs on torch >= TARGET_TORCH\n"
        f"TARGET_TORCH = {config['TARGET_TORCH']!r}\n"
        f"LIBRARY_NAME = {library.name!r}\n"
        f"LIBRARY_SIZE = {len(data)}\n"
        f"LIBRARY_SHA256 = {hashlib.sha256(data).hexdigest()!r}\n"
    )

# BuildExtension compiles against the limited API of torch's oldest supported
# Python (0x030A0000 -> 3.10); the wheel's abi3 tag and python_requires must say so.
limited_api = int(cpp_extension.min_supported_cpython, 16)
oldest_python = f"{limited_api >> 24}.{(limited_api >> 16) & 0xFF}"


class BuildExtensionPerISA(BuildExtension):
    """BuildExtension, plus the per-instruction-set sources compiled with their own flags.

    setuptools gives every source of an extension the same flags, so these are
    compiled here and handed to the link as extra objects (after the others).

    It also writes _build_info.py (build_info) beside the library it has just linked: in
    build/lib for a wheel, in the source tree for an editable install.  Were
    every build to write it into the source tree, a wheel built there with
    another torch would relabel an editable install's library.
    """

    def finalize_options(self):
        super().finalize_options()
        # Without ninja, setuptools skips a library newer than its sources, even one built
        # against another torch; with ninja, BuildExtension already forces and ninja decides.
        self.force = True

    def build_extension(self, ext):
        for source, isa_flags in config["ISA_SOURCES"].items():
            ext.extra_objects += self.compiler.compile(
                [source],
                output_dir=self.build_temp,
                macros=ext.define_macros,
                include_dirs=ext.include_dirs,
                extra_postargs={"cxx": ext.extra_compile_args["cxx"] + isa_flags},
                depends=ext.depends,
            )
        super().build_extension(ext)

    def run(self):
        super().run()
        # Now that setuptools has copied the library into the source tree if
        # this is an editable install, get_ext_fullpath names where it lies.
        for ext in self.extensions:
            library = Path(self.get_ext_fullpath(ext.name))
            library.with_name("_build_info.py").write_text(build_info(library))


setup(
    name="lltm-cpu",
    version=version,
    description="Fused CPU kernels (vectorised C++) for the LLTM cell of lltm-core",
    packages=["lltm_cpu"],
    python_requires=f">={oldest_python}",
    install_requires=[f"lltm-core=={version}", f"torch>={target}"],
    entry_points={"lltm.backends": ["cpu = lltm_cpu:load_backend"]},
    ext_modules=[
        CppExtension(
            "lltm_cpu._C",
            config["SOURCES"],
            extra_compile_args={"cxx": config["COMPILE_FLAGS"]},
            extra_link_args=config["LINK_FLAGS"],
            # No Python in it at all (see csrc/lltm.cpp); the abi3 tag says any CPython
            # will do, and with it torch links no libtorch_python.
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtensionPerISA.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp" + oldest_python.replace(".", "")}},
)
