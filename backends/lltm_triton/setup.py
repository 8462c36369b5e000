from pathlib import Path

from setuptools import setup

# Everything else is in pyproject.toml; the version is the repository's VERSION file, as for every
# lltm distribution (a link to it here, a file in an sdist).
setup(version=(Path(__file__).resolve().parent / "VERSION").read_text().strip())
