from pathlib import Path

from setuptools import setup

# Everything else is in pyproject.toml. The version is the repository's VERSION file, as for every
# lltm distribution (a link to it here, a file in an sdist); lltm-core of the same release, as the
# compiled backends require, and lltm-core's oldest torch.
version = (Path(__file__).resolve().parent / "VERSION").read_text().strip()
setup(version=version, install_requires=[f"lltm-core=={version}", "torch>=2.10", "triton"])
