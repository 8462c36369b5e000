"""python -m lltm_cpu --library: print the path of lltm-cpu's operator library.

A C++ program loads that file (dlopen) to register the lltm_cpu operators,
for example before running an AOTInductor package that calls them.
"""

import argparse
import sys

import lltm_cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", action="store_true", help="print the operator library's path and exit")
    args = parser.parse_args(argv)
    if not args.library:
        parser.print_help()
        return 2
    try:
        print(lltm_cpu.library_path())
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
