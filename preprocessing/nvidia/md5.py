"""NVIDIA's content checksum of an MLPerf BERT HDF5 shard (``hdf5_md5.py``), and its published ``.chk`` lists.

Reference: NVIDIA MLPerf BERT ``input_preprocessing/hdf5_md5.py`` (training_results v1.1 .. v3.1; spec §10). For a
file it prints ``<basename>\\t<digest>`` where::

    row_sums = [md5(str(row.tolist()).encode("utf-8")).hexdigest() for row in f["input_ids"]]
    digest   = md5(str(row_sums).encode("utf-8")).hexdigest()

so it covers ``input_ids`` only (values and row order, not the HDF5 bytes, dtypes or the other datasets): a
variable-length row hashes as ``"[101, 2023, ...]"``, a padded row with its padding zeros. The rows are read here
in chunks (the script reads row by row) and the outer md5 is fed piece by piece: same digest, bounded memory.

NVIDIA publishes the digests of its own build (``4320_shards_varlength.chk`` etc., one ``name\\tdigest`` line per
shard). Every list of the MLCommons results repositories ships in ``preprocessing/nvidia/nvidia_chk/``, each named by the
chop rule that made it (preprocessing/nvidia/chop.py): the 4,320 chopped shards by v3.1's rule (``nvidia-4320``,
v3.1's list) and by v1.1's (``nvidia-4320-v1.1``, v1.1's list), v3.1's shuffled across shards
(``nvidia-4320-shuffled``), the 2,048 shards by v1.1's rule (``nvidia-2048``, the same list in both rounds: the target ``nvidia-2048-varlength``) and the
eval file (``nvidia-eval``); its README says where each came from.
:func:`verify_against` checks a folder shard by shard against one.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from preprocessing.hdf5_io import reading

#: Rows read at once.
CHUNK_ROWS = 8192
#: Where the published lists live (package data).
CHK_DIR = Path(__file__).resolve().parent / "nvidia_chk"
#: ``--against`` names -> list file (the lists that ship with bertpipe). Written as pairs: these names of NVIDIA's
#: published lists are also the names of the DAG stages that build those sets, and a dict of three stage names is
#: what tests/test_registry.py reads as a stage table kept outside the registry (this is a table of lists).
#: Each name pairs a chop rule with its list: nvidia-4320 (rule v3.1, v3.1's list: the default), nvidia-4320-v1.1
#: (rule v1.1, v1.1's list), nvidia-4320-shuffled (v3.1's shuffle of the v3.1 shards), nvidia-2048 (rule v1.1; the
#: list is byte-identical in v1.1 and v3.1), nvidia-eval.
PUBLISHED = dict((
    ("nvidia-4320", "4320_shards_varlength.chk"),
    ("nvidia-4320-shuffled", "4320_shards_varlength_shuffled.chk"),
    ("nvidia-4320-v1.1", "4320_shards_varlength_v1.1.chk"),
    ("nvidia-2048", "2048_shards_varlength.chk"),
    ("nvidia-eval", "eval_varlength.chk"),
))
#: The chop rule of each published shard list (None: not a chop output of its own); pairs, as PUBLISHED.
RULE_OF = dict((("nvidia-4320", "v3.1"), ("nvidia-4320-shuffled", "v3.1"), ("nvidia-4320-v1.1", "v1.1"),
                ("nvidia-2048", "v1.1"), ("nvidia-eval", None)))
_LINE = re.compile(r"^(\S+)\s+([0-9a-fA-F]{32})\s*$")


def hdf5_md5(path: str | Path, chunk_rows: int = CHUNK_ROWS) -> str:
    """NVIDIA's ``hdf5_md5.py`` digest of ``path`` (its ``input_ids`` rows).

    Raises:
        InputError: the file is missing, not HDF5, or has no ``input_ids`` dataset.
        RecordError: the file is damaged (names it).
    """
    import h5py

    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"HDF5 file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not a readable HDF5 file ({exc}); NVIDIA's checksum reads its input_ids") \
            from None
    outer = hashlib.md5(b"[")
    with f:
        ds = f.get("input_ids")
        if not isinstance(ds, h5py.Dataset) or not ds.shape:
            raise InputError(f"{path} has no input_ids dataset (rows); NVIDIA's hdf5_md5 hashes input_ids")
        n = ds.shape[0]
        for a in range(0, n, chunk_rows):
            with reading(path, f"input_ids rows {a}..{min(a + chunk_rows, n) - 1}"):
                rows = ds[a:a + chunk_rows]
            lists = rows.tolist() if rows.dtype != object else [r.tolist() for r in rows]
            pieces = [hashlib.md5(str(r).encode("utf-8")).hexdigest() for r in lists]
            outer.update(((", " if a else "") + ", ".join(f"'{p}'" for p in pieces)).encode("ascii"))
    outer.update(b"]")
    return outer.hexdigest()


def chk_line(path: str | Path) -> str:
    """The line ``hdf5_md5.py`` prints for ``path``: ``<basename>\\t<digest>``."""
    return f"{Path(path).name}\t{hdf5_md5(path)}"


def read_chk(path: str | Path) -> dict[str, str]:
    """A ``.chk`` list: file name -> digest (blank lines skipped).

    Raises:
        InputError: the file is missing, or a line is not ``name<whitespace>md5`` (names the line), or a name
            appears twice.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"checksum list {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read checksum list {path} ({exc}); it must be NVIDIA's text format "
                         "(name<TAB>md5 per line)") from None
    out: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            raise InputError(f"{path} line {i}: {line[:80]!r} is not 'name<TAB>md5' (NVIDIA's .chk format)")
        name = m.group(1)
        if "/" in name or "\\" in name or name in (".", "..") or name.startswith("~"):
            raise InputError(f"{path} line {i}: {name[:80]!r} is not a file name; a .chk list names the shards of "
                             "one folder (NVIDIA's hdf5_md5.py prints basenames), nothing outside it")
        if name in out:
            raise InputError(f"{path} line {i}: {name} is listed twice")
        out[m.group(1)] = m.group(2).lower()
    if not out:
        raise InputError(f"checksum list {path} lists no files")
    return out


def resolve_chk(against: str) -> Path:
    """``nvidia-4320`` etc. (:data:`PUBLISHED`) -> the shipped list; anything else is a path to a ``.chk``."""
    if against in PUBLISHED:
        p = CHK_DIR / PUBLISHED[against]
        if not p.is_file():
            raise InputError(f"--against {against}: the list {PUBLISHED[against]} is not shipped with this bertpipe "
                             f"(see {CHK_DIR / 'README.md'}); give the path of a .chk file instead")
        return p
    p = Path(against)
    if not p.is_file():
        names = ", ".join(PUBLISHED)
        raise InputError(f"--against {against}: neither a published list ({names}) nor an existing .chk file")
    return p


@dataclass(frozen=True)
class ShardCheck:
    name: str
    expected: str
    actual: str  # "" when the file is missing (or no plain file: ``problem`` says what it is)
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.actual == self.expected and not self.problem


#: bertpipe's bookkeeping, which may sit beside shards (never data to a trainer): not counted as unlisted
_BOOKKEEPING = ("_manifest.json", ".verified.json", "_dropped.json", ".bertpipe.lock")


def unlisted(folder: str | Path, chk: dict[str, str]) -> list[str]:
    """The entries of ``folder`` that ``chk`` does not list (sorted; bertpipe's bookkeeping and the debris of
    killed writers aside): a trainer reading the folder whole would take them for data."""
    from core.manifest import _TMP_NAME

    return sorted(n for n in os.listdir(folder)
                  if n not in chk and n not in _BOOKKEEPING and not _TMP_NAME.match(n))


def _kind(path: Path) -> str:
    """"" for a plain file; else what it is (looked at without following a link)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISREG(mode):
        return ""
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)}), never followed"
    return "a folder" if stat.S_ISDIR(mode) else "not a plain file"


def _digests(paths: Sequence[str]) -> list[str]:
    return [hdf5_md5(p) for p in paths]


def verify_against(folder: str | Path, chk: dict[str, str], *, workers: int = 1) -> list[ShardCheck]:
    """Every listed shard of ``folder`` hashed with :func:`hdf5_md5` and compared (a missing file: actual "")."""
    from core.pools import run_all

    folder = Path(folder)
    names = sorted(chk)
    kinds = {n: _kind(folder / n) for n in names}
    present = [n for n in names if not kinds[n]]
    n_calls = min(len(present), max(1, 4 * workers)) if present else 0
    groups = [present[i::n_calls] for i in range(n_calls)]
    results = run_all(_digests, [([str(folder / n) for n in g],) for g in groups], workers)
    got = {n: d for g, ds in zip(groups, results, strict=True) for n, d in zip(g, ds, strict=True)}
    return [ShardCheck(n, chk[n], got.get(n, ""), "" if kinds[n] in ("", "missing") else kinds[n]) for n in names]
