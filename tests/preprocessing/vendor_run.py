"""Run vendor scripts of ../shared/reference unchanged, several in one interpreter (the side venv's), for the
differential tests: ``python vendor_run.py calls.json results.json``.

Each call is ``{"script": path, "argv": [...], "cwd": dir, "seed": int | null}``: the script runs as ``__main__``
(runpy.run_path, its own source, nothing pasted), with ``sys.argv`` set as a shell would; ``seed`` seeds Python's
``random`` just before it runs (what inserting ``random.seed(seed)`` after its imports does, since importing
NumPy/SciPy/h5py draws nothing from ``random``). The result of each call is "" or the exception it ended with
(``IndexError: ...``), the way the script would die; HDF5 files it left open are closed as its exit would.
This file is our code; it only starts the scripts.
"""

import gc
import json
import os
import random
import runpy
import sys


def close_open_h5() -> None:
    import h5py

    gc.collect()
    for o in gc.get_objects():
        try:
            if isinstance(o, h5py.File) and o.id.valid:
                o.close()
        except Exception:  # noqa: BLE001 - a half-made object
            pass


def main() -> None:
    calls_file, results_file = sys.argv[1:3]
    calls = json.load(open(calls_file))
    out = []
    here = os.getcwd()
    for c in calls:
        os.chdir(c["cwd"])
        sys.argv = [c["script"], *c["argv"]]
        if c.get("seed") is not None:
            random.seed(c["seed"])
        try:
            runpy.run_path(c["script"], run_name="__main__")
            out.append("")
        except SystemExit as e:
            out.append("" if e.code in (None, 0) else f"SystemExit: {e.code}")
        except BaseException as e:  # noqa: BLE001 - how the script died is the result
            out.append(f"{type(e).__name__}: {e}")
        finally:
            close_open_h5()
            os.chdir(here)
    with open(results_file, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
