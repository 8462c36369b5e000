"""``python -m lltm_cuda --library``: print the operator library's path, for a C++ program to load.

Prints nothing else, so a build script can take it as it is:
``LLTM_CUDA_LIBRARY=$(python -m lltm_cuda --library)``.
"""

from __future__ import annotations

import argparse

from . import library_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm_cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--library", action="store_true", help="print the path of the operator library")
    args = parser.parse_args(argv)
    if not args.library:
        parser.error("nothing to do: pass --library")
    print(library_path())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
