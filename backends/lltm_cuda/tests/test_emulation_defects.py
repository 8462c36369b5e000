"""Proof that the emulated build catches real bugs: defects planted in a copy of lltm-cuda's sources.

Each defect is one edit of csrc/ (the exact text must be there once, or this test fails and asks
to be updated).  The edited copy is built as an emulated library (only the sequence kernels and the
operator schemas: the sequence tests below need no more), and the conformance kit's sequence tests
run on it through cuda_emulated (LLTM_CUDA_EMULATED_LIBRARY), on the path the defect is in
(LLTM_CUDA_SEQUENCE).  Each must fail where the defect is, naming what is wrong, and pass where it
is not; the untouched sources pass the same tests.  The persistent kernel's defects are races a GPU
would show only sometimes: the emulator's barriers and NaN-filled shared memory make each fail the
kit under every seed tried (25 to 60 each).  A single case with few steps can still come out right
under some thread orders (one step of the split sums' race, 6 seeds in 60), so the cases a race
must fail are ones that run many steps.  LLTM_CUDA_DEFECT_SEEDS=N runs each defect's kit under the
thread orders of seeds 0..N-1 instead of the session's one, and reports every seed a defect
survived: how those counts are taken (a few seconds a run of the kit).

Runs on the emulated build (`nox -s cuda_emulated`); elsewhere it skips, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from _emulated import import_or_skip

lltm_cuda_emulated = import_or_skip()

CSRC = Path(__file__).resolve().parents[1] / "csrc"
# The kit's tests of whole sequences, in the dtypes that take both kernel paths at the kit's sizes.
KIT = ["--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
       "--lltm-dtype", "float64", "--lltm-dtype", "float32", "-k", "lltm_sequence_matches or layer_matches"]
PER_STEP = {"LLTM_CUDA_SEQUENCE": "per-step"}
# The persistent path in float32 over a cluster of two blocks (so a block has a peer), every case
# whose W_h fits a block.
PERSISTENT_KIT = ["--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
                  "--lltm-dtype", "float32", "-k", "(lltm_sequence_matches or layer_matches) and not S1031"]
PERSISTENT = {"LLTM_CUDA_SEQUENCE": "persistent", "LLTM_CUDA_CLUSTER": "2"}
# The grid path in float32 (a cooperative launch of one block a multiprocessor of the emulated GPU).
GRID = {"LLTM_CUDA_SEQUENCE": "grid"}
# The same cases in bfloat16, where the grid path's products run on the tensor cores.
GRID_MMA_KIT = ["--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
                "--lltm-dtype", "bfloat16", "-k", "(lltm_sequence_matches or layer_matches) and not S1031"]


@dataclass(frozen=True)
class Defect:
    name: str
    file: str  # under csrc/cuda
    old: str
    new: str
    fails: str  # a regex every failing test id matches, and at least one does
    must_fail: tuple[str, ...]  # test ids (their [...] part) that must fail
    says: str  # what the kit's message must name
    kit: tuple[str, ...] = tuple(KIT)
    env: tuple[tuple[str, str], ...] = tuple(PER_STEP.items())  # the path the defect is in


def _race(name, old, new, must_fail, first_wrong, path) -> Defect:
    """A defect of the persistent kernels (lltm_persistent.cu), run on the kit of the path it is in."""
    return Defect(name, "lltm_persistent.cu", old, new, fails=r".", must_fail=tuple(f"float32-{m}" for m in must_fail),
                  says=r"lltm_sequence on cuda_emulated, reverse=False, lengths=None: relative error above [0-9.e-]+ "
                       r"in \{'" + first_wrong, kit=tuple(PERSISTENT_KIT), env=tuple(path.items()))


DEFECTS = [
    Defect(
        "lengths-mask-off-by-one", "lltm_common.cuh",
        "return lengths == nullptr || step < lengths[row];",
        "return lengths == nullptr || step <= lengths[row];",
        fails=r"-lengths-|packed-unsorted",
        must_fail=("float64-lengths-forward", "float32-lengths-reverse", "float64-packed-unsorted"),
        says=r"lltm_sequence on cuda_emulated, reverse=(True|False), lengths=tensor\(\[2, 5, 1, 4\]\): "
             r"relative error above [0-9.e-]+ in \{'output'",
    ),
    Defect(
        "vector-path-gate-offset", "lltm_sequence.cu",
        "    const auto pre = load_gates<VEC>(gates, e, state_size);\n    auto c",
        "    auto pre = load_gates<VEC>(gates, e, state_size);\n"
        "    if (VEC > 1) pre.o = pre.z;  // planted: the o gate read at the z gate's offset\n    auto c",
        # The vector path runs at the kit's S16-vector case in every dtype, and at S=6 in float64 (two
        # 8-byte elements a vector): the element path, every other case, is untouched.
        fails=r"float64-L2-bidirectional-batch-first|S16-vector",
        must_fail=("float32-S16-vector", "float64-S16-vector", "float64-L2-bidirectional-batch-first"),
        says=r"LLTMLayer on cuda_emulated, case L2-bidirectional-batch-first: relative error above [0-9.e-]+ in "
             r"\{'output'",
    ),
    Defect(
        "reversed-direction-step-index", "lltm_sequence.cu",
        "const Tensor before = reverse ? ops::narrow(output, 0, 1, T - 1) : ops::narrow(output, 0, 0, T - 1);",
        "const Tensor before = reverse ? ops::narrow(output, 0, 0, T - 1) : ops::narrow(output, 0, 0, T - 1);",
        fails=r"-reverse$|bidirectional|packed-unsorted|unbatched|no-state|S16-vector",  # every reversed run
        must_fail=("float64-full-reverse", "float32-lengths-reverse", "float64-L2-bidirectional-batch-first"),
        says=r"lltm_sequence on cuda_emulated, reverse=True, lengths=None: relative error above [0-9.e-]+ in "
             r"\{'grad_weights'",
    ),
    # The persistent kernel's races: each fails every case (every case runs the kernel).
    *(_race(*row, PERSISTENT) for row in [
        ("persistent-missing-syncthreads",
         "    rt::sync_threads();  // every unit's d_gates in dg_s before the partial product reads them\n", "",
         ("full-forward", "lengths-reverse", "odd-sizes"), "grad_input"),
        ("persistent-single-h-buffer", "const int next = 1 - current;", "const int next = current;",
         ("full-forward", "full-reverse", "T1"), "output"),
        ("persistent-wrong-peer-rank", "rt::map_shared_rank(h_s + i * count, peer)[at] = value;",
         "rt::map_shared_rank(h_s + i * count, rank())[at] = value;", ("full-forward", "lengths-forward", "odd-sizes"),
         "output"),
        ("persistent-missing-cluster-barrier",
         "    // h_t complete in every block before any reads it; and no block leaves while others write to it.\n"
         "    team.sync();\n", "", ("full-forward", "full-reverse", "lengths-reverse"), "output"),
        # The backward's products split among threads (tiles fewer than threads, as at the kit's sizes).
        # A race shows where the shuffled order lets slice 0 add first; T1's single step came out
        # right under 6 of 60 seeds, these cases under none.
        ("persistent-split-sums-missing-barrier",
         "        rt::sync_threads();  // every slice's sums in shared memory before slice 0 adds them\n", "",
         ("full-forward", "lengths-reverse", "L2-bidirectional-batch-first"), "grad_input"),
    ]),
    # The grid path's: without its barriers a block reads h or d_gates the others have not written.
    *(_race(*row, GRID) for row in [
        ("grid-missing-grid-barrier", "void sync() const { rt::grid_sync(); }", "void sync() const {}",
         ("full-forward", "full-reverse", "lengths-reverse"), "output"),
        ("grid-backward-missing-grid-barrier",
         "    rt::grid_sync();  // every unit's d_gates of step t written before any block reads them\n", "",
         ("full-forward", "full-reverse", "lengths-reverse"), "grad_input"),
    ]),
    # The tensor cores' tiles run over the padding of d_gates' buffers: left unwritten (NaN in the
    # emulation, as whatever the allocator held on a GPU), it poisons every row's d_h.
    Defect("grid-mma-padding-not-zeroed", "lltm_persistent.cu",
           "  zero_padding(exchange, p.batch, rows, ld, depth);  // read only after the first grid barrier\n", "",
           fails=r".", must_fail=("bfloat16-full-forward", "bfloat16-lengths-reverse", "bfloat16-odd-sizes"),
           says=r"lltm_sequence on cuda_emulated, reverse=False, lengths=None: relative error above [0-9.e-]+ in "
                r"\{'grad_input'", kit=tuple(GRID_MMA_KIT), env=tuple(GRID.items())),
    # A tile's sums are stored lane by lane (as on a GPU, and so in the emulation): a thread that
    # reads them before the block's barrier reads other lanes' shares from the step before.
    Defect("grid-mma-sums-read-before-barrier", "lltm_persistent.cu",
           "    rt::sync_threads();  // the step's sums complete before the cells read them\n", "",
           fails=r".", must_fail=("bfloat16-full-forward", "bfloat16-lengths-reverse", "bfloat16-odd-sizes"),
           says=r"lltm_sequence on cuda_emulated, reverse=False, lengths=None: relative error above [0-9.e-]+ in "
                r"\{'output'", kit=tuple(GRID_MMA_KIT), env=tuple(GRID.items())),
]

# Built as setup.py builds the emulated library: the same stable-ABI flags (its CXX_FLAGS).  The
# variants that edit one file are built one after another in one build folder, each edit undone
# before the next is made: ninja then recompiles only the sources an edit reaches (one of the
# three, for most), not all three for each variant.
_BUILD = """
import json, shutil, subprocess, sys
from pathlib import Path
from torch.utils import cpp_extension
sys.path.insert(0, {setup_dir!r})
from setup import CXX_FLAGS
name, build_dir, csrc, variants = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
sources = [str(csrc / "lltm.cpp"), str(csrc / "emulation" / "lltm_sequence.cpp"),
           str(csrc / "emulation" / "lltm_persistent.cpp")]
for index, (file, old, new, library) in enumerate(variants):
    path = csrc / "cuda" / file
    pristine = path.read_text()
    path.write_text(pristine.replace(old, new))
    if index == 0:  # writes build.ninja, then builds
        cpp_extension.load(name=name, sources=sources, build_directory=str(build_dir), is_python_module=False,
                           extra_cflags=["-O1", "-DLLTM_CUDA_EMULATE", "-Wno-unknown-pragmas", *CXX_FLAGS])
    else:
        subprocess.run(["ninja", "-j1", "-C", str(build_dir)], check=True)
    shutil.copy(build_dir / (name + ".so"), library)
    path.write_text(pristine)
""".format(setup_dir=str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """{defect name: the built library}: one build after another for the defects of each file, the
    files' builds side by side (each a single compile job)."""
    root = tmp_path_factory.mktemp("defects")
    by_file: dict[str, list[Defect]] = {}
    for defect in DEFECTS:
        text = (CSRC / "cuda" / defect.file).read_text()
        assert text.count(defect.old) == 1, (
            f"{defect.name}: the text to edit is not in csrc/cuda/{defect.file} exactly once; update this "
            f"test to plant the same defect in the sources as they are now")
        by_file.setdefault(defect.file, []).append(defect)
    builds, libraries = [], {}
    for file, defects in by_file.items():
        stem = file.replace(".", "_")
        shutil.copytree(CSRC, root / stem / "csrc")
        (root / stem / "build").mkdir()
        for defect in defects:
            libraries[defect.name] = root / f"{defect.name}.so"
        plan = [(d.file, d.old, d.new, str(libraries[d.name])) for d in defects]
        process = subprocess.Popen([sys.executable, "-c", _BUILD, "lltm_cuda_defect_" + stem,
                                    str(root / stem / "build"), str(root / stem / "csrc"), json.dumps(plan)],
                                   env={**os.environ, "MAX_JOBS": "1"}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        builds.append((file, process))
    for file, process in builds:
        log, _ = process.communicate(timeout=900)
        assert process.returncode == 0, f"building the variants that edit {file} failed:\n{log}"
    missing = [name for name, library in libraries.items() if not library.is_file()]
    assert not missing, f"no library was built for {missing}"
    return libraries


def _kit(library: Path | None, kit=tuple(KIT), path=tuple(PER_STEP.items()),
         seed: str | None = None) -> tuple[int, str]:
    env = {**os.environ, **dict(path)}
    if seed is not None:
        env["LLTM_CUDA_EMULATE_SEED"] = seed
    env.pop(lltm_cuda_emulated.ENV_EMULATED_LIBRARY, None)
    if library is not None:
        env[lltm_cuda_emulated.ENV_EMULATED_LIBRARY] = str(library)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", *kit],
                         capture_output=True, text=True, env=env, timeout=900)
    return run.returncode, run.stdout + run.stderr


@pytest.mark.parametrize("path", ["per-step", "persistent", "grid", "grid-mma"])
def test_the_sources_as_they_are_pass(path):
    forced = {"persistent": PERSISTENT, "grid": GRID, "grid-mma": GRID}
    kit = GRID_MMA_KIT if path == "grid-mma" else PERSISTENT_KIT
    code, out = _kit(None) if path == "per-step" else _kit(None, tuple(kit), tuple(forced[path].items()))
    assert code == 0, out


def _seeds() -> list[str | None]:
    """The thread orders each defect's kit runs under: the session's (None), or LLTM_CUDA_DEFECT_SEEDS=N's 0..N-1."""
    count = os.environ.get("LLTM_CUDA_DEFECT_SEEDS", "").strip()
    if not count:
        return [None]
    assert count.isdigit() and int(count) > 0, f"LLTM_CUDA_DEFECT_SEEDS={count!r}: expected a positive integer"
    return [str(seed) for seed in range(int(count))]


def _caught(defect: Defect, code: int, out: str) -> str | None:
    """None if the kit's run failed where ``defect`` is and said what is wrong, else what it missed."""
    failed = re.findall(r"^FAILED \S+?\[cuda_emulated-([^\]]+)\]", out, flags=re.MULTILINE)
    if code != 1 or not failed:
        return f"the kit did not fail (exit {code})"
    missed = [test_id for test_id in defect.must_fail if test_id not in failed]
    if missed:
        return f"expected {missed} to fail; failed: {failed}"
    elsewhere = [t for t in failed if not re.search(defect.fails, t)]
    if elsewhere:
        return f"tests away from the defect failed too: {elsewhere}"
    if not re.search(defect.says, out):
        return f"no failure says {defect.says!r}"
    return None


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.name for d in DEFECTS])
def test_the_kit_catches_and_names_the_defect(variants, defect):
    missed = {}
    for seed in _seeds():
        code, out = _kit(variants[defect.name], defect.kit, defect.env, seed)
        if (why := _caught(defect, code, out)) is not None:
            missed[seed] = (why, out)
    assert not missed, (f"{defect.name}: " + "; ".join(f"seed {s or 'of the session'}: {why}"
                                                       for s, (why, _) in missed.items())
                        + "\n" + next(iter(missed.values()))[1])
