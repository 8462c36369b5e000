"""``python -m lltm_cpu --library``: the path of lltm-cpu's operator library, for a C++ program to load."""

import sys

from . import library_path

if sys.argv[1:] != ["--library"]:
    print("usage: python -m lltm_cpu --library   (prints the operator library's path)", file=sys.stderr)
    raise SystemExit(2)
print(library_path())
