"""The vendors' own scripts (``../shared/reference/``, see its README), run as they are in a side environment.

NVIDIA's and Habana's data scripts need NumPy 1 (under NumPy 2 ``convert_fixed2variable.py``'s lengths wrap) and
SciPy >= 1.17 (1.14's ``optimize.nnls`` segfaults on the packers' matrix); bertpipe's own venv has NumPy 2. So the
differential tests run them with another interpreter:

* ``BERTPIPE_REF_PYTHON``: a python that has ``numpy==1.26.4 scipy==1.17.1 "h5py<3.15" tqdm`` (e.g. CI's), or else
* ``~/.cache/bertpipe/refvenv`` (``BERTPIPE_REF_VENV`` moves it): made once, the first time a test needs it, with
  ``python -m venv`` and pip from PyPI (about 30 s; later sessions reuse it).

The modules are marked ``pytestmark = needs_reference(...)``: where ``../shared/reference`` is absent their tests are
not run, and one skip line for all of them says so (tests/conftest.py; a failure under ``BERTPIPE_REQUIRE_SHARED``);
where the side venv cannot be made (no network) they skip in one line naming the way to give one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tests.conftest import REQUIRE_SHARED, SHARED  # noqa: E402

REFERENCE = SHARED / "reference"
NV31 = REFERENCE / "nvidia-v3.1"
NV11 = REFERENCE / "nvidia-v1.1"
HABANA = REFERENCE / "habana"
PACKAGES = ("numpy==1.26.4", "scipy==1.17.1", "h5py<3.15", "tqdm")
VENV = Path(os.environ.get("BERTPIPE_REF_VENV", Path.home() / ".cache" / "bertpipe" / "refvenv"))


def need_reference() -> Path:
    """../shared/reference, or a one-line skip (a failure under BERTPIPE_REQUIRE_SHARED)."""
    if not (NV31 / "input_preprocessing").is_dir():
        msg = f"{REFERENCE} is absent: the vendors' scripts are not here to run"
        if REQUIRE_SHARED:
            pytest.fail(msg)
        pytest.skip(msg)
    return REFERENCE


def needs_reference(*names: str) -> pytest.MarkDecorator:
    """The mark of a test (or, as ``pytestmark``, a module) that runs the vendors' files ``../shared/reference/<name>``:
    where one is absent the test is not run, and one skip line for every such test says so (tests/conftest.py,
    ``needs_shared``); under BERTPIPE_REQUIRE_SHARED it fails instead."""
    return pytest.mark.needs_shared(*(f"{REFERENCE.relative_to(SHARED).as_posix()}/{n}" for n in names))


def _usable(py: Path) -> bool:
    try:
        r = subprocess.run([str(py), "-c", "import numpy, scipy, h5py, tqdm; assert numpy.__version__[0] == '1'"],
                           capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def ref_python() -> Path:
    """The side interpreter (see the module doc); made once under a lock."""
    need_reference()
    given = os.environ.get("BERTPIPE_REF_PYTHON")
    if given:
        if not _usable(Path(given)):
            pytest.fail(f"BERTPIPE_REF_PYTHON={given} cannot import {', '.join(PACKAGES)} (NumPy 1)")
        return Path(given)
    py = VENV / "bin" / "python"
    if py.exists() and _usable(py):
        return py
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / f".{VENV.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if py.exists() and _usable(py):
            return py
        tmp = VENV.with_name(f"{VENV.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, capture_output=True, timeout=300)
            subprocess.run([str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *PACKAGES], check=True, capture_output=True, timeout=900)
        except (OSError, subprocess.SubprocessError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            msg = (f"could not make the side venv {VENV} ({type(e).__name__}); set BERTPIPE_REF_PYTHON to a python "
                   f"with {' '.join(PACKAGES)}")
            if REQUIRE_SHARED:
                pytest.fail(msg)
            pytest.skip(msg)
        shutil.rmtree(VENV, ignore_errors=True)
        os.replace(tmp, VENV)
    return py


def torch_stub(d: Path) -> Path:
    """A folder holding a stand-in ``torch`` for Habana's packer, which imports torch for a base class and seeds it
    (../shared/reference/README.md: "put a stub torch/utils/data.py with class Dataset: pass on its path"; its
    main() also calls torch.manual_seed, torch.cuda.manual_seed and torch.device, which draw nothing the packs use)."""
    (d / "torch" / "utils").mkdir(parents=True, exist_ok=True)
    (d / "torch" / "__init__.py").write_text(
        "def manual_seed(seed):\n    return None\n\n\nclass cuda:\n    manual_seed = staticmethod(manual_seed)\n\n\n"
        "def device(name):\n    return name\n")
    (d / "torch" / "utils" / "__init__.py").write_text("")
    (d / "torch" / "utils" / "data.py").write_text("class Dataset:\n    pass\n")
    return d


def run_batch(py: Path, calls: list[dict], work: Path, pythonpath: Path | None = None) -> list[str]:
    """Run each call (script, argv, cwd, seed) in one side interpreter (tests/preprocessing/vendor_run.py); ""
    or the exception each ended with. ``pythonpath``: a folder put first on its import path."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "calls.json").write_text(json.dumps([{"seed": None, **c, "script": str(c["script"]),
                                                  "cwd": str(c["cwd"])} for c in calls]))
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    r = subprocess.run([str(py), str(HERE / "vendor_run.py"), str(work / "calls.json"), str(work / "results.json")],
                       capture_output=True, text=True, timeout=1800, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((work / "results.json").read_text())


def run(py: Path, script: Path, *argv: str, cwd: Path, seed: int | None = None) -> None:
    """One script, in its own side interpreter (scripts with a process pool); it must succeed."""
    res = run_batch(py, [{"script": script, "argv": list(argv), "cwd": cwd, "seed": seed}], cwd / ".vendor_run")
    assert res == [""], res
