"""A generated hostile-state suite (issue 23, points 1, 5 and 7): what a work dir says must never cost a file
outside it, and corruption behind a manifest must be found.

Each case copies one finished work dir (the three-part text through the whole DAG, built once per session) into
a sandbox beside a "victim" folder, makes the work dir hostile in one way (a class below) at one stage, and runs
one command: ``status``, ``verify``, the library's ``drop_files`` / ``verify_manifest``, or ``bertpipe run``
(``--keep training``, ``--keep all``, ``--force STAGE``). Every case asserts:

* the victim tree is unchanged (every file's md5, every link and folder), and nothing under it was opened,
  listed or hashed while the command ran (an audit hook on open/listdir/scandir, a spy on the native md5
  and on h5py.File);
* the expected one-line outcome: status/verify exit 1 and name the problem (no traceback); a run either
  redoes the stage and says why ("redone tfrecord part-00001-of-00500: manifest corrupt: ..."), after which
  ``status`` is clean, or refuses in one line (exit 2).

The classes: a file entry with '..' or an absolute path (right size and md5 of the victim file), a stage,
key or shard folder that is a link out of the work dir, an output replaced by a link to a copy outside, a
link where an output's folder belongs, a manifest read through a link, no 'files' key, an empty 'files'
list, file entries of the wrong types, an unparseable manifest, a planted or old-format ``_dropped.json``
over a corrupted output, a hostile ``.verified.json``, an output replaced by a folder, and an unlisted file
or link in a folder trainers read whole (``train_dir``, the eval HDF5's folder).

Cases that run the data DAG are few in the default suite (each is a whole cached run); the rest are
``@pytest.mark.slow``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from flowhelpers import BIG, FAST, link_tree, run_cli, snapshot

from bertpipe.cli import main
from core.manifest import MANIFEST_NAME, canonical_json, md5_file

# -- the stages (one unit directory each) -----------------------------------------------------------------
SHARD = "part-00001-of-00500"
PER_SHARD = ("tfrecord", "hdf5")
STAGES = ("text", "vocab", "tfrecord", "hdf5", "bins", "eval_tfrecord", "eval_10k", "eval_hdf5")
TRAINER_READ = {"bins": "data", "eval_hdf5": ""}  # stage -> its folder trainers read whole (relative)


def unit_dir(w: Path, stage: str) -> Path:
    key_dir = next(p for p in (w / stage).iterdir() if p.is_dir())
    return key_dir / SHARD if stage in PER_SHARD else key_dir


def read_manifest(d: Path) -> dict:
    return json.loads((d / MANIFEST_NAME).read_text(encoding="utf-8"))


def write_manifest(d: Path, m: dict, *, digest: bool = True) -> None:
    """Write ``m`` as the unit's manifest; ``digest``: recompute it, as a careful forger would."""
    if digest and isinstance(m.get("files"), list) and all(isinstance(f, dict) for f in m["files"]):
        try:
            files = [[f["name"], f["bytes"], f["md5"]] for f in sorted(m["files"], key=lambda e: str(e["name"]))]
            m["digest"] = hashlib.md5(canonical_json({"stage": m["stage"], "key": m["key"], "files": files})
                                      .encode()).hexdigest()
        except (KeyError, TypeError):
            pass
    replace_file(d / MANIFEST_NAME, json.dumps(m, indent=1).encode())


def replace_file(p: Path, data: bytes) -> None:
    """Write ``p`` as a new file (a sandbox's data files are hard links: never edit one in place)."""
    p.unlink(missing_ok=True)
    p.write_bytes(data)


def first_output(d: Path) -> Path:
    return d / read_manifest(d)["files"][0]["name"]


# -- the classes of hostile state ---------------------------------------------------------------------------
# Each builder makes the work dir ``w`` hostile at ``stage`` (victim folder ``v``) and returns what status and
# verify must say about it.
VICTIM = b"the user's own file, outside the work dir\n" * 50


def _entry(path_of: Callable[[Path, Path], str]) -> Callable[[Path, Path, str], str]:
    def build(w: Path, v: Path, stage: str) -> str:
        d = unit_dir(w, stage)
        m = read_manifest(d)
        m["files"].append({"name": path_of(d, v), "bytes": len(VICTIM), "md5": hashlib.md5(VICTIM).hexdigest()})
        write_manifest(d, m)
        return ""
    return build


def entry_dotdot(w, v, stage):
    _entry(lambda d, v: os.path.relpath(v / "v.txt", d))(w, v, stage)
    return "'..' component"


def entry_abs(w, v, stage):
    _entry(lambda d, v: str(v / "v.txt"))(w, v, stage)
    return "is an absolute path"


def entry_backslash(w, v, stage):
    _entry(lambda d, v: os.path.relpath(v / "v.txt", d).replace("/", "\\"))(w, v, stage)
    return "holds a backslash"


def folder_link(level: str) -> Callable[[Path, Path, str], str]:
    """The stage folder (work/<stage>), its key folder, or its shard folder moved into the victim folder and
    replaced by a link to it."""
    def build(w: Path, v: Path, stage: str) -> str:
        d = unit_dir(w, stage)
        src = {"stage": w / stage, "key": d if stage not in PER_SHARD else d.parent, "shard": d}[level]
        dst = v / f"moved-{src.name}"
        shutil.move(str(src), str(dst))
        os.symlink(dst, src)
        return "outside the work dir"
    return build


def output_link(w, v, stage):
    """An output replaced by a link to a byte-identical copy outside the work dir."""
    out = first_output(unit_dir(w, stage))
    shutil.copy2(out, v / "copy")
    out.unlink()
    os.symlink(v / "copy", out)
    return "symbolic link"


def parent_link(w, v, stage):
    """The bins' data/ folder (what trainers read) replaced by a link to a copy outside."""
    d = unit_dir(w, stage)
    shutil.copytree(d / "data", v / "data")
    shutil.rmtree(d / "data")
    os.symlink(v / "data", d / "data")
    return "symbolic link"


def manifest_link(w, v, stage):
    d = unit_dir(w, stage)
    shutil.copy2(d / MANIFEST_NAME, v / "m.json")
    (d / MANIFEST_NAME).unlink()
    os.symlink(v / "m.json", d / MANIFEST_NAME)
    return "symbolic link, which is never followed"


def no_files(w, v, stage):
    """No 'files' key, over a corrupted output (a vocab.txt behind such a manifest went unnoticed)."""
    d = unit_dir(w, stage)
    _corrupt(first_output(d))
    m = read_manifest(d)
    del m["files"]
    write_manifest(d, m)
    return "no 'files' key"


def empty_files(w, v, stage):
    d = unit_dir(w, stage)
    out = first_output(d)
    m = read_manifest(d)
    m["files"] = []
    write_manifest(d, m)
    replace_file(out, out.read_bytes()[: out.stat().st_size // 2])  # what an empty list hid: a truncated output
    return "'files' list is empty"


WRONG_TYPES = {
    "entry-str": (lambda m: m["files"].__setitem__(0, m["files"][0]["name"]), "is not an object with exactly"),
    "bytes-str": (lambda m: m["files"][0].__setitem__("bytes", str(m["files"][0]["bytes"])), "is not an integer"),
    "bytes-neg": (lambda m: m["files"][0].__setitem__("bytes", -1), "is not an integer >= 0"),
    "md5-int": (lambda m: m["files"][0].__setitem__("md5", 5), "is not 32 lowercase hex"),
    "name-int": (lambda m: m["files"][0].__setitem__("name", 7), "not a string"),
    "files-dict": (lambda m: m.__setitem__("files", {"a": 1}), "'files' is a dict"),
    "upstream-list": (lambda m: m.__setitem__("upstream", ["x"]), "'upstream' is a list"),
    "manifest-list": (lambda m: m.clear(), "no 'stage' key"),
    "extra-key": (lambda m: m.__setitem__("evil", 1), "unknown key 'evil'"),
    "duplicate": (lambda m: m["files"].append(dict(m["files"][0])), "is listed twice"),
    "reserved-name": (lambda m: m["files"][0].__setitem__("name", "_manifest.json"), "keeps for itself"),
}


def wrong_type(variant: str) -> Callable[[Path, Path, str], str]:
    def build(w: Path, v: Path, stage: str) -> str:
        d = unit_dir(w, stage)
        m = read_manifest(d)
        WRONG_TYPES[variant][0](m)
        write_manifest(d, m)
        return WRONG_TYPES[variant][1]
    return build


def unparseable(w, v, stage):
    d = unit_dir(w, stage)
    data = (d / MANIFEST_NAME).read_bytes()
    replace_file(d / MANIFEST_NAME, data[: len(data) // 2])
    return "not JSON"


def _corrupt(out: Path) -> None:
    """Same size, other bytes (a flipped byte in the middle)."""
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    replace_file(out, bytes(data))


def planted_dropped(variant: str) -> Callable[[Path, Path, str], str]:
    """A corrupted output behind a ``_dropped.json`` that does not match the manifest: an old-format record,
    one naming other md5s, a link to a real record elsewhere, or a record that matches, planted in a stage that
    never drops (its files are never deleted by --keep training). The files are checked as usual."""
    def build(w: Path, v: Path, stage: str) -> str:
        d = unit_dir(w, stage)
        m = read_manifest(d)
        _corrupt(first_output(d))
        files = [[f["name"], f["bytes"], "0" * 32] for f in m["files"]]
        record = {"old-format": {"files": len(m["files"]), "bytes": 1, "why": "--keep training",
                                 "when": "2026-01-01T00:00:00"},
                  "other-md5": {"format": 2, "manifest": m["digest"], "files": files, "bytes": 1, "why": "x",
                                "when": "2026-01-01T00:00:00"}}.get(variant)
        good = [[f["name"], f["bytes"], f["md5"]] for f in sorted(m["files"], key=lambda e: e["name"])]
        matching = {"format": 2, "manifest": m["digest"], "files": good, "bytes": 1, "why": "x", "when": "x"}
        if variant == "matching":  # a record that matches its manifest, in a stage that never drops (issue 33.3)
            (d / "_dropped.json").write_text(json.dumps(matching))
        elif record is None:  # a link to a record that would match, kept outside
            (v / "dropped.json").write_text(json.dumps(matching))
            os.symlink(v / "dropped.json", d / "_dropped.json")
        else:
            (d / "_dropped.json").write_text(json.dumps(record))
        return "md5 mismatch"
    return build


def stat_records(w, v, stage):
    """A hostile .verified.json (names out of the folder, wrong types) over a corrupted output."""
    d = unit_dir(w, stage)
    _corrupt(first_output(d))
    st = first_output(d).stat()
    name = read_manifest(d)["files"][0]["name"]
    records = {os.path.relpath(v / "v.txt", d): [len(VICTIM), 0, 0, 0, hashlib.md5(VICTIM).hexdigest()],
               str(v / "v.txt"): "x", name: [st.st_size, "mtime", st.st_ctime_ns, st.st_ino, "nope"]}
    replace_file(d / ".verified.json", json.dumps(records).encode())
    return "md5 mismatch"


def output_folder(w, v, stage):
    out = first_output(unit_dir(w, stage))
    out.unlink()
    out.mkdir()
    (out / "inside").write_text("x")
    return "a folder where an output file belongs"


def unlisted(kind: str) -> Callable[[Path, Path, str], str]:
    """An entry bertpipe did not write in a folder trainers read whole: a plain file (a copy of a real shard,
    which a trainer globbing the folder would read) or a link to a file outside."""
    def build(w: Path, v: Path, stage: str) -> str:
        d = unit_dir(w, stage)
        folder = d / TRAINER_READ[stage]
        real = first_output(d)
        sub = folder / "128" if (folder / "128").is_dir() else folder
        if kind == "file":
            shutil.copy2(real, sub / "extra.hdf5")
        else:
            shutil.copy2(real, v / "extra.hdf5")
            os.symlink(v / "extra.hdf5", sub / "extra.hdf5")
        return "bertpipe did not write in a folder trainers read whole"
    return build


ALL = STAGES
CLASSES: dict[str, tuple[Callable[[Path, Path, str], str], tuple[str, ...]]] = {
    "entry-dotdot": (entry_dotdot, ALL),
    "entry-abs": (entry_abs, ALL),
    "entry-backslash": (entry_backslash, ("tfrecord", "bins")),
    "stage-folder-link": (folder_link("stage"), ALL),
    "key-folder-link": (folder_link("key"), ("tfrecord", "vocab", "bins", "eval_hdf5")),
    "shard-folder-link": (folder_link("shard"), PER_SHARD),
    "output-link": (output_link, ALL),
    "data-folder-link": (parent_link, ("bins",)),
    "manifest-link": (manifest_link, ALL),
    "no-files": (no_files, ALL),
    "empty-files": (empty_files, ALL),
    **{f"wrong-type-{k}": (wrong_type(k), (STAGES[i % len(STAGES)],)) for i, k in enumerate(WRONG_TYPES)},
    "unparseable": (unparseable, ALL),
    **{f"planted-dropped-{k}": (planted_dropped(k), stages) for k, stages in (
        ("old-format", ("tfrecord", "eval_tfrecord")), ("other-md5", ("hdf5", "eval_10k")), ("link", ("text", "tfrecord")),
        ("matching", ("bins", "eval_hdf5", "vocab")))},
    "stat-records": (stat_records, ("tfrecord", "bins")),
    "output-folder": (output_folder, ALL),
    "unlisted-file": (unlisted("file"), tuple(TRAINER_READ)),
    "unlisted-link": (unlisted("link"), tuple(TRAINER_READ)),
}


# -- the sandbox, the victim, the spy --------------------------------------------------------------------------


def data_md5s(w: Path) -> dict[str, str]:
    return {p.relative_to(w).as_posix(): md5_file(p) for p in sorted(w.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.stat().st_size > BIG}


@pytest.fixture(scope="module")
def template(serial_run, tmp_path_factory) -> Iterator[Path]:
    """A private copy (cp -a) of the finished work dir; after the module, its data files must be unchanged (the
    sandboxes hard-link them: every write in bertpipe and in these cases replaces a file, never edits one)."""
    src, _ = serial_run
    t = tmp_path_factory.mktemp("hostile-template") / "w"
    subprocess.run(["cp", "-a", str(src), str(t)], check=True)
    before = data_md5s(t)
    yield t
    assert data_md5s(t) == before, "a case edited a hard-linked data file in place"


def link_copy(src: Path, dst: Path) -> None:
    """``cp -a`` in effect, but data files are hard links (fast); then every stage's .verified.json is renewed
    for the copy, as a first `bertpipe status` would, so a status re-hashes only what a case changed."""
    from core.manifest import write_stat_records

    link_tree(src, dst)
    for m in dst.rglob(MANIFEST_NAME):
        write_stat_records(m.parent, {f["name"]: f["md5"] for f in read_manifest(m.parent)["files"]})


@pytest.fixture
def sandbox(template, tmp_path: Path) -> tuple[Path, Path]:
    """(work dir, victim folder): a copy of the finished work dir beside a victim folder."""
    link_copy(template, tmp_path / "w")
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "v.txt").write_bytes(VICTIM)
    return tmp_path / "w", tmp_path / "victim"


_WATCH: list[str] = []
_TOUCHED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if not _WATCH or event not in ("open", "os.listdir", "os.scandir", "shutil.rmtree", "os.remove", "os.rmdir"):
        return
    path = args[0] if args else None
    if path is None or isinstance(path, int):
        return
    try:
        p = os.fsdecode(path)
        flags = args[2] if event == "open" and len(args) > 2 and isinstance(args[2], int) else 0
        if event in ("os.remove", "os.rmdir") or flags & os.O_NOFOLLOW:  # the last component is not followed
            real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(p))), os.path.basename(p))
        else:
            real = os.path.realpath(p)
    except (TypeError, ValueError, OSError):
        return
    if real == _WATCH[0] or real.startswith(_WATCH[0] + os.sep):
        _TOUCHED.append(f"{event} {os.fsdecode(path)}")


sys.addaudithook(_audit)


@pytest.fixture
def spy(sandbox, monkeypatch):
    """Records every open/listing/removal (audited), native md5 and h5py.File under the victim folder."""
    import h5py

    import core.manifest.format as cm  # the room that hashes

    victim = os.path.realpath(sandbox[1])
    real_md5 = cm._MD5

    class SpyNative:
        def load(self, *a, **k):
            mod = real_md5.load(*a, **k)
            if mod is None:
                return None

            class Proxy:
                @staticmethod
                def md5_files(paths, kernel=None, mapped=False):
                    for p in paths:
                        _audit("open", (p,))
                    return mod.md5_files(paths, kernel, mapped=mapped)
            return Proxy

    monkeypatch.setattr(cm, "_MD5", SpyNative())
    real_init = h5py.File.__init__

    def h5_init(self, name, *a, **k):
        if isinstance(name, (str, os.PathLike)):
            _audit("open", (name,))
        return real_init(self, name, *a, **k)

    monkeypatch.setattr(h5py.File, "__init__", h5_init)
    _TOUCHED.clear()
    _WATCH[:] = []
    yield victim
    _WATCH[:] = []


def armed(victim: str):
    """Context: record accesses under ``victim`` while the command runs."""
    import contextlib

    @contextlib.contextmanager
    def cm():
        _TOUCHED.clear()
        _WATCH[:] = [victim]
        try:
            yield _TOUCHED
        finally:
            _WATCH[:] = []
    return cm()


# -- the cases -------------------------------------------------------------------------------------------------
def _cases(commands: tuple[str, ...], skip: tuple[str, ...] = ()) -> list:
    out = []
    for cls, (_, stages) in CLASSES.items():
        if cls.startswith(skip):
            continue
        for stage in stages:
            for cmd in commands:
                out.append(pytest.param(cls, stage, cmd, id=f"{cls}-{stage}-{cmd}"))
    return out


@pytest.mark.parametrize("cls,stage,cmd", _cases(("status", "verify")))
def test_status_and_verify_name_the_problem_and_touch_nothing_outside(cls, stage, cmd, sandbox, spy, capsys):
    w, v = sandbox
    expect = CLASSES[cls][0](w, v, stage)
    before = snapshot(v)
    capsys.readouterr()
    with armed(spy) as touched:
        rc = main([cmd, "--work-dir", str(w)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    assert rc == 1, f"exit {rc}: {out}{err}"
    bad = [ln for ln in out.splitlines() if expect in ln]
    assert bad, f"{expect!r} not in the {cmd} output:\n{out}"
    if cmd == "verify":
        assert any(ln.startswith(f"BAD  {stage}") for ln in bad), out
        assert "all verify" not in err
    assert snapshot(v) == before, "the victim folder changed"
    assert not touched, f"read outside the work dir: {touched[:5]}"


def _library(d: Path, w: Path) -> str:
    """drop_files (the --keep training deletion) and verify_manifest on the hostile unit ``d``: what happened."""
    from core.errors import ChecksumError, ManifestError
    from core.manifest import drop_files, verify_manifest

    try:
        verify_manifest(d, root=w)
        verified = "verified"
    except (ManifestError, ChecksumError) as exc:
        verified = f"{type(exc).__name__}: {exc}"
    try:
        freed = drop_files(d, "--keep training", root=w)
        dropped = f"dropped {freed}"
    except ManifestError as exc:
        dropped = f"refused: {exc}"
    return f"{verified} | {dropped}"


#: classes whose drop must be refused (nothing deleted) rather than done on the files inside the stage folder
DROP_REFUSED = {"stage-folder-link": "outside the work dir", "key-folder-link": "outside the work dir",
                "shard-folder-link": "outside the work dir", "data-folder-link": "symbolic link",
                "manifest-link": "symbolic link", "unparseable": "not JSON", "no-files": "no 'files' key",
                "empty-files": "'files' list is empty", "entry-dotdot": "'..' component",
                "entry-abs": "absolute path", "entry-backslash": "backslash"}


@pytest.mark.parametrize("cls,stage,cmd", _cases(("library",), skip=("unlisted",)))
def test_drop_files_and_verify_manifest_never_reach_outside(cls, stage, cmd, sandbox, spy):
    w, v = sandbox
    CLASSES[cls][0](w, v, stage)
    before = snapshot(v)
    d = unit_dir(w, stage)
    with armed(spy) as touched:
        what = _library(d, w)
    assert not what.startswith("verified"), what  # never "done"
    if cls.startswith("wrong-type") or cls in DROP_REFUSED:
        assert "refused:" in what and DROP_REFUSED.get(cls, "corrupt") in what.split("refused:")[1], what
    assert snapshot(v) == before, f"the victim folder changed ({what})"
    assert not touched, f"read outside the work dir: {touched[:5]} ({what})"


# -- bertpipe run on a hostile work dir -------------------------------------------------------------------------
RUN_FLAGS = {"keep-training": ["--keep", "training"], "keep-all": [], "force": ["--force", "{stage}"]}
#: run outcome per class: a refusal (exit 2, one line naming this) or a redo (the redone line says this)
REFUSED = {"stage-folder-link": "outside the work dir", "key-folder-link": "outside the work dir",
           "shard-folder-link": "outside the work dir", "unlisted-link": "bertpipe did not write"}
REDONE_WHY = {"entry-dotdot": "manifest corrupt: file name", "entry-abs": "manifest corrupt: file name",
              "entry-backslash": "manifest corrupt: file name", "output-link": "symbolic link",
              "data-folder-link": "symbolic link", "manifest-link": "manifest corrupt:",
              "no-files": "manifest corrupt: no 'files' key", "empty-files": "manifest corrupt: its 'files' list",
              "unparseable": "manifest corrupt: not JSON", "planted-dropped-old-format": "md5 mismatch",
              "planted-dropped-other-md5": "md5 mismatch", "planted-dropped-link": "md5 mismatch",
              "planted-dropped-matching": "md5 mismatch",
              "stat-records": "md5 mismatch", "output-folder": "a folder where an output file belongs",
              "unlisted-file": ""}
#: the few run cases of the default suite (each is a whole run of the DAG); the others are slow
FAST_RUNS = {("entry-dotdot", "tfrecord", "keep-training"), ("stage-folder-link", "tfrecord", "keep-training"),
             ("output-link", "hdf5", "keep-all"), ("unparseable", "tfrecord", "keep-training"),
             ("unlisted-file", "bins", "keep-all"), ("planted-dropped-old-format", "eval_tfrecord", "keep-training"),
             ("entry-abs", "eval_hdf5", "force"), ("data-folder-link", "bins", "keep-training")}


def _run_cases() -> list:
    out = []
    for cls, (_, stages) in CLASSES.items():
        for stage in stages:
            for how in RUN_FLAGS:
                marks = () if (cls, stage, how) in FAST_RUNS else (pytest.mark.slow,)
                out.append(pytest.param(cls, stage, how, id=f"{cls}-{stage}-run-{how}", marks=marks))
    return out


@pytest.mark.parametrize("cls,stage,how", _run_cases())
def test_run_redoes_or_refuses_and_touches_nothing_outside(cls, stage, how, sandbox, spy, three_part_text,
                                                           shared_data, capsys):
    w, v = sandbox
    CLASSES[cls][0](w, v, stage)
    before = snapshot(v)
    flags = [f.format(stage=stage) for f in RUN_FLAGS[how]]
    capsys.readouterr()
    with armed(spy) as touched:
        rc = run_cli("--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST,
                     *flags)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    assert snapshot(v) == before, "the victim folder changed"
    assert not touched, f"read outside the work dir: {touched[:5]}"
    if cls in REFUSED:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and REFUSED[cls] in lines[0], f"exit {rc}: {err}"
        return
    assert rc == 0, f"exit {rc}: {err}"
    if how != "force" and REDONE_WHY.get(cls, "manifest corrupt:"):
        label = SHARD if stage in PER_SHARD else stage
        assert any(ln.startswith(f"  redone {stage} {label}: ") and REDONE_WHY.get(cls, "manifest corrupt:") in ln
                   for ln in out.splitlines()), out
    if cls == "unlisted-file":
        assert not list(w.glob(f"{stage}/*/**/extra.hdf5")), "the unlisted file is still there"
    capsys.readouterr()
    assert main(["status", "--work-dir", str(w)]) == 0, capsys.readouterr().out  # repaired


# -- the rules the cases rely on, directly -------------------------------------------------------------------------
def test_the_suite_is_big_and_covers_every_stage():
    n = len(_cases(("status", "verify"))) + len(_cases(("library",), skip=("unlisted",))) + len(_run_cases())
    assert n >= 400, n
    assert {s for _, stages in CLASSES.values() for s in stages} == set(STAGES)
    assert set(REDONE_WHY) | set(REFUSED) == set(CLASSES) - {k for k in CLASSES if k.startswith("wrong-type")}
