from pathlib import Path

from setuptools import setup

# One version for every lltm distribution: the repository's VERSION (a link to it here, a file in an sdist).
version = (Path(__file__).resolve().parent / "VERSION").read_text().strip()

setup(
    name="lltm-ref",
    version=version,
    description="Reference (pure PyTorch) backend for lltm-core",
    packages=["lltm_ref"],
    python_requires=">=3.10",
    # No dependency on lltm-core: lltm-core depends on lltm-ref (it is the
    # fallback every install gets), and the reverse edge would be a cycle.
    install_requires=["torch>=2.10"],  # the oldest torch tested (nox -s oldest_torch)
    entry_points={"lltm.backends": ["ref = lltm_ref:load_backend"]},
)
