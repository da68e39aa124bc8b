"""export-dataset deletes only its own links (issue 23, point 2): a generated suite of hostile OUT states.

Every case builds a sandbox (a small work dir: eval_100.hdf5's rows in 4 x 4 shards, a victim file, other
folders) and an OUT in one hostile state — a stale or copied marker beside a real shard, a materialized backup
(``cp -rL``), a recorded link re-targeted or replaced by a real file, a foreign folder or link, the parent of a
work dir named ``train``, an OUT inside a work dir or stage output, an OUT that is a symlink, a marker with
``..`` or absolute entries, an unparseable, newer or foreign marker — then runs ``bertpipe export-dataset`` in
each layout, with no flag, ``--overwrite`` and ``--replace-copies``. A refusal must be exit 2, one line naming
the path, and the whole sandbox (the work dir included) unchanged, byte for byte. A success must leave the
sandbox unchanged outside OUT's train/, eval/, vocab.txt and marker, every entry there a link into the work
dir, and every real file it replaced byte-equal to the file its link now points to.

The happy paths (re-export over its own export in every layout, no flag), a kill at every step of a re-export
(the next export recovers), a link swapped between the check and its removal, and the lock on OUT follow.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from bertpipe.commands import export_dataset as ed
from tests.loader_rules import flat_training_files, mlperf_eval_files, samsung_bins

LAYOUTS = ("samsung", "nvidia-dle", "habana")
FLAGS = {"noflag": (), "overwrite": ("--overwrite",), "replace-copies": ("--replace-copies",)}
N = 4  # shards per bin
MANAGED = ("train", "eval", "vocab.txt", ed.MARKER)


# -- the sandbox ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def template(golden: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work dir as `bertpipe run` leaves it (lock file, last_run.json, bins/<key>/data, eval HDF5, vocab):
    eval_100.hdf5's 100 rows dealt into 4 x 4 shards of the six datasets, two of them empty."""
    import h5py

    from tests.loader_rules import SIX

    w = tmp_path_factory.mktemp("export_template") / "work"
    with h5py.File(golden / "eval_100.hdf5", "r") as f:
        rows = {k: f[k][:] for k in SIX}
    sizes = [9, 0, 7, 8, 6, 5, 0, 7, 8, 6, 7, 9, 6, 8, 7, 7]
    assert sum(sizes) == 100
    first = 0
    for i, n in enumerate(sizes):
        b, k = (128, 256, 384, 512)[i // N], i % N
        (w / f"bins/k1/data/{b}").mkdir(parents=True, exist_ok=True)
        with h5py.File(w / f"bins/k1/data/{b}/part_{k}_of_{N}.hdf5", "w") as h:
            for key, a in rows.items():
                h.create_dataset(key, data=a[first:first + n], compression="gzip")
        first += n
    (w / "eval_hdf5/k2").mkdir(parents=True)
    shutil.copy(w / "bins/k1/data/128/part_0_of_4.hdf5", w / "eval_hdf5/k2/eval_10k.hdf5")  # 9 rows: small
    (w / "vocab/k3").mkdir(parents=True)
    (w / "vocab/k3/vocab.txt").write_text("".join((shared_data / "vocab.txt").read_text().splitlines(True)[:400]))
    (w / ".bertpipe.lock").write_text("")
    return w


def make_work(template: Path, where: Path) -> Path:
    """The template work dir at ``where`` (its files hard links: nothing a case does may change them, and
    the snapshots would show it) with its own last_run.json."""
    shutil.copytree(template, where, copy_function=os.link)
    outputs = {"train_dir": str(where / "bins/k1/data"), "eval_hdf5": str(where / "eval_hdf5/k2/eval_10k.hdf5"),
               "vocab": str(where / "vocab/k3/vocab.txt")}
    (where / "last_run.json").write_text(json.dumps({"work_dir": str(where), "stages": {}, "outputs": outputs}))
    return where


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> md5 (files), 'dir', 'link:<target>' or 'other'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[rel] = hashlib.md5(f.read()).hexdigest()
            else:
                out[rel] = "other"
    return out


def export(work: Path, out: Path | str, layout: str = "samsung", *flags: str) -> tuple[int, str]:
    """`bertpipe export-dataset` in this process: (exit status, stderr and logged warnings)."""
    from bertpipe.cli import main

    err = io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["export-dataset", "--layout", layout, "--work-dir", str(work), str(out), *flags, "-q"])
    finally:
        logging.getLogger().removeHandler(handler)
    return rc, err.getvalue()


def own_export(s: Path, out: Path, layout: str = "samsung") -> None:
    rc, err = export(s / "work", out, layout)
    assert rc == 0, err


def check_export(out: Path, work: Path, layout: str) -> None:
    """OUT holds the layout's links, each into the work dir, and nothing else in train/ and eval/."""
    data = (work / "bins/k1/data").resolve()
    for dirpath, _, filenames in os.walk(out / "train"):
        for n in filenames:
            p = Path(dirpath) / n
            assert p.is_symlink() and os.path.isabs(os.readlink(p)), p
            assert p.resolve().is_relative_to(data) and p.resolve().parent.parent == data, p
    if layout == "samsung":
        bins = samsung_bins(out / "train")
        assert [b for b, _ in bins] == [128, 256, 384, 512] and all(len(f) == N for _, f in bins)
        assert all(Path(f).resolve() == data / str(b) / Path(f).name for b, fs in bins for f in fs)
    else:
        import h5py

        files = flat_training_files(out / "train")
        assert sorted(os.listdir(out / "train")) == [Path(f).name for f in files]
        rows = []
        for f in files:
            with h5py.File(f, "r") as h:
                rows.append(h["input_ids"].shape[0])
        assert sum(rows) == 100 and min(rows) > 0 and len(files) == 4 * N - 2  # the two empty shards left out
    evals = mlperf_eval_files(out / "eval")
    assert os.listdir(out / "eval") == ["part_eval_10k.hdf5"] and (out / "eval/part_eval_10k.hdf5").is_symlink()
    assert Path(evals[0]).resolve() == (work / "eval_hdf5/k2/eval_10k.hdf5").resolve()
    assert (out / "vocab.txt").is_symlink() and (out / "vocab.txt").resolve() == (work / "vocab/k3/vocab.txt").resolve()
    m = json.loads((out / ed.MARKER).read_text())
    assert (m["format"], m["version"], m["complete"], m["layout"]) == (ed.FORMAT, 2, True, layout)
    assert m["out"] == str(out.resolve()) and "previous" not in m
    on_disk = {str(p.relative_to(out)) for root in ("train", "eval", "vocab.txt") for p in
               ([out / root] if root == "vocab.txt" else (out / root).rglob("*")) if p.is_symlink()}
    assert set(m["links"]) == on_disk and all(os.readlink(out / n) == t for n, t in m["links"].items())


def _h5_bytes() -> bytes:
    return b"\x89HDF\r\n\x1a\n" + os.urandom(64)


def _cp_materialized(src: Path, dst: Path) -> None:
    """`cp -rL src dst`: every link replaced by a copy of what it points to."""
    shutil.copytree(src, dst, symlinks=False)


def _edit_marker(out: Path, change: Callable[[dict], None]) -> None:
    m = json.loads((out / ed.MARKER).read_text())
    change(m)
    (out / ed.MARKER).write_text(json.dumps(m))


# -- the hostile states -------------------------------------------------------------------------------------
# name -> builder(sandbox) -> (OUT, work dir to export, expect); expect(layout, flags) -> None (success) or the
# text the one-line refusal must contain.
STATES: dict[str, Callable] = {}


def state(fn: Callable) -> Callable:
    STATES[fn.__name__.replace("_", "-")] = fn
    return fn


def always(text: str) -> Callable:
    return lambda layout, flags: text


def ok_with_copies_in_samsung(refuse_plain: str, refuse_other_layout: str) -> Callable:
    """A copy of a samsung export: --replace-copies re-exports it as samsung, refuses other layouts."""
    def expect(layout: str, flags: tuple) -> str | None:
        if "--replace-copies" not in flags:
            return refuse_plain
        return None if layout == "samsung" else refuse_other_layout
    return expect


@state
def own_export_again(s):  # the happy path inside the matrix: a previous export of any layout is replaced
    own_export(s, s / "out", "nvidia-dle")
    (s / "out/notes.txt").write_text("mine")
    return s / "out", s / "work", lambda layout, flags: None


@state
def stale_own_marker_and_real_shard(s):
    own_export(s, s / "out")
    (s / "out/train/128/my_real_shard.hdf5").write_bytes(_h5_bytes())
    return s / "out", s / "work", always("train/128/my_real_shard.hdf5")


@state
def copied_marker_and_real_shard(s):
    own_export(s, s / "exp0")
    (s / "out/train/128").mkdir(parents=True)
    shutil.copy(s / "exp0" / ed.MARKER, s / "out" / ed.MARKER)
    (s / "out/train/128/my_real_shard.hdf5").write_bytes(_h5_bytes())
    return s / "out", s / "work", lambda layout, flags: (
        "my_real_shard.hdf5" if "--replace-copies" in flags else "was written for")


@state
def materialized_backup(s):
    own_export(s, s / "exp0")
    _cp_materialized(s / "exp0", s / "out")
    return s / "out", s / "work", ok_with_copies_in_samsung("was written for", "train/128/part_0_of_4.hdf5")


@state
def materialized_backup_one_file_differs(s):
    own_export(s, s / "exp0")
    _cp_materialized(s / "exp0", s / "out")
    with open(s / "out/train/256/part_1_of_4.hdf5", "ab") as f:
        f.write(b"\0")
    return s / "out", s / "work", lambda layout, flags: (
        "was written for" if "--replace-copies" not in flags else
        "part_1_of_4.hdf5 is a file that differs" if layout == "samsung" else "train/128/part_0_of_4.hdf5")


@state
def materialized_backup_without_marker(s):
    own_export(s, s / "exp0")
    _cp_materialized(s / "exp0", s / "out")
    (s / "out" / ed.MARKER).unlink()
    return s / "out", s / "work", lambda layout, flags: (
        "is not empty" if not flags else "train/ is a folder" if "--overwrite" in flags else
        None if layout == "samsung" else "train/128/ is a folder")


@state
def materialized_backup_moved_here(s):  # the same folder under another name (mv): its marker still matches
    own_export(s, s / "exp0")
    _cp_materialized(s / "exp0", s / "copy")
    m = json.loads((s / "copy" / ed.MARKER).read_text())
    st = os.stat(s / "copy")
    m["out_id"] = [st.st_dev, st.st_ino]
    (s / "copy" / ed.MARKER).write_text(json.dumps(m))
    os.rename(s / "copy", s / "out")
    return s / "out", s / "work", ok_with_copies_in_samsung("part_0_of_4.hdf5 is a file", "train/128/part_0_of_4.hdf5")


@state
def recorded_link_retargeted(s):
    own_export(s, s / "out")
    (s / "out/train/128/part_0_of_4.hdf5").unlink()
    os.symlink(s / "victim.txt", s / "out/train/128/part_0_of_4.hdf5")
    return s / "out", s / "work", always("part_0_of_4.hdf5 is a symlink export-dataset did not make")


@state
def recorded_link_now_a_real_file(s):
    own_export(s, s / "out")
    p = s / "out/train/256/part_1_of_4.hdf5"
    p.unlink()
    p.write_bytes(_h5_bytes())
    return s / "out", s / "work", lambda layout, flags: (
        "part_1_of_4.hdf5 is a file that differs" if "--replace-copies" in flags and layout == "samsung"
        else "train/256/part_1_of_4.hdf5")


@state
def recorded_link_now_a_copy(s):
    own_export(s, s / "out")
    p = s / "out/train/256/part_1_of_4.hdf5"
    p.unlink()
    shutil.copy(s / "work/bins/k1/data/256/part_1_of_4.hdf5", p)
    return s / "out", s / "work", ok_with_copies_in_samsung("train/256/part_1_of_4.hdf5", "train/256/part_1_of_4")


@state
def recorded_link_now_a_hard_link(s):
    own_export(s, s / "out")
    p = s / "out/train/384/part_2_of_4.hdf5"
    p.unlink()
    os.link(s / "work/bins/k1/data/384/part_2_of_4.hdf5", p)
    return s / "out", s / "work", ok_with_copies_in_samsung("train/384/part_2_of_4.hdf5", "train/384/part_2_of_4")


@state
def recorded_folder_now_a_work_dir(s):
    own_export(s, s / "out")
    shutil.rmtree(s / "out/eval")
    make_work(s / "work", s / "out/eval")
    return s / "out", s / "work", always("eval, a bertpipe work dir")


@state
def foreign_empty_folder_in_train(s):
    own_export(s, s / "out")
    (s / "out/train/extra").mkdir()
    return s / "out", s / "work", always("train/extra/ is a folder export-dataset did not make")


@state
def foreign_link_folder_no_marker(s):
    (s / "out").mkdir()
    os.symlink(s / "victims", s / "out/train")
    return s / "out", s / "work", lambda layout, flags: "is not empty" if not flags else "out/train is a symlink"


@state
def foreign_eval_folder_with_marker(s):
    own_export(s, s / "out", "nvidia-dle")
    shutil.rmtree(s / "out/eval")
    (s / "out/eval").mkdir()
    (s / "out/eval/my_eval.hdf5").write_bytes(_h5_bytes())
    return s / "out", s / "work", always("eval/my_eval.hdf5 is a file")


@state
def vocab_txt_is_a_real_file(s):
    (s / "out").mkdir()
    (s / "out/vocab.txt").write_text("[PAD]\nmine\n")
    return s / "out", s / "work", lambda layout, flags: (
        "is not empty" if not flags else "vocab.txt is a file that differs" if "--replace-copies" in flags
        else "vocab.txt is a file, not a link")


@state
def notes_beside_no_marker(s):
    (s / "out").mkdir()
    (s / "out/notes.txt").write_text("mine")
    return s / "out", s / "work", lambda layout, flags: "is not empty" if not flags else None


@state
def parent_of_a_work_dir_named_train(s):
    (s / "out").mkdir()
    make_work(s / "work", s / "out/train")
    return s / "out", s / "work", always("out/train, a bertpipe work dir")


@state
def parent_of_a_work_dir_named_train_with_marker(s):
    own_export(s, s / "exp0")
    (s / "out").mkdir()
    shutil.copy(s / "exp0" / ed.MARKER, s / "out" / ed.MARKER)
    make_work(s / "work", s / "out/train")
    return s / "out", s / "work", always("out/train, a bertpipe work dir")


@state
def parent_of_the_exported_work_dir(s):
    (s / "out").mkdir()
    w = make_work(s / "work", s / "out/train")
    return s / "out", w, always("holds")


@state
def out_is_the_work_dir(s):
    return s / "work", s / "work", always("is inside")


@state
def out_inside_the_work_dir(s):
    return s / "work/exports", s / "work", always("is inside")


@state
def out_inside_another_work_dir(s):
    (s / "w2").mkdir()
    (s / "w2/.bertpipe.lock").write_text("")
    return s / "w2/sub/out", s / "work", always(".bertpipe.lock")


@state
def out_inside_a_work_dir_by_last_run(s):
    (s / "w2").mkdir()
    (s / "w2/last_run.json").write_text("{}")
    return s / "w2/out", s / "work", always("last_run.json")


@state
def out_inside_a_stage_output(s):
    (s / "w3/bins/k").mkdir(parents=True)
    (s / "w3/bins/k/_manifest.json").write_text("{}")
    return s / "w3/bins/k/out", s / "work", always("_manifest.json")


@state
def out_inside_a_split_output(s):
    (s / "x4/4bins").mkdir(parents=True)
    (s / "x4/4bins.manifest.json").write_text("{}")
    return s / "x4/4bins", s / "work", always("4bins.manifest.json")


@state
def out_symlink_to_an_export(s):
    own_export(s, s / "exp0")
    os.symlink(s / "exp0", s / "out")
    return s / "out", s / "work", always("is a symlink")


@state
def out_symlink_to_the_work_dir(s):
    os.symlink(s / "work", s / "out")
    return s / "out", s / "work", always("is a symlink")


@state
def out_symlink_to_victims(s):
    os.symlink(s / "victims", s / "out")
    return s / "out", s / "work", always("is a symlink")


def _marker_state(change: Callable[[dict, Path], None], text: str) -> Callable:
    def build(s):
        own_export(s, s / "out")
        _edit_marker(s / "out", lambda m: change(m, s))
        return s / "out", s / "work", always(text)
    return build


for _name, _change in {
    "marker-link-dotdot": lambda m, s: m["links"].__setitem__("train/../../victim.txt", str(s / "victim.txt")),
    "marker-link-escapes-root": lambda m, s: m["links"].__setitem__("../victim.txt", str(s / "victim.txt")),
    "marker-link-absolute": lambda m, s: m["links"].__setitem__(str(s / "victim.txt"), str(s / "victim.txt")),
    "marker-link-outside-roots": lambda m, s: m["links"].__setitem__("notes.txt", str(s / "victim.txt")),
    "marker-target-relative": lambda m, s: m["links"].__setitem__("train/x.hdf5", "../victim.txt"),
    "marker-previous-dotdot": lambda m, s: m.__setitem__("previous", {"eval/../../victim.txt": "/x"}),
    "marker-dir-dotdot": lambda m, s: m["dirs"].append(".."),
    "marker-dir-absolute": lambda m, s: m["dirs"].append(str(s / "victims")),
    "marker-links-a-list": lambda m, s: m.__setitem__("links", [str(s / "victim.txt")]),
}.items():
    STATES[_name] = _marker_state(_change, ed.MARKER)


def _raw_marker_state(text: str, must: str) -> Callable:
    def build(s):
        own_export(s, s / "out")
        (s / "out" / ed.MARKER).write_text(text)
        return s / "out", s / "work", always(must)
    return build


STATES["marker-unparseable"] = _raw_marker_state('{"format": "bertpipe-export", "vers', "not a readable")
STATES["marker-a-list"] = _raw_marker_state("[1, 2]", "not a JSON object")
STATES["marker-someone-elses"] = _raw_marker_state('{"layout": "tpu", "links": {}}', "no \"format\"")
STATES["marker-newer-version"] = _raw_marker_state('{"format": "bertpipe-export", "version": 9}', "newer bertpipe")
STATES["marker-version-bool"] = _raw_marker_state('{"format": "bertpipe-export", "version": true}', "version True")


@state
def marker_is_a_symlink(s):
    own_export(s, s / "exp0")
    own_export(s, s / "out")
    (s / "out" / ed.MARKER).unlink()
    os.symlink(s / "exp0" / ed.MARKER, s / "out" / ed.MARKER)
    return s / "out", s / "work", always("is not a file (a symlink)")


def _v1_export(s: Path, out: Path) -> None:
    """What export-dataset version 1 left: the samsung links and a marker that recorded none of them."""
    data = s / "work/bins/k1/data"
    for b in (128, 256, 384, 512):
        (out / f"train/{b}").mkdir(parents=True)
        for k in range(N):
            os.symlink(data / str(b) / f"part_{k}_of_{N}.hdf5", out / f"train/{b}/part_{k}_of_{N}.hdf5")
    (out / "eval").mkdir()
    os.symlink(s / "work/eval_hdf5/k2/eval_10k.hdf5", out / "eval/part_eval_10k.hdf5")
    os.symlink(s / "work/vocab/k3/vocab.txt", out / "vocab.txt")
    (out / ed.MARKER).write_text(json.dumps({"layout": "samsung", "work_dir": str(s / "work"), "train_dir": str(data),
                                             "eval_hdf5": str(s / "work/eval_hdf5/k2/eval_10k.hdf5"),
                                             "vocab": str(s / "work/vocab/k3/vocab.txt"), "complete": True}))


@state
def version_1_export(s):
    _v1_export(s, s / "out")
    return s / "out", s / "work", lambda layout, flags: None


@state
def version_1_export_and_real_file(s):
    _v1_export(s, s / "out")
    (s / "out/train/512/notes.txt").write_text("mine")
    return s / "out", s / "work", always("train/512/notes.txt is a file")


@state
def version_1_link_outside_its_data_set(s):
    _v1_export(s, s / "out")
    os.symlink(s / "victim.txt", s / "out/train/128/part_9_of_4.hdf5")
    return s / "out", s / "work", always("part_9_of_4.hdf5 is a symlink export-dataset did not make")


@state
def killed_first_marker_write(s):  # a kill inside the first atomic marker write: only its temp file is there
    (s / "out").mkdir()
    (s / "out" / f".{ed.MARKER}.tmp-4242").write_text("{")
    return s / "out", s / "work", lambda layout, flags: None


CASES = [(f"{name}-{layout}-{flag}", name, layout, FLAGS[flag]) for name in STATES for layout in LAYOUTS
         for flag in FLAGS]


def sandbox(template: Path, root: Path) -> Path:
    s = root / "s"
    s.mkdir()
    make_work(template, s / "work")
    (s / "victim.txt").write_text("the user's file\n")
    (s / "victims").mkdir()
    (s / "victims/a.hdf5").write_bytes(b"\x89HDF\r\n\x1a\nvictim")
    return s


def _managed(rel: str, out_rel: str) -> bool:
    """``rel`` (a sandbox path) is under OUT's train/, eval/, vocab.txt or the marker."""
    return any(rel == f"{out_rel}/{m}" or rel.startswith(f"{out_rel}/{m}/") for m in MANAGED)


#: state -> (sandbox, OUT, work dir, expect, snapshot): a sandbox that a refused case left unchanged (asserted)
#: serves the state's next case; one that a successful export changed is built again.
_BUILT: dict[str, tuple] = {}


@pytest.mark.parametrize("name,layout,flags", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_out(name: str, layout: str, flags: tuple, template: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> None:
    if name not in _BUILT:
        s = sandbox(template, tmp_path_factory.mktemp(name))
        _BUILT[name] = (s, *STATES[name](s), snapshot(s))
    s, out, work, expect, before = _BUILT.pop(name)
    want = expect(layout, flags)
    rc, err = export(work, out, layout, *flags)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    after = snapshot(s)
    if want is not None:
        assert rc == 2, f"exit {rc}: {err!r}"
        assert len(lines) == 1 and want in lines[0], lines
        assert after == before, "a refused export changed the sandbox"
        _BUILT[name] = (s, out, work, expect, before)
        return
    assert rc == 0, err
    check_export(out, work, layout)
    out_rel = str(out.relative_to(s))
    assert {k: v for k, v in after.items() if not _managed(k, out_rel)} == \
        {k: v for k, v in before.items() if not _managed(k, out_rel)}, "something outside the export changed"
    for rel, was in before.items():  # a real file it replaced held the very bytes its link now points to
        if _managed(rel, out_rel) and was not in ("dir", "other") and not was.startswith("link:") \
                and not rel.endswith(ed.MARKER) and after.get(rel) != was:
            assert "--replace-copies" in flags, rel
            assert hashlib.md5((s / rel).resolve().read_bytes()).hexdigest() == was, rel


def test_the_suite_is_big() -> None:
    assert len(STATES) >= 40 and len(CASES) >= 350
    refusing = {n for n in STATES if n.startswith(("out-", "marker-", "stale-", "recorded-link-re", "parent-"))}
    assert len(refusing) >= 20


# -- happy paths ----------------------------------------------------------------------------------------------
def test_re_export_over_its_own_export_in_every_layout(template: Path, tmp_path: Path, capsys) -> None:
    s = sandbox(template, tmp_path)
    out = s / "ds"
    outside = snapshot(s)
    for layout in ("samsung", "nvidia-dle", "habana", "samsung", "samsung", "habana"):
        rc, err = export(s / "work", out, layout)
        assert rc == 0, err
        check_export(out, s / "work", layout)
        assert {k: v for k, v in snapshot(s).items() if not k.startswith("ds")} == outside
    assert sorted(os.listdir(out)) == ["bertpipe_export.json", "eval", "train", "vocab.txt"]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def stop_at(n: int, exc: type[BaseException]) -> Callable[[str, str], None]:
    """An export_dataset._step that raises ``exc`` at its n-th call (1: before the first change to OUT)."""
    calls = iter(range(1, 1_000_000))

    def hook(what: str, rel: str) -> None:
        if next(calls) == n:
            raise exc(f"stopped before {what} {rel}")
    return hook


def test_a_kill_at_any_step_is_recovered_by_the_next_export(template: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped before any change to OUT (as a kill would: no clean-up runs), OUT holds only what its marker
    accounts for; the next export, in either layout and with no flag, finishes the job."""
    s = sandbox(template, tmp_path)
    out = s / "ds"
    own_export(s, out, "samsung")
    outside = {k: v for k, v in snapshot(s).items() if not k.startswith("ds")}

    class Killed(BaseException):
        pass

    steps: list[str] = []
    monkeypatch.setattr(ed, "_step", lambda what, rel: steps.append(what))
    own_export(s, out, "nvidia-dle")
    own_export(s, out, "samsung")
    n_steps = len(steps) // 2
    assert {"marker", "unlink", "rmdir", "mkdir", "symlink"} <= set(steps) and n_steps > 30

    layout, tried = "samsung", 0
    for stop in range(1, n_steps + 1, 2):
        target = "nvidia-dle" if layout == "samsung" else "samsung"
        monkeypatch.setattr(ed, "_step", stop_at(stop, Killed))
        with pytest.raises(Killed):
            export(s / "work", out, target)
        monkeypatch.setattr(ed, "_step", lambda what, rel: None)
        m = json.loads((out / ed.MARKER).read_text())
        recorded = {n: {t} | {m.get("previous", {}).get(n)} for n, t in m["links"].items()}
        for n, t in m.get("previous", {}).items():
            recorded.setdefault(n, set()).add(t)
        for p in [*out.rglob("*")]:
            rel = str(p.relative_to(out))
            if p.is_symlink():
                assert os.readlink(p) in recorded.get(rel, ()), (stop, rel)  # every link accounted for
            elif p.is_dir():
                assert rel in m["dirs"], (stop, rel)
        again = target if stop % 4 == 1 else layout  # finish it, or go back
        rc, err = export(s / "work", out, again)
        assert rc == 0, (stop, err)
        check_export(out, s / "work", again)
        layout = again
        assert {k: v for k, v in snapshot(s).items() if not k.startswith("ds")} == outside
        tried += 1
    assert tried >= 15

    for stop in (1, 2, 3, 12, 20):  # the first export into a new OUT (20 steps), stopped
        fresh = s / f"fresh{stop}"
        monkeypatch.setattr(ed, "_step", stop_at(stop, Killed))
        with pytest.raises(Killed):
            export(s / "work", fresh, "habana")
        monkeypatch.setattr(ed, "_step", lambda what, rel: None)
        assert fresh.is_dir() and (stop == 1) == (os.listdir(fresh) == [])
        rc, err = export(s / "work", fresh, "habana")
        assert rc == 0, (stop, err)
        check_export(fresh, s / "work", "habana")
    assert {k: v for k, v in snapshot(s).items() if not k.startswith(("ds", "fresh"))} == outside


def test_a_kill_while_replacing_copies_is_recovered(template: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    s = sandbox(template, tmp_path)
    own_export(s, s / "exp0")
    outside = None
    for stop in (1, 2, 9, 19):
        shutil.rmtree(s / "bk", ignore_errors=True)
        _cp_materialized(s / "exp0", s / "bk")
        outside = outside or {k: v for k, v in snapshot(s).items() if not k.startswith("bk")}
        monkeypatch.setattr(ed, "_step", stop_at(stop, KeyboardInterrupt))
        assert export(s / "work", s / "bk", "samsung", "--replace-copies")[0] == 130
        monkeypatch.setattr(ed, "_step", lambda what, rel: None)
        rc, err = export(s / "work", s / "bk", "samsung")
        if stop > 1:  # copies are left: they still need the flag
            assert rc == 2 and "--replace-copies" in err, err
        rc, err = export(s / "work", s / "bk", "samsung", "--replace-copies")
        assert rc == 0, err
        check_export(s / "bk", s / "work", "samsung")
        assert {k: v for k, v in snapshot(s).items() if not k.startswith("bk")} == outside


def test_a_link_swapped_before_its_removal_is_kept(template: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each link is checked again just before its removal: a real file put there after the check survives."""
    s = sandbox(template, tmp_path)
    out = s / "ds"
    own_export(s, out, "samsung")
    victim = out / "train/128/part_0_of_4.hdf5"

    def swap(what: str, rel: str) -> None:
        if what == "unlink" and rel == "train/128/part_0_of_4.hdf5":
            victim.unlink()
            victim.write_text("mine now")

    monkeypatch.setattr(ed, "_step", swap)
    rc, err = export(s / "work", out, "nvidia-dle")
    assert rc == 2 and "changed while exporting" in err and len(err.strip().splitlines()) == 1, err
    assert victim.read_text() == "mine now"
    monkeypatch.setattr(ed, "_step", lambda what, rel: None)
    rc, err = export(s / "work", out, "nvidia-dle")  # the next export refuses to touch it, naming it
    assert rc == 2 and "part_0_of_4.hdf5 is a file" in err
    victim.unlink()
    assert export(s / "work", out, "nvidia-dle")[0] == 0
    check_export(out, s / "work", "nvidia-dle")


def test_a_second_export_into_the_same_out_refuses(template: Path, tmp_path: Path) -> None:
    s = sandbox(template, tmp_path)
    out = s / "ds"
    own_export(s, out)
    before = snapshot(s)
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rc, err = export(s / "work", out, "nvidia-dle")
    finally:
        os.close(fd)
    assert rc == 2 and "another export-dataset is writing" in err and snapshot(s) == before


def test_help_names_the_flags_truthfully() -> None:
    from bertpipe.cli import build_parser

    text = " ".join(build_parser("export-dataset")[0].format_help().split())
    assert "--replace-copies" in text and "never replaces or deletes" in text and "not a symlink" in text
    assert "version 2" in ed.__doc__ and "deletes only links it made" in ed.__doc__
