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

# The compiled library links against this torch's C++ ABI, so the package
# requires exactly this torch and records it for the check at load time
# (lltm_cpu._load_library).
torch_version = torch.__version__.split("+")[0]  # public version: 2.13.0+cpu -> 2.13.0
BUILD_INFO = (
    "# Written by setup.py beside the library it built: the torch lltm_cpu._C was compiled against.\n"
    f"TORCH_VERSION = {str(torch.__version__)!r}\n"
)

# BuildExtension compiles against the limited API of torch's oldest supported
# Python (0x030A0000 -> 3.10); the wheel's abi3 tag and python_requires must say so.
limited_api = int(cpp_extension.min_supported_cpython, 16)
oldest_python = f"{limited_api >> 24}.{(limited_api >> 16) & 0xFF}"


class BuildExtensionPerISA(BuildExtension):
    """BuildExtension, plus the per-instruction-set sources compiled with their own flags.

    setuptools gives every source of an extension the same flags, so these are
    compiled here and handed to the link as extra objects (after the others).

    It also writes _build_info.py beside the library it has just linked: in
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
            Path(self.get_ext_fullpath(ext.name)).with_name("_build_info.py").write_text(BUILD_INFO)


setup(
    name="lltm-cpu",
    version=version,
    description="Fused CPU kernels (vectorised C++) for the LLTM cell of lltm-core",
    packages=["lltm_cpu"],
    python_requires=f">={oldest_python}",
    install_requires=[f"lltm-core=={version}", f"torch=={torch_version}"],
    entry_points={"lltm.backends": ["cpu = lltm_cpu:load_backend"]},
    ext_modules=[
        CppExtension(
            "lltm_cpu._C",
            config["SOURCES"],
            extra_compile_args={"cxx": config["COMPILE_FLAGS"]},
            extra_link_args=config["LINK_FLAGS"],
            # The library uses only the stable CPython ABI (see csrc/lltm.cpp).
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildExtensionPerISA.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp" + oldest_python.replace(".", "")}},
)
