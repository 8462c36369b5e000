from pathlib import Path

from setuptools import setup

# Everything else is in pyproject.toml; the version is the repository's VERSION file, as for every
# lltm distribution.
setup(version=(Path(__file__).resolve().parents[2] / "VERSION").read_text().strip())
