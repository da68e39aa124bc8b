"""Checkpoint bookkeeping without DeepSpeed: latest tag, config refusal, per-rank state, pruning."""

from __future__ import annotations

import json
import os

import pytest
import torch

from core.errors import InputError
from pretrain import checkpoint as ckpt


def _tag(out, step):
    d = ckpt.checkpoint_dir(out) / str(step)
    d.mkdir(parents=True)
    return d


WORLD = 2


def _save(out, step, *, complete=True, world=WORLD, latest=True):
    """A checkpoint laid out as Run.save writes one (DeepSpeed's files stood in by small torch.save files of
    the same names), with its completion record and `latest` when ``complete``."""
    tag = str(step)
    for r in range(world):
        ckpt.save_rank_state(out, tag, r, step, {"torch": torch.get_rng_state()}, {"epoch": 0, "index": step})
    ckpt.write_run_config(out, tag, {"hidden_size": 64}, {"world_size": world})
    d = ckpt.checkpoint_dir(out) / tag
    torch.save({"module": {"w": torch.full((50,), float(step))}}, d / "mp_rank_00_model_states.pt")
    for r in range(world):
        torch.save({"fp32": torch.arange(10.0) + r}, d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    if complete:
        names = ckpt.tag_files(out, tag)
        files = {**ckpt.describe_files(out, tag, names[0::2]), **ckpt.describe_files(out, tag, names[1::2])}
        ckpt.write_completion(out, tag, step, world, files)
        if latest:
            ckpt.write_latest(out, tag)
    return d


def _names(out):
    return sorted(p.name for p in ckpt.checkpoint_dir(out).iterdir())


def test_prune_keeps_the_newest_complete_and_latest_and_only_touches_run_tags(tmp_path):
    for s in (5, 10, 15, 20, 100):
        _save(tmp_path, s)
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text("10")  # e.g. a rolled-back run's older latest
    _tag(tmp_path, 7)  # an empty numeric folder: not shown to be the run's (no bertpipe file)
    (_tag(tmp_path, 8) / "notes.txt").write_text("mine")
    (ckpt.checkpoint_dir(tmp_path) / "backup_5").mkdir()  # the user's copy
    (ckpt.checkpoint_dir(tmp_path) / "3").symlink_to(_save(tmp_path / "elsewhere", 3, latest=False))
    deleted = ckpt.prune_checkpoints(tmp_path, keep=2, protect="10")
    assert sorted(p.name for p in deleted) == ["15", "5"]
    assert _names(tmp_path) == ["10", "100", "20", "3", "7", "8", "backup_5", "latest"]
    assert (tmp_path / "elsewhere" / "checkpoints" / "3" / "mp_rank_00_model_states.pt").is_file()
    assert ckpt.prune_checkpoints(tmp_path, keep=0) == []


def test_prune_never_removes_the_newest_complete_and_drops_older_debris(tmp_path):
    for s in (10, 20):
        _save(tmp_path, s)
    _save(tmp_path, 15, complete=False)  # a save killed half-way (older than the new tag): debris
    _save(tmp_path, 40, complete=False)  # newer than the new tag: left (the run overwrites it when it gets there)
    _save(tmp_path, 30)
    deleted = ckpt.prune_checkpoints(tmp_path, keep=1, protect="30")
    assert sorted(p.name for p in deleted) == ["10", "15", "20"]
    assert _names(tmp_path) == ["30", "40", "latest"]
    # keep=1, protecting an older tag (a rolled-back run saving 25 under a complete 30): 30 stays, the newest
    _save(tmp_path, 25)
    assert [p.name for p in ckpt.prune_checkpoints(tmp_path, keep=1, protect="25")] == []
    assert _names(tmp_path) == ["25", "30", "40", "latest"]


def test_complete_means_the_record_and_every_listed_file(tmp_path):
    _save(tmp_path, 12)
    d = ckpt.checkpoint_dir(tmp_path) / "12"
    assert ckpt.tag_problem(tmp_path, "12", md5=True) == ""
    record = json.loads((d / ckpt.COMPLETE_NAME).read_text())
    assert sorted(record["files"]) == ["bertpipe_config.json", "bertpipe_rank0.pt", "bertpipe_rank1.pt",
                                       "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                       "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"]
    model = d / "mp_rank_00_model_states.pt"
    data = model.read_bytes()
    model.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit: only the md5 sees it
    assert ckpt.tag_problem(tmp_path, "12") == ""
    assert "mp_rank_00_model_states.pt has md5" in ckpt.tag_problem(tmp_path, "12", md5=True)
    model.write_bytes(data[:100])
    assert "mp_rank_00_model_states.pt has 100 bytes" in ckpt.tag_problem(tmp_path, "12")
    model.write_bytes(data)
    (d / "bertpipe_rank1.pt").unlink()
    assert ckpt.tag_problem(tmp_path, "12") == "bertpipe_rank1.pt is missing"
    _save(tmp_path, 13, complete=False)
    assert ckpt.tag_problem(tmp_path, "13") == "no completion record: the save did not finish"
    _save(tmp_path, 14)
    d14 = ckpt.checkpoint_dir(tmp_path) / "14"
    good = json.loads((d14 / ckpt.COMPLETE_NAME).read_text())["files"]
    for files, why in (({}, "malformed"), ({**good, "../../../etc/passwd": {"size": 1}}, "not a file of the tag"),
                       ({"bertpipe_config.json": {"size": 1}}, "does not list mp_rank_00_model_states.pt")):
        (d14 / ckpt.COMPLETE_NAME).write_text(json.dumps({"tag": "14", "world_size": 2, "files": files}))
        assert why in ckpt.tag_problem(tmp_path, "14"), files
    (d14 / ckpt.COMPLETE_NAME).write_text("{")
    assert "unreadable" in ckpt.tag_problem(tmp_path, "14")


def test_checkpoints_written_before_completion_records_are_checked_by_structure(tmp_path):
    d = _save(tmp_path, 9, complete=False)
    cfg = json.loads((d / ckpt.CONFIG_NAME).read_text())
    del cfg["format"]  # as bertpipe wrote it before completion records
    (d / ckpt.CONFIG_NAME).write_text(json.dumps(cfg))
    assert ckpt.tag_problem(tmp_path, "9") == ""
    opt = d / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    opt.write_bytes(opt.read_bytes()[:-30])  # a kill in the middle of DeepSpeed's write
    assert ckpt.tag_problem(tmp_path, "9") == ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt is truncated or "
                                               "damaged (written before completion records)")
    opt.unlink()
    assert "1 ZeRO optimizer files for 2 ranks" in ckpt.tag_problem(tmp_path, "9")


@pytest.mark.parametrize("latest,why", [(None, "is missing"), ("", "is empty"), ("\n  \n", "is empty"),
                                        ("../x", "is damaged"), ("/abs/12", "is damaged"), ("12\0", "is damaged"),
                                        ("..", "is damaged"), (b"\xff\xfe", "is damaged"),
                                        ("link", "is damaged (a symbolic link)"),
                                        ("12", "names checkpoint 12, which is incomplete")])
def test_resume_with_a_bad_latest_takes_the_newest_complete_checkpoint(tmp_path, latest, why):
    for s in (10, 11):
        _save(tmp_path, s)
    _save(tmp_path, 12, complete=False)  # the kill that also damaged `latest`
    f = ckpt.checkpoint_dir(tmp_path) / "latest"
    f.unlink()
    if latest == "link":
        (tmp_path / "x").write_text("11")
        f.symlink_to(tmp_path / "x")
    elif isinstance(latest, bytes):
        f.write_bytes(latest)
    elif latest is not None:
        f.write_text(latest)
    point = ckpt.resume_point(tmp_path, md5=True)
    assert point.tag == "11", point
    assert point.note.startswith(f"{f} {why}") and "resuming from checkpoint 11, the newest complete one" in point.note
    assert "newer, incomplete: 12 (no completion record" in point.note or why.startswith("names")
    assert "\n" not in point.note
    assert ckpt.start_point(tmp_path, resume=True, overwrite=False) == point


def test_latest_outside_checkpoints_is_never_followed(tmp_path):
    outside = _save(tmp_path / "other", 50, latest=False)  # a complete checkpoint elsewhere
    _save(tmp_path, 5)
    rel = os.path.relpath(outside, ckpt.checkpoint_dir(tmp_path))
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text(rel)
    assert ckpt.latest_tag(tmp_path) is None
    assert ckpt.resume_point(tmp_path).tag == "5"
    with pytest.raises(InputError, match="not a checkpoint tag"):
        ckpt.tag_dir(tmp_path, rel)
    (ckpt.checkpoint_dir(tmp_path) / "60").symlink_to(outside)  # a tag folder that is a link out
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text("60")
    assert ckpt.resume_point(tmp_path).tag == "5"


def test_resume_refuses_when_no_checkpoint_is_complete_and_starts_fresh_when_there_is_none(tmp_path):
    assert ckpt.resume_point(tmp_path) is None  # a first start: no checkpoints/ at all
    ckpt.checkpoint_dir(tmp_path).mkdir()
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text("")
    assert ckpt.resume_point(tmp_path) is None  # an empty latest, no tag folder: nothing to lose
    _save(tmp_path, 12, complete=False)
    with pytest.raises(InputError) as e:
        ckpt.resume_point(tmp_path)
    msg = str(e.value)
    assert "holds no complete checkpoint to resume from (latest is empty; 12 (no completion record" in msg
    assert "\n" not in msg and "--overwrite" in msg


def test_a_start_without_resume_over_a_run_is_refused_unless_overwrite(tmp_path):
    assert ckpt.start_point(tmp_path, resume=False, overwrite=False) is None  # empty dir
    _save(tmp_path, 10)
    _save(tmp_path, 11)
    with pytest.raises(InputError, match=r"holds checkpoints 10, 11 of a training run; add --resume to continue it, "
                                         r"or --overwrite to discard them"):
        ckpt.start_point(tmp_path, resume=False, overwrite=False)
    with pytest.raises(InputError, match="--resume and --overwrite contradict each other"):
        ckpt.start_point(tmp_path, resume=True, overwrite=True)
    assert ckpt.start_point(tmp_path, resume=True, overwrite=False).tag == "11"
    assert ckpt.start_point(tmp_path, resume=False, overwrite=True) is None
    (tmp_path / "summary.json").write_text("{}")
    (ckpt.checkpoint_dir(tmp_path) / "mine").mkdir()
    gone = ckpt.discard_run(tmp_path)
    assert gone == ["checkpoints/10", "checkpoints/11", "checkpoints/latest", "summary.json"]
    assert _names(tmp_path) == ["mine"]
    assert ckpt.start_point(tmp_path, resume=False, overwrite=False) is None


def test_remove_stale_tag_only_removes_run_folders(tmp_path):
    _save(tmp_path, 4, complete=False)
    assert ckpt.remove_stale_tag(tmp_path, "4") and not (ckpt.checkpoint_dir(tmp_path) / "4").exists()
    (_tag(tmp_path, 5) / "x").write_text("user")
    assert not ckpt.remove_stale_tag(tmp_path, "5") and (ckpt.checkpoint_dir(tmp_path) / "5" / "x").exists()


def test_model_config_mismatch_is_refused(tmp_path):
    ckpt.write_run_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 30522}, {"optimizer": "lans"})
    ckpt.check_model_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 30522})
    with pytest.raises(InputError, match=r"another model config \(vocab_size: checkpoint 30522 vs this run 512035\)"):
        ckpt.check_model_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 512035})
    _tag(tmp_path, 8)
    with pytest.raises(InputError, match="has no readable bertpipe_config.json"):
        ckpt.check_model_config(tmp_path, "8", {"hidden_size": 64})


def test_rank_state_round_trip_and_missing_rank(tmp_path):
    ckpt.save_rank_state(tmp_path, "3", 1, 3, {"torch": torch.get_rng_state()}, {"epoch": 0, "index": 3,
                                                                                  "digest": "abc"})
    state = ckpt.load_rank_state(tmp_path, "3", 1)
    assert state["step"] == 3 and state["data"]["index"] == 3
    with pytest.raises(InputError, match=r"bertpipe_rank0\.pt is missing"):
        ckpt.load_rank_state(tmp_path, "3", 0)
    assert ckpt.latest_tag(tmp_path) is None


class _Payload:
    """An object whose unpickling would call a function: what a hostile checkpoint carries."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_weights_only_load_refuses_arbitrary_objects(tmp_path, capsys):
    bad = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}, "extra": _Payload()}, bad)
    with pytest.raises(InputError, match="refused to load") as e:
        ckpt.weights_only_load(bad)
    assert str(bad) in str(e.value) and "weights_only=True" in str(e.value)
    assert "unpickled!" not in capsys.readouterr().out


def test_weights_only_load_reads_deepspeed_zero_objects(tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    f = tmp_path / "optim_states.pt"
    torch.save({"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum.optimizer_states,
                "fp32": torch.arange(3.0)}, f)
    state = ckpt.weights_only_load(f, map_location="cpu")
    assert state["zero_stage"] == ZeroStageEnum.optimizer_states and state["loss_scaler"].cur_scale == 1.0
    assert torch.equal(state["fp32"], torch.arange(3.0))

    class Engine:
        class checkpoint_engine:  # noqa: N801 - stands for DeepSpeed's TorchCheckpointEngine instance
            @staticmethod
            def load(path, map_location=None):
                raise AssertionError("DeepSpeed's own (full pickle) loader was called")

    engine = Engine()
    ckpt.safe_deepspeed_loads(engine)
    assert torch.equal(engine.checkpoint_engine.load(f, map_location=lambda s, loc: s)["fp32"], torch.arange(3.0))
