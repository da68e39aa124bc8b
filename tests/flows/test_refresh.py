"""Refresh from a local mirror: no rebuild while the published md5 is unchanged; a new version when it
changes, the old version left intact and ``latest`` moved only after the new build succeeded."""

from __future__ import annotations

import bz2
import hashlib
from pathlib import Path

from flowhelpers import output_md5s

from preprocessing.sample import sample_dump_path

SMALL = {"max_seq_length": 128, "max_predictions_per_seq": 20, "dupe_factor": 1, "workers": 1,
         "stages": ["download", "extract", "text", "vocab", "tfrecord"], "vocab_size": 2000,
         "num_test_articles": 5, "current_time": "2026-01-01T00:00:00"}


def _publish(mirror: Path, data: bytes) -> str:
    (mirror / "sample-wiki.xml.bz2").write_bytes(data)
    md5 = hashlib.md5(data).hexdigest()
    (mirror / "sample-wiki.xml.bz2.md5").write_text(f"{md5}  sample-wiki.xml.bz2\n")
    return md5


def test_refresh_rebuilds_only_on_a_new_checksum(prefect_harness, tmp_path: Path) -> None:
    from flows.refresh_flow import refresh_flow

    mirror, root = tmp_path / "mirror", tmp_path / "datasets"
    mirror.mkdir()
    original = sample_dump_path().read_bytes()
    md5_1 = _publish(mirror, original)
    src = (mirror / "sample-wiki.xml.bz2").as_uri()

    r1 = refresh_flow(source=src, datasets_dir=str(root), data=SMALL)
    assert r1["rebuilt"] and r1["md5"] == md5_1
    v1 = root / "versions" / r1["version"]
    assert (root / "latest").resolve() == v1.resolve()
    v1_files = output_md5s(v1)
    assert any(k.startswith("tfrecord/") for k in v1_files)

    r2 = refresh_flow(source=src, datasets_dir=str(root), data=SMALL)
    assert not r2["rebuilt"] and r2["version"] == r1["version"] and r2["md5"] == md5_1
    assert sorted(p.name for p in (root / "versions").iterdir()) == [r1["version"]]

    # The mirror publishes a new dump (same articles, recompressed: another md5).
    md5_2 = _publish(mirror, bz2.compress(bz2.decompress(original), compresslevel=1))
    assert md5_2 != md5_1
    r3 = refresh_flow(source=src, datasets_dir=str(root), data=SMALL)
    assert r3["rebuilt"] and r3["md5"] == md5_2 and r3["previous"] == r1["version"]
    v2 = root / "versions" / r3["version"]
    assert v2 != v1 and (root / "latest").resolve() == v2.resolve()
    assert output_md5s(v1) == v1_files  # the old version is untouched
    assert any(k.startswith("tfrecord/") for k in output_md5s(v2))


def test_refresh_with_its_defaults_sizes_the_eval_split_from_a_small_dump(prefect_harness, tmp_path: Path) -> None:
    """No num_test_articles given: a dump of ~50 articles withholds 10 % of them (MLPerf's 10,000 would be refused),
    and a value that cannot be met is refused naming the deployment parameter, data.num_test_articles."""
    import json

    import pytest

    from core.errors import InputError
    from flows.refresh_flow import refresh_flow

    mirror, root = tmp_path / "mirror", tmp_path / "datasets"
    mirror.mkdir()
    _publish(mirror, bz2.compress(bz2.decompress(sample_dump_path().read_bytes()), compresslevel=2))
    src = (mirror / "sample-wiki.xml.bz2").as_uri()
    with pytest.raises(InputError, match=r"lower data\.num_test_articles") as exc:
        refresh_flow(source=src, datasets_dir=str(root), data={"workers": 1, "stages": ["text"],
                                                               "num_test_articles": 10000})
    assert "--num-test-articles" not in str(exc.value)
    assert not (root / "latest").exists()  # a failed build never moves latest
    r = refresh_flow(source=src, datasets_dir=str(root), data={"workers": 1, "stages": ["text"]})
    assert r["rebuilt"]
    text = json.loads(next((root / "latest" / "text").glob("*/_manifest.json")).read_text())
    articles = text["counters"]["articles"] + text["counters"]["eval_articles"]
    assert text["counters"]["num_test_articles"] == text["counters"]["eval_articles"] == int(articles * 0.1)


def test_a_failed_refresh_leaves_the_last_good_version_complete(prefect_harness, tmp_path: Path) -> None:
    """A new dump whose build fails (an eval split it cannot meet) leaves ``latest`` on the last good version,
    and ``bertpipe status`` of ``latest`` still reports that data set complete (exit 0), not "not done"."""
    import subprocess
    import sys

    import pytest

    from core.errors import InputError
    from flows.refresh_flow import refresh_flow

    mirror, root = tmp_path / "mirror", tmp_path / "datasets"
    mirror.mkdir()
    original = sample_dump_path().read_bytes()
    _publish(mirror, original)
    src = (mirror / "sample-wiki.xml.bz2").as_uri()
    good = refresh_flow(source=src, datasets_dir=str(root), data=SMALL)
    v1 = (root / "versions" / good["version"]).resolve()
    v1_files = output_md5s(v1)

    _publish(mirror, bz2.compress(bz2.decompress(original), compresslevel=1))  # a new md5: a rebuild is due
    with pytest.raises(InputError, match=r"data\.num_test_articles"):
        refresh_flow(source=src, datasets_dir=str(root), data={**SMALL, "num_test_articles": 10000})
    assert (root / "latest").resolve() == v1 and output_md5s(v1) == v1_files
    r = subprocess.run([sys.executable, "-m", "bertpipe.cli", "status", "--work-dir", str(root / "latest")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "0 of the current data set not done" in r.stdout, r.stdout + r.stderr
