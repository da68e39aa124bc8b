"""tasks.workdir: last_run.json is checked before use, and the folders trainers read whole hold only what their
manifests list (issue 23)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from core.errors import InputError
from core.manifest import StageOutput
from tasks.workdir import last_run, sweep_unlisted, unlisted


def _summary(work: Path, recorded: Path, **outputs: str) -> None:
    (work / "last_run.json").write_text(json.dumps({
        "work_dir": str(recorded), "outputs": outputs,
        "stages": {"bins": {"key": "k1", "shards": []}, "hdf5": {"key": "k2", "shards": ["part-00000-of-00500"]}}}))


def test_last_run_outputs_stay_inside_the_work_dir(tmp_path, caplog):
    work = tmp_path / "w"
    work.mkdir()
    _summary(work, work, train_dir=str(work / "bins" / "k1" / "data"))
    assert last_run(work)["outputs"] == {"train_dir": str(work / "bins" / "k1" / "data")}
    # the work dir moved (or copied) since: the outputs are read under its present path, never at the old one
    _summary(work, tmp_path / "old", train_dir=str(tmp_path / "old" / "bins" / "k1" / "data"))
    assert last_run(work)["outputs"] == {"train_dir": str(work.absolute() / "bins" / "k1" / "data")}
    for bad in ({"train_dir": str(tmp_path / "victim")}, {"train_dir": str(work / ".." / "victim")},
                {"eval_hdf5": 5}):
        _summary(work, work, **bad)
        with caplog.at_level(logging.WARNING):
            assert last_run(work) == {}
        assert "is not a bertpipe run summary" in caplog.text and "last_run.json" in caplog.text
        caplog.clear()
    (work / "victim").mkdir()
    (work / "bins").symlink_to(tmp_path)  # an output under a link out of the work dir
    _summary(work, work, train_dir=str(work / "bins" / "k1" / "data"))
    assert last_run(work) == {}
    (work / "last_run.json").write_text(json.dumps({"stages": {"bins": {"key": "../../x"}}}))
    assert last_run(work) == {}
    (work / "last_run.json").write_text(json.dumps({"stages": {"hdf5": {"key": "k", "shards": ["a/../../b"]}}}))
    assert last_run(work) == {}


def _bins(d: Path) -> object:
    with StageOutput(d, "split_4bins") as out:
        for name in ("data/128/part_0_of_1.hdf5", "data/256/part_0_of_1.hdf5"):
            with out.open(name) as f:
                f.write(b"h5")
    return out.manifest


def test_unlisted_entries_where_trainers_read_are_found_plain_files_removed_links_refused(tmp_path):
    work = tmp_path / "w"
    d = work / "bins" / "k1"
    m = _bins(d)
    assert unlisted("bins", d, m) == []
    (d / "data" / "128" / "extra.hdf5").write_bytes(b"a planted shard")
    (d / "data" / "999").mkdir()
    (d / "data" / "128" / ".x.hdf5.tmp-12").write_bytes(b"debris of a killed writer: swept by the next run")
    (d / "notes.txt").write_text("outside data/: not what trainers read")
    assert unlisted("bins", d, m) == [("data/999", "folder"), ("data/128/extra.hdf5", "file")]
    (tmp_path / "victim.hdf5").write_bytes(b"mine")
    (d / "data" / "256" / "link.hdf5").symlink_to(tmp_path / "victim.hdf5")
    with pytest.raises(InputError, match=r"link.hdf5 is a link that bertpipe did not write"):
        sweep_unlisted("bins", d, m, work)
    assert (d / "data" / "128" / "extra.hdf5").exists()  # nothing removed before the refusal
    (d / "data" / "256" / "link.hdf5").unlink()
    assert sweep_unlisted("bins", d, m, work) == ["data/128/extra.hdf5", "data/999/"]
    assert unlisted("bins", d, m) == [] and (tmp_path / "victim.hdf5").read_bytes() == b"mine"
    assert (d / "notes.txt").exists()
