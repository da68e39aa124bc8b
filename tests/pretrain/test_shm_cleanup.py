"""DeepSpeed's CPU all-reduce leaves one ~69 MB POSIX shared-memory segment a rank in /dev/shm (it never unlinks
them); the launcher removes its training's segments once the ranks are gone."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pretrain.extensions import SHM_PREFIX, release_shm_buffers, shm_buffers


def test_only_this_trainings_segments_are_removed(tmp_path: Path) -> None:
    uid = os.getuid()
    ours = [tmp_path / f"{SHM_PREFIX}_{uid}_127.0.0.1_29501_{r}" for r in range(2)]
    others = [tmp_path / f"{SHM_PREFIX}_{uid}_127.0.0.1_29502_0",   # another training's port
              tmp_path / f"{SHM_PREFIX}_{uid + 1}_127.0.0.1_29501_0",  # another user's
              tmp_path / f"{SHM_PREFIX}_{uid}_127.0.0.1_29501_x",   # not a rank's
              tmp_path / "other_29501_0"]
    for p in ours + others:
        p.write_bytes(b"x")
    said: list[str] = []
    assert shm_buffers(29501, shm_dir=tmp_path) == ours
    assert release_shm_buffers(29501, say=said.append, shm_dir=tmp_path) == 2
    assert not any(p.exists() for p in ours) and all(p.exists() for p in others)
    assert said and "2 shared-memory" in said[0] and "29501" in said[0]
    assert release_shm_buffers(29501, shm_dir=tmp_path) == 0  # nothing left: nothing said
    assert release_shm_buffers(0, shm_dir=tmp_path) == 0


def test_a_real_two_rank_training_leaves_no_segment_behind(vocab_run: Path) -> None:
    """The shared 2-rank DeepSpeed run (tests/pretrain/conftest.py): its launcher removed both ranks' segments."""
    log = (vocab_run / "launcher.log").read_text()
    m = re.search(r"removed DeepSpeed's (\d+) shared-memory all-reduce segment\(s\) of this training \(master port "
                  r"(\d+)\)", log)
    assert m, "the launcher removed no segment: did DeepSpeed's CPU all-reduce not run?"
    assert int(m.group(1)) == 2
    assert shm_buffers(int(m.group(2))) == []
