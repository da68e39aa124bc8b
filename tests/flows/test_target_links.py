"""Links planted at every level of every stage folder of a work dir that built every target (issue 33, item 1):
nothing outside the work dir is read, written, unlinked or created, before or after a refusal.

One work dir is built once (the built-in sample's dump through every target at 128/20, the 4 bins' stage aside:
Samsung's splitter is for 512). Each case copies it (data files hard-linked), moves one entry of one stage folder
(the stage folder, its key folder, a shard folder, any sub-folder, a file of each folder) into a victim folder
outside the work dir and puts a symbolic link to it in its place, then runs ``bertpipe run`` for the targets again.
Every case asserts that the victim folder is unchanged (every file's md5, every entry), that nothing new appeared
beside it (a scratch folder made next to a linked folder's target, as pack-habana once did), and the outcome:

* a stage, key or shard folder that resolves outside the work dir: refused in one line, exit 2;
* a link deeper inside a stage folder: the link itself is removed (never followed), the unit is redone, and
  ``bertpipe status`` is clean afterwards.

A few cases run in the default suite (the packers' folders, a bins-like trainer folder, a per-shard file); the
rest are ``slow``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from flowhelpers import link_tree, run_cli, snapshot

from bertpipe.cli import main
from core.manifest import MANIFEST_NAME

TARGETS = ("nvidia-4320", "nvidia-4320-v1.1", "nvidia-2048", "nvidia-2048-varlength", "nvidia-varlength",
           "nvidia-packed", "habana-packed", "habana-packed-raw", "habana-packed-narrow")
SHORT = ("--max-seq-length", "128", "--max-predictions-per-seq", "20", "--workers", "1")
ARGS = tuple(a for t in TARGETS for a in ("--target", t)) + SHORT
PER_SHARD = ("tfrecord", "hdf5")


@pytest.fixture(scope="module")
def template(prefect_harness, tmp_path_factory) -> Path:
    w = tmp_path_factory.mktemp("links-template") / "w"
    assert run_cli("--work-dir", w, *ARGS) == 0
    return w


def _levels(w: Path) -> list[tuple[str, str, str]]:
    """(stage, path relative to the work dir, level) of each entry a case replaces by a link."""
    out = []
    for stage_dir in sorted(p for p in w.iterdir() if p.is_dir() and not p.name.startswith(".")):
        stage = stage_dir.name
        out.append((stage, stage, "stage"))
        for key_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
            out.append((stage, f"{stage}/{key_dir.name}", "key"))
            for dirpath, dirnames, filenames in os.walk(key_dir):
                base = Path(dirpath)
                for n in sorted(dirnames):
                    level = "shard" if stage in PER_SHARD and base == key_dir else "folder"
                    out.append((stage, (base / n).relative_to(w).as_posix(), level))
                files = sorted(n for n in filenames if not n.startswith((".", "_")))
                if files:  # one output file of each folder (the first), and the manifest of a unit folder
                    out.append((stage, (base / files[0]).relative_to(w).as_posix(), "file"))
                if MANIFEST_NAME in filenames and base != key_dir:
                    out.append((stage, (base / MANIFEST_NAME).relative_to(w).as_posix(), "file"))
    return out


#: the cases of the default suite (each is a cached run of the DAG plus one redo)
FAST_CASES = {("habana_packed", "folder"), ("nvidia_packed", "file"), ("nvidia_4320", "key"), ("hdf5", "shard")}


def _cases() -> list:
    """Every (stage, level) the sample's work dir has; the entries themselves are found in the template."""
    stages = ("download", "extract", "text", "vocab", "tfrecord", "hdf5", "nvidia_4320", "nvidia_4320_shuffled",
              "nvidia_4320_v11", "nvidia_2048", "nvidia_2048_shuffled", "nvidia_packed", "habana_packed", "habana_packed_raw",
              "habana_packed_narrow", "eval_tfrecord",
              "eval_10k",
              "eval_hdf5", "nvidia_eval")
    out = []
    for stage in stages:
        for level in ("stage", "key", "shard", "folder", "file"):
            if level == "shard" and stage not in PER_SHARD:
                continue
            marks = () if (stage, level) in FAST_CASES else (pytest.mark.slow,)
            out.append(pytest.param(stage, level, id=f"{stage}-{level}", marks=marks))
    return out


@pytest.mark.parametrize("stage,level", _cases())
def test_a_link_at_any_level_never_reaches_outside(stage, level, template, tmp_path, capsys):
    entries = [rel for s, rel, lv in _levels(template) if s == stage and lv == level]
    if not entries:
        pytest.skip(f"{stage} has no {level} level in the sample's work dir")
    w, victim = tmp_path / "w", tmp_path / "victim"
    link_tree(template, w)
    victim.mkdir()
    for i, rel in enumerate(entries):
        src = w / rel
        if not src.exists():  # under an entry moved before it
            continue
        dst = victim / f"{i}-{src.name}"
        shutil.move(str(src), str(dst))
        os.symlink(dst, src)
    before, beside = snapshot(victim), sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    rc = run_cli("--work-dir", w, *ARGS)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    assert snapshot(victim) == before, f"the victim folder changed ({entries})"
    assert sorted(p.name for p in tmp_path.iterdir()) == beside, "something was made beside the work dir"
    if level in ("stage", "key", "shard"):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "outside the work dir" in lines[0], f"exit {rc}: {err}"
        return
    assert rc == 0, f"exit {rc}: {err}"
    assert not [p for p in w.rglob("*") if p.is_symlink()], "a planted link is still in the work dir"
    capsys.readouterr()
    assert main(["status", "--work-dir", str(w)]) == 0, capsys.readouterr().out


def test_the_cases_reach_every_target_stage(template):
    found = {(s, lv) for s, _, lv in _levels(template)}
    for stage in ("nvidia_4320", "nvidia_4320_shuffled", "nvidia_4320_v11", "nvidia_2048", "nvidia_packed",
                  "habana_packed", "nvidia_eval", "hdf5"):
        assert {(stage, "stage"), (stage, "key"), (stage, "file")} <= found, stage
    assert ("habana_packed", "folder") in found  # packed/, the trainer's folder
    assert ("hdf5", "shard") in found and ("nvidia_eval", "folder") in found  # eval_varlength/, the eval's folder
    from preprocessing.targets import names

    assert set(names()) - {"samsung-4bins"} == set(TARGETS), "a target this test does not build"
