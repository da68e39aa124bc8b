"""The record schema is declared once (core/schema.py); the C writer's feature names must match it."""

from __future__ import annotations

import re
from pathlib import Path

from core.schema import FEATURES, FLOAT_FEATURES, HDF5_DATASETS, HDF5_FIELDS

ROOT = Path(__file__).resolve().parents[1]


def test_c_header_spells_the_features_in_order() -> None:
    header = (ROOT / "preprocessing" / "_native" / "cpd_write.h").read_text(encoding="utf-8")
    m = re.search(r"FEATURE_NAMES\[(\d+)\]\s*=\s*\{([^}]*)\}", header)
    assert m, "cpd_write.h no longer declares FEATURE_NAMES"
    names = tuple(re.findall(r'"([a-z_]+)"', m.group(2)))
    assert int(m.group(1)) == len(names)
    assert names == FEATURES


def test_c_writer_writes_floats_for_the_float_features_only() -> None:
    """cpd_write.h encodes feature 5 (masked_lm_weights) as a FloatList and the rest as Int64Lists."""
    c = (ROOT / "preprocessing" / "_native" / "cpd_write.h").read_text(encoding="utf-8")
    m = re.search(r"\*p\+\+ = f == (\d) \? 0x12 : 0x1A;", c)  # the list tag: 0x12 FloatList, 0x1A Int64List
    assert m, "cpd_write.h no longer picks the list kind per feature index"
    assert [i for i, f in enumerate(FEATURES) if f in FLOAT_FEATURES] == [int(m.group(1))]


def test_hdf5_datasets_are_the_features_without_the_weights() -> None:
    assert HDF5_FIELDS == tuple(f for f in FEATURES if f != "masked_lm_weights")
    assert [d for _, d, _ in HDF5_DATASETS] == ["i4", "i1", "i1", "i4", "i4", "i1"]


def test_no_other_module_spells_the_feature_list() -> None:
    """A second literal list of the seven (or six) names would drift: only core/schema.py has one."""
    pattern = re.compile(r'"input_ids",\s*"input_mask",\s*"segment_ids"')
    hits = [p.relative_to(ROOT).as_posix() for folder in ("core", "preprocessing", "pretrain", "tasks", "flows",
                                                          "bertpipe")
            for p in (ROOT / folder).rglob("*.py") if pattern.search(p.read_text(encoding="utf-8"))]
    assert hits == ["core/schema.py"]
