"""A built library's undefined symbols, and which of them belong to torch's own C++ ABI."""

import subprocess

# The C++ namespaces of torch's own ABI, which changes between releases; the stable ABI is C
# functions (aoti_torch_*, torch_*) and header-only code.
TORCH_CPP_NAMESPACES = ("c10::", "at::", "torch::", "caffe2::", "aoti::")


def undefined_symbols(nm: str, library, *, demangle: bool) -> list[tuple[str, str]]:
    """(kind, name) of each symbol ``library`` leaves to other libraries: kind "U" (needed) or "w"
    (weak, may be absent); a C library's name carries its version (name@GLIBC_2.17)."""
    listed = subprocess.run([nm, "-D", "--undefined-only", *(["-C"] if demangle else []), str(library)],
                            capture_output=True, text=True, check=True).stdout
    rows = (line.split(None, 1) for line in listed.splitlines() if line.strip())
    return [(kind, name.strip()) for kind, name in rows]


def torch_cpp_symbols(names) -> list[str]:
    """The names (demangled) in one of torch's C++ namespaces."""
    return [name for name in names if any(namespace in name for namespace in TORCH_CPP_NAMESPACES)]
