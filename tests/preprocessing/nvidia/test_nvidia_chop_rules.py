"""NVIDIA's full-size shard layout without the data: each chop rule's per-shard row counts for its 156,726,829
sequences, and which shards the two rounds' published 4,320 lists agree on (preprocessing/nvidia/nvidia_chk)."""

from __future__ import annotations

import numpy as np

from preprocessing.nvidia.chop import chop_layout, layout_of, reference_crash
from preprocessing.nvidia.md5 import CHK_DIR, PUBLISHED, read_chk

#: NVIDIA's count of training sequences (its packed_data/README's "original 156726829").
NVIDIA_SEQUENCES = 156_726_829


def sizes(rows: int, n: int, rule: str) -> np.ndarray:
    return np.array(chop_layout(rows, n, rule).sizes())


def test_full_size_4320_rules_agree_on_shards_0_to_2770_only():
    lay31, lay11 = chop_layout(NVIDIA_SEQUENCES, 4320, "v3.1"), chop_layout(NVIDIA_SEQUENCES, 4320, "v1.1")
    assert (lay31.nominal, lay31.excess) == (lay11.nominal, lay11.excess) == (36_280, 2_771)
    v31, v11 = sizes(NVIDIA_SEQUENCES, 4320, "v3.1"), sizes(NVIDIA_SEQUENCES, 4320, "v1.1")
    assert (v31[:2771] == 36_279).all() and (v31[2771:] == 36_280).all() and v31.sum() == NVIDIA_SEQUENCES
    assert (v11 == 36_279).all() and lay11.dropped == 1_549 and lay31.dropped == 0
    # the same rows in the same shard (same size and same first row) exactly on shards 0..2770
    s31 = np.array([lay31.start(k) for k in range(4320)])
    s11 = np.array([lay11.start(k) for k in range(4320)])
    same = np.flatnonzero((v31 == v11) & (s31 == s11))
    assert same.tolist() == list(range(2771))


def test_full_size_2048_rules_agree_on_shards_0_to_466_only():
    lay31, lay11 = chop_layout(NVIDIA_SEQUENCES, 2048, "v3.1"), chop_layout(NVIDIA_SEQUENCES, 2048, "v1.1")
    assert (lay31.nominal, lay31.excess) == (76_527, 467)
    v31, v11 = np.array(lay31.sizes()), np.array(lay11.sizes())
    assert (v11 == 76_526).all() and lay11.dropped == 2048 - 467 and v31.sum() == NVIDIA_SEQUENCES
    s31 = np.array([lay31.start(k) for k in range(2048)])
    s11 = np.array([lay11.start(k) for k in range(2048)])
    assert np.flatnonzero((v31 == v11) & (s31 == s11)).tolist() == list(range(467))
    assert not reference_crash(NVIDIA_SEQUENCES, 2048, "v1.1") and not reference_crash(NVIDIA_SEQUENCES, 4320, "v3.1")


def test_the_two_published_4320_lists_agree_exactly_where_the_rules_do():
    """v3.1's 4320_shards_varlength.chk (nvidia-4320) and v1.1's (nvidia-4320-v1.1) give the same digest on exactly
    shards 0..2770: where the rules put the same rows; so each list is its round's rule."""
    a = read_chk(CHK_DIR / PUBLISHED["nvidia-4320"])
    b = read_chk(CHK_DIR / PUBLISHED["nvidia-4320-v1.1"])
    assert list(a) == list(b) and len(a) == 4320
    same = [k for k, name in enumerate(a) if a[name] == b[name]]
    assert same == list(range(2771))


def test_v31_rule_with_no_excess_is_even_and_layout_arithmetic():
    """n_excess 0: v3.1's script dies (IndexError); bertpipe gives every shard nominal rows, on purpose."""
    lay = chop_layout(4320 * 36_280, 4320, "v3.1")
    assert lay.excess == 0 and set(lay.sizes()) == {36_280} and lay.dropped == 0
    lay = chop_layout(4320 * 36_280, 4320, "v1.1")
    assert lay.sizes()[0] == 36_279 and set(lay.sizes()[1:]) == {36_280} and lay.dropped == 1
    for rows in range(1, 200):
        for n in range(1, 60):
            lay = layout_of(rows, n, "v3.1")
            if reference_crash(rows, n, "v3.1"):
                assert lay.nominal == 1 and lay.excess >= 2
                continue
            assert sum(lay.sizes()) == rows and lay.kept == rows
            assert [lay.start(k + 1) - lay.start(k) for k in range(n)] == lay.sizes()
