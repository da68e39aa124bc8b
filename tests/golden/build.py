"""The clone tier of the golden data: ../shared/data rebuilt from the small inputs in tests/golden.

A clone without ``../shared`` still runs the byte-exact tests. tests/golden holds the real inputs (the shortened
enwiki dump, the table-markup dump, the MLPerf vocab, the synthetic edge corpus) and the digests of every
reference output (``MD5SUMS``: the md5 of each file of ../shared/data/golden; ``hdf5_content.json``: the content
of each golden HDF5 file). :func:`materialize` lays out a folder shaped like ``../shared/data`` by running
bertpipe's own stages on those inputs, and keeps a file only if its md5 is the reference file's (for HDF5
written by another h5py/HDF5 than the golden files', its content digest), so every file there *is* the
reference's file: a test reading it compares against the reference exactly as with ../shared. A stage that
does not reproduce the reference stops the build with an error naming the file (the tests that need it error,
they do not skip).

    python tests/golden/build.py OUT_DIR        # materialize (about a minute), print the layout
    python tests/golden/build.py --digests       # (re)compute hdf5_content.json from ../shared/data/golden

Not covered here (the full ../shared tier only): ``mlperf_sample/`` (4 MB of MLCommons' sample text).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
TABLES = "enwiki-table-markup.xml.bz2"
#: the shortened dump's first 127 pages (48 articles, through page id 643), cut at a </page> (README.md)
DUMP_HEAD = "enwiki-shortened-first127pages.xml.bz2"
#: the golden HDF5 files' writer (shared/data/README.md): bytes are comparable only under the same versions
GOLDEN_HDF5 = ("3.14.0", "1.14.6")
NAMES = ("wiki_00", "wiki_01", "wiki_02")
EXTRACT_TIME = "2026-11-22T04:45:00"  # CURRENTYEAR expands to 2026, as in the reference's run


class GoldenMismatch(AssertionError):
    """A rebuilt file is not the reference's."""


def md5sums() -> dict[str, str]:
    """path (relative to data/golden, or ``../name`` for data/) -> md5 of the reference file."""
    out = {}
    for line in (HERE / "MD5SUMS").read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(None, 1)
            out[name.strip()] = digest
    return out


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hdf5_digest(path: Path) -> str:
    """sha256 over what the golden HDF5 tests compare: dataset names and creation order, dtype, shape, chunks,
    compression, layout, and every value (variable-length rows element by element)."""
    import h5py
    import numpy as np

    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        order = sorted(f, key=lambda k: f[k].id.get_offset() or 0)
        h.update(json.dumps([sorted(f), order]).encode())
        for k in sorted(f):
            d = f[k]
            vlen = h5py.check_vlen_dtype(d.dtype)
            layout = d.id.get_create_plist().get_layout()
            h.update(json.dumps([k, str(d.dtype), str(vlen), list(d.shape), d.chunks, d.compression,
                                 int(layout)]).encode())
            if vlen is None:
                h.update(np.ascontiguousarray(d[:]).tobytes())
            else:
                for row in d[:]:
                    h.update(str(row.dtype).encode() + len(row).to_bytes(8, "little"))
                    h.update(np.ascontiguousarray(row).tobytes())
    return h.hexdigest()


def _same_hdf5_library() -> bool:
    import h5py

    return (h5py.version.version, h5py.version.hdf5_version) == GOLDEN_HDF5


class _Builder:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.golden = data / "golden"
        self.md5 = md5sums()
        self.content = json.loads((HERE / "hdf5_content.json").read_text(encoding="utf-8"))

    def check(self, rel: str, path: Path | None = None) -> Path:
        """Move ``path`` to golden/rel (if given) and verify it is the reference's file."""
        dst = self.golden / rel
        if path is not None and path != dst:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), dst)
        if rel.endswith(".hdf5") and not (_same_hdf5_library() and rel in self.md5 and
                                          not rel.startswith("nvidia_varlength/")):
            got, want = hdf5_digest(dst), self.content[rel]
        else:
            got, want = _md5(dst), self.md5[rel]
        if got != want:
            raise GoldenMismatch(f"tests/golden: bertpipe's {rel} is not the reference's ({got} != {want}); the "
                                 f"stage that makes it no longer reproduces the reference (compare with "
                                 f"../shared/data/golden/{rel})")
        return dst

    def unpack(self) -> None:
        """The stored files: vocab.txt, golden/edge_input.txt and golden/text_chain/** (golden.tar.xz), the
        table-markup dump and the shortened dump's first pages (see README.md)."""
        import tarfile

        self.data.mkdir(parents=True)
        with tarfile.open(HERE / "golden.tar.xz") as tar:
            tar.extractall(self.data, filter="data")
        for name in (TABLES, DUMP_HEAD):
            shutil.copyfile(HERE / name, self.data / name)
        stored = [rel for rel in self.md5 if rel.startswith(("text_chain/", "edge_input.txt"))] + [
            f"../{n}" for n in ("vocab.txt", TABLES, DUMP_HEAD)]
        for rel in stored:
            if not (self.golden / rel).is_file():
                raise GoldenMismatch(f"tests/golden lacks {rel} (golden.tar.xz or a file beside it)")
            self.check(rel)

    def records(self, tmp: Path) -> None:
        from preprocessing.mlperf.cpd_run import write_pretraining_data
        from preprocessing.mlperf.create_pretraining_data import CreatePretrainingDataConfig
        from preprocessing.mlperf.pick_eval_samples import PickEvalConfig, run_pick_eval_samples
        from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins
        from preprocessing.mlperf.tfrecord_to_hdf5 import run_tfrecord_to_hdf5
        from preprocessing.nvidia.varlength import run_pack_varlength

        vocab = str(self.data / "vocab.txt")
        for name, inp, seq, pred, dupe in (("sample.tfrecord", "text_chain/part-00000-of-00500", 512, 76, 10),
                                           ("sample_128.tfrecord", "text_chain/part-00000-of-00500", 128, 20, 2),
                                           ("edge.tfrecord", "edge_input.txt", 512, 76, 10),
                                           ("edge_128.tfrecord", "edge_input.txt", 128, 20, 2)):
            cfg = CreatePretrainingDataConfig(vocab_file=vocab, max_seq_length=seq, max_predictions_per_seq=pred,
                                              dupe_factor=dupe)
            write_pretraining_data([self.golden / inp], [tmp / name], cfg, log_examples=0)
            self.check(name, tmp / name)
        run_pick_eval_samples(self.golden / "sample.tfrecord", tmp / "p", PickEvalConfig(num_examples_to_pick=100),
                              output_name="eval_100.tfrecord")
        self.check("eval_100.tfrecord", tmp / "p" / "eval_100.tfrecord")
        for name in ("sample", "eval_100"):
            run_tfrecord_to_hdf5(self.golden / f"{name}.tfrecord", tmp / f"h{name}", output_name=f"{name}.hdf5")
            self.check(f"{name}.hdf5", tmp / f"h{name}" / f"{name}.hdf5")
        run_split_4bins([self.golden / "sample.hdf5"], tmp / "b", Split4BinsConfig(n_output_shards=8))
        for rel in sorted(k for k in self.md5 if k.startswith("4bins/")):
            self.check(rel, tmp / "b" / rel.removeprefix("4bins/"))
        run_pack_varlength([self.golden / "eval_100.hdf5"], tmp / "v")
        self.check("nvidia_varlength/eval_100_varlength.numpy1.hdf5", tmp / "v" / "eval_100.hdf5")


def materialize(out: Path) -> Path:
    """``out/data``, shaped like ../shared/data (but mlperf_sample/); reused when a previous build is complete.

    Built in a temporary sibling and renamed into place, so concurrent sessions never see half a tree.
    """
    data = out / "data"
    if (data / ".complete").is_file():
        return data
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        b = _Builder(tmp / "data")
        b.unpack()
        with tempfile.TemporaryDirectory(dir=tmp) as work:
            b.records(Path(work))
        (tmp / "data" / ".complete").write_text("every file verified against tests/golden/MD5SUMS\n")
        try:
            os.rename(tmp / "data", data)
        except OSError:  # another session finished first: use its tree
            if not (data / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return data


def compute_digests(golden: Path) -> dict[str, str]:
    return {p.relative_to(golden).as_posix(): hdf5_digest(p) for p in sorted(golden.rglob("*.hdf5"))}


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    if argv[:1] == ["--digests"]:
        digests = compute_digests(ROOT.parent / "shared" / "data" / "golden")
        (HERE / "hdf5_content.json").write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"{len(digests)} digests -> {HERE / 'hdf5_content.json'}")
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data = materialize(Path(argv[0]))
    for p in sorted(data.rglob("*")):
        if p.is_file():
            print(p.relative_to(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
