import runpy
import sys
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = Path(__file__).resolve().parent
# What both compiled backends' builds share (a link to ../lltm_build.py here, a file in an sdist).
sys.path.insert(0, str(here))
import lltm_build  # noqa: E402

config = runpy.run_path(str(here / "lltm_cpu" / "_build_config.py"))
# The library uses only torch's stable ABI of lltm_build.TARGET_TORCH, so the package takes any
# torch from that version on.
lltm_build.require_build_torch("lltm-cpu")


class BuildExtensionPerISA(BuildExtension):
    """BuildExtension, plus the per-instruction-set sources compiled with their own flags.

    setuptools gives every source of an extension the same flags, so these are
    compiled here and handed to the link as extra objects (after the others).
    """

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


setup(
    name="lltm-cpu",
    description="Fused CPU kernels (vectorised C++) for the LLTM cell of lltm-core",
    packages=["lltm_cpu"],
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
    # _build_info.py beside the library: lltm_cpu checks the torch and the file before loading it
    # (a truncated or replaced file is then an unavailable backend with the reason, not a crash).
    cmdclass={"build_ext": lltm_build.build_ext(
        BuildExtensionPerISA,
        f"KERNELS_LEFT_OUT = {config['KERNELS_LEFT_OUT']!r}  # GEMM route: why this build has no kernel for it\n",
    ).with_options(use_ninja=True)},
    **lltm_build.setup_kwargs(),
)
