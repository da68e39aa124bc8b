"""Fast checks of the deployments' parameter checks (flows/guard.py), the refresh's version rules
(flows/versions.py: request fingerprints, resuming, pruning) and the readers' lock (core/readlock.py): no Prefect
server, no data run (issue 24.4, 24.5)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import InputError


# -- parameters -----------------------------------------------------------------------------------------------
def test_a_misspelt_data_field_is_refused_naming_the_closest_and_every_field(tmp_path: Path) -> None:
    from flows.guard import check_data

    with pytest.raises(InputError) as exc:
        check_data({"n_output_shard": 4}, "data.")
    msg = str(exc.value)
    assert msg.startswith("data.n_output_shard is not a data parameter; did you mean data.n_output_shards?")
    assert "max_seq_length" in msg and "work_dir" in msg and "\n" not in msg


@pytest.mark.parametrize("data, words", [
    ({"max_seq_length": "128"}, "data.max_seq_length must be an integer, got '128'"),
    ({"max_seq_length": 3}, "data.max_seq_length must be >= 5, got 3"),
    ({"keep": "some"}, "data.keep 'some': choose one of all, training"),
    ({"stages": "text"}, "data.stages must be a list of names"),
    ({"stages": ["txet"]}, "data.stages"),
    ({"vocab": "/nonexistent/vocab.txt"}, "data.vocab /nonexistent/vocab.txt: no such file"),
    ({"source": "http://x/a b.bz2"}, "data.source URL"),
    ({"work_dir": "/elsewhere"}, "data.work_dir is set by this flow"),
])
def test_data_parameters_are_refused_in_one_line_naming_them(tmp_path: Path, data: dict, words: str) -> None:
    from flows.guard import check_data

    fixed = {"work_dir": str(tmp_path / "w")} if "work_dir" in data else {}
    if "work_dir" not in data:
        data = {"work_dir": str(tmp_path / "w"), **data}
    with pytest.raises(InputError) as exc:
        check_data(data, "data.", fixed)
    assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    assert "--" not in str(exc.value)  # no CLI flag in a deployment's message


def test_the_data_flow_s_own_parameters_are_named_bare(tmp_path: Path) -> None:
    from flows.guard import check_data

    with pytest.raises(InputError, match=r"^vocab /nope/v.txt: no such file"):
        check_data({"work_dir": str(tmp_path / "w"), "vocab": "/nope/v.txt"})
    p = check_data({"work_dir": str(tmp_path / "w"), "n_output_shards": 4, "masked_lm_prob": 0.2})
    assert p.n_output_shards == 4 and p.masked_lm_prob == 0.2


def test_the_data_parameter_model_keeps_a_typo_for_the_check(tmp_path: Path) -> None:
    """pydantic would drop an unknown key silently: the model keeps it, and the check names it."""
    from flows.guard import DataParameters, check_data, data_values

    m = DataParameters(work_dir=str(tmp_path / "w"), n_output_shard=4)
    assert data_values(m) == {"work_dir": str(tmp_path / "w"), "n_output_shard": 4}
    with pytest.raises(InputError, match="did you mean data.n_output_shards"):
        check_data(m, "data.")
    assert "n_output_shards" in DataParameters.model_json_schema()["properties"]


@pytest.mark.parametrize("kw, words", [
    ({"max_steps": -5}, "max_steps must be between 1 and 2147483647, got -5"),
    ({"max_steps": "20"}, "max_steps must be an integer"),
    ({"model": "huge"}, "model 'huge': choose one of tiny, base, large"),
    ({"nproc": 0}, "nproc must be between 1 and 1024"),
    ({"options": {"learnig_rate": 0.1}}, "options.learnig_rate is not a training option; did you mean "
                                          "options.learning_rate?"),
    ({"options": {"learning_rate": -1.0}}, "options.learning_rate must be between"),
    ({"options": {"optimizer": "sgd"}}, "options.optimizer 'sgd': choose one of lans, lamb, adamw"),
    ({"options": {"resume": True}}, "options.resume repeats the parameter resume: set resume instead"),
    ({"options": {"overwrite": True}, "resume": True}, "resume and options.overwrite contradict each other"),
])
def test_training_parameters_are_refused_before_anything_starts(kw: dict, words: str) -> None:
    from flows.guard import check_training

    args = {"model": "tiny", "max_steps": 20, "nproc": 1, "options": None, **kw}
    with pytest.raises(InputError) as exc:
        check_training(**args)
    assert words in str(exc.value) and "--" not in str(exc.value), str(exc.value)


def test_training_options_pass_through_checked() -> None:
    from flows.guard import check_training

    opts = check_training(model="tiny", max_steps=5, nproc=2, options={"learning_rate": 1, "split_batch_cnt":
                                                                        [1, 2, 3, 4], "overwrite": True})
    assert opts == {"learning_rate": 1.0, "split_batch_cnt": "1 2 3 4", "overwrite": True}


def test_a_missing_train_dir_says_so(tmp_path: Path) -> None:
    from flows.pretrain_flow import check_pretrain

    with pytest.raises(InputError, match=r"^train_dir .*/nope does not exist; give a data work dir"):
        check_pretrain(train_dir=str(tmp_path / "nope"), eval_file="", output_dir=str(tmp_path / "out"),
                       model="tiny", max_steps=5, nproc=1, vocab=None, resume=False, options=None, evaluate=True)


def test_cli_flags_in_library_messages_become_parameter_names() -> None:
    from flows.guard import flow_words

    msg = ("--output-dir /r holds checkpoint 5 of a training run; add --resume to continue it, or --overwrite to "
           "discard them; --learning-rate too high; --wait-lock; --no-such-flag")
    assert flow_words(msg) == ("output_dir /r holds checkpoint 5 of a training run; add resume to continue it, or "
                               "options.overwrite to discard them; options.learning_rate too high; wait_lock_s; "
                               "--no-such-flag")
    assert flow_words("--max-steps", prefix="x.") == "x.max_steps"


def test_bertpipe_errors_lose_prefect_s_traceback_and_its_engine_line() -> None:
    from flows.guard import _OwnErrors

    f = _OwnErrors()

    def record(msg: str, exc: BaseException | None) -> logging.LogRecord:
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, msg, None,
                                 (type(exc), exc, None) if exc else None)

    assert not f.filter(record("Engine execution exited with unexpected exception", InputError("x")))
    r = record("Encountered exception during execution: %r", InputError("bad"))
    assert f.filter(r) and r.exc_info is None
    r = record("Engine execution exited with unexpected exception", RuntimeError("bug"))
    assert f.filter(r) and r.exc_info is not None  # not ours: Prefect's report stays whole


# -- versions ---------------------------------------------------------------------------------------------------
def _version(root: Path, name: str, complete: bool = True) -> Path:
    v = root / "versions" / name
    (v / "text").mkdir(parents=True)
    (v / "text" / "part").write_bytes(b"x" * 1000)
    (v / "last_run.json").write_text("{}")
    if complete:
        (v / "SOURCE.json").write_text(json.dumps({"version": name}))
    return v


def test_prune_keeps_latest_and_the_newest_and_removes_older_and_half_built(tmp_path: Path) -> None:
    from flows.versions import move_latest, prune

    root = tmp_path
    a, b, c = (_version(root, f"2026010{i}T000000-aaaaaaaa") for i in (1, 2, 3))
    half = _version(root, "20260104T000000-bbbbbbbb", complete=False)
    building = _version(root, "20260105T000000-cccccccc", complete=False)
    move_latest(root, b)  # latest need not be the newest (a newer build failed, say)
    kept, removed = prune(root, 2, building=building)
    assert kept == [{"version": building.name, "why": "being built"},
                    {"version": c.name, "why": "one of the 2 newest complete versions"},
                    {"version": b.name, "why": "latest"}]
    assert removed == [{"version": half.name, "why": "failed or half-built (no SOURCE.json)", "bytes": 1000 + 2},
                       {"version": a.name, "why": "older than the kept versions", "bytes": 1000 + 2 + len(
                           json.dumps({"version": a.name}))}]
    assert sorted(p.name for p in (root / "versions").iterdir()) == [b.name, c.name, building.name]
    kept, removed = prune(root, 1)
    assert [k["version"] for k in kept] == [b.name] and {r["version"] for r in removed} == {c.name, building.name}


def test_prune_never_removes_a_version_read_or_written_and_frees_only_unshared_bytes(tmp_path: Path) -> None:
    from core.readlock import reading
    from flows.versions import move_latest, prune

    a, b, c = (_version(tmp_path, f"2026010{i}T000000-aaaaaaaa") for i in (1, 2, 3))
    os.link(a / "text" / "part", c / "text" / "shared")
    move_latest(tmp_path, c)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from core.lock import WorkDirLock\n"
                               f"with WorkDirLock({str(b)!r}):\n print('held', flush=True); time.sleep(60)"],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # a data run in another process holds b
        with reading(a / "text" / "part"):
            kept, removed = prune(tmp_path, 1)
    finally:
        holder.kill()
        holder.wait()
    assert removed == []
    assert {"version": a.name, "why": "a training reads it (its read lock is held)"} in kept
    assert {"version": b.name, "why": "a data run holds it (its work-dir lock)"} in kept
    kept, removed = prune(tmp_path, 1)
    freed = {r["version"]: r["bytes"] for r in removed}
    assert freed[a.name] < freed[b.name]  # a's part is still linked from c: not freed
    assert (c / "text" / "shared").read_bytes() == b"x" * 1000


def test_a_training_is_refused_on_a_version_being_removed(tmp_path: Path) -> None:
    from core.readlock import reading, removing

    v = _version(tmp_path, "20260101T000000-aaaaaaaa")
    with removing(v) as free:
        assert free
        with pytest.raises(InputError, match=r"^train_dir .*: the data set .* is being removed"), reading(v / "text"):
            pass
    with reading(tmp_path / "elsewhere") as work:  # not in a data work dir: nothing to hold
        assert work is None


def test_keep_versions_must_be_positive(tmp_path: Path) -> None:
    from flows.versions import prune

    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="keep_versions must be an integer >= 1"):
            prune(tmp_path, bad)


def test_a_failed_build_is_resumed_only_by_the_same_request(tmp_path: Path) -> None:
    from flows.versions import REQUEST_FILE, request, resumable
    from preprocessing.params import DataParams

    p = DataParams(work_dir=str(tmp_path / "w"), n_output_shards=4)
    req = request(p, "a" * 32)
    assert req["fingerprint"] == request(DataParams(work_dir="/other", n_output_shards=4, workers=7), "a" * 32)[
        "fingerprint"]  # where and how it runs does not count
    assert req["fingerprint"] != request(p, "b" * 32)["fingerprint"]
    assert req["fingerprint"] != request(DataParams(work_dir="x", n_output_shards=8), "a" * 32)["fingerprint"]
    half = _version(tmp_path, "20260101T000000-aaaaaaaa", complete=False)
    assert resumable(tmp_path, req["fingerprint"]) is None  # no REQUEST.json: another build's leftovers
    (half / REQUEST_FILE).write_text(json.dumps(req))
    assert resumable(tmp_path, req["fingerprint"]) == half
    (half / "SOURCE.json").write_text("{}")
    assert resumable(tmp_path, req["fingerprint"]) is None  # complete: nothing to resume


def test_the_shipped_refresh_deploys_nothing_armed() -> None:
    """deployments/prefect.yaml: the refresh's schedule is paused, datasets_dir has no default (inside the checkout
    or anywhere), its data keeps training files only and keep_versions is 2; no deployment has an active schedule."""
    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "deployments" / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    refresh = deps["refresh"]
    assert [s["active"] for s in refresh["schedules"]] == [False]
    assert "datasets_dir" not in refresh["parameters"]
    assert refresh["parameters"]["keep_versions"] == 2 and refresh["parameters"]["data"]["keep"] == "training"
    assert not [d["name"] for d in deps.values() if any(s.get("active", True) for s in d.get("schedules") or [])]


def test_the_flows_import_without_starting_anything() -> None:
    r = subprocess.run([sys.executable, "-c", "import flows.refresh_flow, flows.e2e_flow, flows.pretrain_flow"],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
