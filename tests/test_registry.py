"""One stage registry, one parameter declaration: everything else is derived, and nothing keeps its own table."""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from preprocessing import registry
from preprocessing.params import DataParams

ROOT = Path(__file__).resolve().parents[1]
NAMES = set(registry.names())


def test_every_stage_reads_earlier_stages_only() -> None:
    seen: set[str] = set()
    for s in registry.STAGES:
        assert set(s.reads) <= seen, f"{s.name} reads {s.reads} before they are declared"
        seen.add(s.name)
        assert callable(s.run) and not isinstance(s.run, str)  # a real reference, not "module:function"
        if s.chain:
            assert s.per_shard and len(s.reads) == 1 and registry.STAGES[[x.name for x in registry.STAGES].index(
                s.reads[0])].per_shard


@pytest.mark.parametrize("params", [DataParams(), DataParams(text_dir="t", vocab=__file__),
                                    DataParams(source="x.xml.bz2", vocab=__file__)])
def test_one_declaration_per_stage_applies(params: DataParams) -> None:
    names = [s.name for s in registry.active(params)]
    assert len(names) == len(set(names))
    for s in registry.active(params):
        assert set(s.reads) <= set(names)


def test_aliases_are_unique_and_resolve() -> None:
    spellings = [a for s in registry.STAGES for a in (s.aliases if s is registry.STAGES[[x.name for x in
                 registry.STAGES].index(s.name)] else ())]
    assert len(spellings) == len(set(spellings)) and not set(spellings) & NAMES
    assert registry.normalize_stage("create-pretraining-data") == "tfrecord"
    assert registry.normalize_stage("split_4bins") == "bins"


#: every way a stage is spelled: registry names, aliases (library names), with - or _
SPELLINGS = {v for s in registry.STAGES for a in (s.name, *s.aliases) for v in (a, a.replace("_", "-"))}


def _stage_name_tables(source: str) -> list[int]:
    """Lines of tables of stage names in Python source: literal collections (list, tuple, set, dict keys) or
    whitespace/comma-separated strings of three or more stage spellings that are mostly stage spellings (the
    CLI's command table shares a few words with the stages, e.g. "vocab", but is a table of commands), and
    functions that dispatch on three or more stage spellings (``if stage == "bins": ... elif ...``)."""
    hits = []

    def table(strings: list[str]) -> bool:
        named = set(strings) & SPELLINGS
        return len(named) >= 3 and 2 * len(named) >= len(set(strings))

    for node in ast.walk(ast.parse(source)):
        elts = []
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        if table([e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]):
            hits.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and table(
                [w for w in re.split(r"[\s,;|]+", node.value) if w]):
            hits.append(node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            compared = {c.value for n in ast.walk(node) if isinstance(n, ast.Compare) for c in (n.left, *n.comparators)
                        if isinstance(c, ast.Constant) and c.value in SPELLINGS}
            if len(compared) >= 3:
                hits.append(node.lineno)
    return hits


@pytest.mark.parametrize("source", [
    'STAGES = ["download", "extract", "text", "vocab"]',
    'ORDER = ("tfrecord", "hdf5", "bins")',
    'DIRS = {"create_pretraining_data": "tf", "tfrecord_to_hdf5": "h5", "split-4bins": "4bins"}',
    'NAMES = "extract text vocab tfrecord".split()',
    'def run(stage):\n    if stage == "hdf5":\n        pass\n    elif stage == "bins":\n        pass\n'
    '    elif stage in ("eval_10k",):\n        pass\n    elif stage == "eval_hdf5":\n        pass\n',
])
def test_the_table_detector_finds_tables(source: str) -> None:
    """The check below can fail: every usual shape of a stage table is found."""
    assert _stage_name_tables(source)


def test_the_table_detector_leaves_other_tables() -> None:
    assert not _stage_name_tables('ok = ("text", "vocab")\nCOMMANDS = {"vocab": 1, "text": 2, "run": 3, '
                                  '"status": 4, "train": 5, "verify": 6, "demo": 7}\nmsg = "extract the text"')


def test_no_module_keeps_its_own_list_of_stages() -> None:
    """The DAG edges, tasks, --only names, status rows and summaries come from the registry: a literal list
    of stage names anywhere else in the product would drift from it."""
    offenders = []
    for folder in ("core", "preprocessing", "pretrain", "tasks", "flows", "bertpipe"):
        for path in (ROOT / folder).rglob("*.py"):
            offenders += [f"{path.relative_to(ROOT)}:{line}"
                          for line in _stage_name_tables(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_flow_parameters_are_the_data_params() -> None:
    from flows.data_flow import data_flow

    sig = inspect.signature(data_flow.fn)
    assert list(sig.parameters) == [f.name for f in fields(DataParams)]
    for f in fields(DataParams):
        default = f.default if f.default_factory is inspect.Parameter.empty or not callable(f.default_factory) \
            else f.default_factory()
        assert sig.parameters[f.name].default == default
    schema = data_flow.parameters.model_dump()["properties"]  # what the UI and deployments offer
    assert set(schema) == {f.name for f in fields(DataParams)}
    assert "reference flags" not in schema["max_seq_length"].get("description", "")  # help, not group names
    assert schema["max_seq_length"]["default"] == 512 and schema["num_test_articles"]["default"] is None


def test_the_cli_flags_are_generated_with_the_reference_spellings() -> None:
    import argparse

    from bertpipe.commands.run import add_arguments, data_params

    p = argparse.ArgumentParser()
    add_arguments(p)
    ns = p.parse_args(["--max_seq_length=128", "--max-predictions-per-seq", "20", "--do_lower_case=False",
                       "--only", "create-pretraining-data", "--force", "bins", "--no-md5", "--dump", "x.xml.bz2",
                       "--num_examples_to_pick", "7"])
    d = data_params(ns)
    assert (d.max_seq_length, d.max_predictions_per_seq, d.do_lower_case, d.stages, d.force, d.verify_md5,
            d.source, d.num_eval_examples) == (128, 20, False, ["tfrecord"], ["bins"], False, "x.xml.bz2", 7)
    assert data_params(p.parse_args([])) == DataParams()  # the CLI's defaults are DataParams' defaults


def test_errors_name_the_parameter_where_it_was_given() -> None:
    from core.errors import InputError
    from preprocessing.params import surface

    with surface("cli"), pytest.raises(InputError, match="--max-predictions-per-seq must be >= 1"):
        DataParams(max_predictions_per_seq=0)
    with pytest.raises(InputError, match="^max_predictions_per_seq must be >= 1"):  # a deployment parameter
        DataParams(max_predictions_per_seq=0)
    with surface("data."), pytest.raises(InputError, match="^data.masked_lm_prob must be < 1"):  # refresh's data
        DataParams(masked_lm_prob=1.5)
    with surface("cli"), pytest.raises(InputError, match="--only: unknown stage"):
        DataParams(stages=["nope"])
    with pytest.raises(InputError, match="^stages: unknown stage"):
        DataParams(stages=["nope"])


def test_the_shuffled_targets_shuffle_from_the_padded_parts_without_the_chop_stage() -> None:
    """nvidia-4320 and nvidia-2048 build their shuffled shards straight from the hdf5 stage (the chop's shards are
    not written); the chop stages are nvidia-varlength's (v3.1's 4,320 list) and nvidia-2048-varlength's (v1.1's
    2,048 list)."""
    p = DataParams()
    assert registry.for_target("nvidia-4320", p) == ["nvidia_4320_shuffled", "nvidia_eval"]
    assert registry.for_target("nvidia-varlength", p) == ["nvidia_4320", "nvidia_eval"]
    assert registry.for_target("nvidia-2048", p) == ["nvidia_2048_shuffled", "nvidia_eval"]
    assert registry.for_target("nvidia-2048-varlength", p) == ["nvidia_2048", "nvidia_eval"]
    decl = {s.name: s for s in registry.STAGES}
    assert decl["nvidia_4320_shuffled"].reads == ("hdf5",) and decl["nvidia_2048_shuffled"].reads == ("hdf5",)
    assert (decl["nvidia_4320_shuffled"].configure(p).rule, decl["nvidia_2048_shuffled"].configure(p).rule) == \
        ("v3.1", "v1.1")


def test_nvidia_shards_sets_every_nvidia_sets_shard_count_and_its_stage_key() -> None:
    """By default the 4,320-shard sets get 4,320 shards and the 2,048 ones 2,048 (the sample: its shards per bin);
    --nvidia-shards N (prepare_data.sh --shards) gives every chopped, shuffled and (unless --nvidia-packed-shards)
    packed NVIDIA set N shards, and another stage key, so no cached set of another count is taken for it."""
    decl = {s.name: s for s in registry.STAGES}
    nv = ("nvidia_4320", "nvidia_2048", "nvidia_4320_v11", "nvidia_4320_shuffled", "nvidia_2048_shuffled")

    def counts(p: DataParams) -> list[int]:
        return [decl[n].configure(p).num_shards for n in nv] + [decl["nvidia_packed"].configure(p).shards_num]

    assert counts(DataParams(text_dir="/t")) == [4320, 2048, 4320, 4320, 2048, 4320]
    assert counts(DataParams()) == [8] * 6  # the built-in sample
    given = DataParams(text_dir="/t", nvidia_shards=20)
    assert counts(given) == [20] * 6
    assert counts(DataParams(text_dir="/t", nvidia_shards=20, nvidia_packed_shards=7)) == [20] * 5 + [7]
    for n in nv:
        assert decl[n].key_params(decl[n].configure(given)) != \
            decl[n].key_params(decl[n].configure(DataParams(text_dir="/t")))
    from core.errors import InputError

    with pytest.raises(InputError, match="^nvidia_shards must be >= 1"):
        DataParams(nvidia_shards=0)
