"""Shared pieces of the HDF5 stages: the Samsung MLPerf layout, atomic HDF5 writes, input checks.

The padded MLPerf HDF5 (Samsung ``trans_tfrecord_to_hdf5.py``, spec §10) holds six contiguous,
uncompressed datasets, created in this order (the order decides the file's bytes)::

    input_ids (N, 512) i4 | input_mask (N, 512) i1 | segment_ids (N, 512) i1
    masked_lm_positions (N, 76) i4 | masked_lm_ids (N, 76) i4 | next_sentence_labels (N,) i1

``masked_lm_weights`` is not stored: the number of predictions is the index of the first 0 in
``masked_lm_positions`` (position 0 is always [CLS], never masked).

**Every HDF5 file bertpipe writes goes through** :func:`h5_create` (or its two halves :func:`h5_open_new` /
:func:`h5_close_for_good`, for a writer that keeps many files open at once, as split_4bins does). A new writer
(the NVIDIA/Habana layouts included) must do the same, never ``h5py.File(path, "w")``: with h5py's default
("weak") file-close degree, closing a file is postponed while any id of it is still referenced, and anything
that holds a Python frame (a sampling profiler, a debugger, Dask's call-stack view, ``sys._current_frames()``)
keeps the locals of the writer's functions alive. The file is then renamed and hashed before HDF5 has written
its last bytes (it was 65,536 bytes in issue 21), and the manifest records the md5 of an unfinished file. The
helper opens with a strong close degree, closes every object of the file however many references are held,
checks that none is left open, and fsyncs the file, all before the caller renames or hashes it. Same bytes as
``h5py.File(path, "w", **kw)``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.errors import BertpipeError, InputError, ManifestError, RecordError
from core.manifest import FileCheck, Manifest, StageOutput, raise_if_disk_full, verify_files
from core.manifest.writes import sync_fd
from core.pools import run_all
from core.schema import H5_ERRORS, HDF5_DATASETS, row_shape

if TYPE_CHECKING:
    import h5py

#: Config fields that change how fast a stage runs, never what it writes: kept out of the stage key.
EXECUTION_ONLY = frozenset({"batch_size", "chunk_rows", "group_files", "validate_batch"})


def stage_params(cfg: object) -> dict:
    """The config as manifest/cache-key parameters, without :data:`EXECUTION_ONLY` fields."""
    return {k: v for k, v in asdict(cfg).items() if k not in EXECUTION_ONLY}  # type: ignore[call-overload]


def tmp_path(final: Path) -> Path:
    """A temporary name that StageOutput's debris sweep recognises (``.<name>.tmp-<pid>``)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path to write; renamed to ``final`` on success, removed on error."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, final)  # h5py's OSError / RuntimeError of a full disk -> DiskFullError
        raise


def h5_open_new(path: Path | str, *, in_memory: bool = False, image_callbacks: int | None = None,
                **kw: Any) -> h5py.File:
    """Create (truncate) ``path`` for writing, as ``h5py.File(path, "w", **kw)`` does (h5py's own property
    lists, so the same bytes) but with HDF5's strong file-close degree. Close it with :func:`h5_close_for_good`.

    ``in_memory``: build the file in memory (HDF5's core driver; :func:`h5_create` writes its image itself: the
    same bytes, fewer system calls, and a full disk fails a plain write, never an HDF5 flush; for small files).
    ``image_callbacks``: with ``in_memory``, the address of HDF5 file-image callbacks (``H5Pset_file_image_callbacks``)
    that give the core driver its memory (preprocessing.packing.h5_image). ``kw``: any other ``h5py.File`` keyword
    (``libver``, ``track_order``, ``userblock_size``, ``fs_strategy``, cache and driver settings...).
    """
    import h5py
    from h5py import h5f
    from h5py._hl import files as hl  # h5py.File's own property-list builders (the lists "w" would use)

    fcpl_kw = {k: kw.pop(k) for k in ("fs_strategy", "fs_persist", "fs_threshold", "fs_page_size") if k in kw}
    track_order = kw.pop("track_order", None)
    userblock_size = kw.pop("userblock_size", None)
    driver = kw.pop("driver", None)
    if in_memory:
        if driver not in (None, "core"):
            raise ValueError(f"h5_open_new: in_memory=True uses the core driver, not {driver!r}")
        driver = "core"
        kw.setdefault("backing_store", True)
    fapl = hl.make_fapl(driver, **kw)
    fapl.set_fclose_degree(h5f.CLOSE_STRONG)  # H5Fclose closes every object of the file, then the file
    if image_callbacks is not None:
        if driver != "core":
            raise ValueError("h5_open_new: image_callbacks need in_memory=True (the core driver)")
        set_image_callbacks(fapl.id, image_callbacks)
    fcpl = hl.make_fcpl(track_order=h5py.get_config().track_order if track_order is None else track_order,
                        **fcpl_kw)
    return h5py.File(hl.make_fid(os.fsencode(os.fspath(path)), "w", userblock_size, fapl, fcpl))


def libhdf5() -> Any:
    """The HDF5 library h5py runs on (ctypes; the one loaded in this process), or None where it cannot be found."""
    import ctypes

    import h5py  # noqa: F401 - loads the library

    if _LIBHDF5:
        return _LIBHDF5[0]
    lib = None
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/libhdf5" in line}
        names = sorted(p for p in paths if re.search(r"/libhdf5(_serial)?[-.][^/]*$", p))
        if names:
            lib = ctypes.CDLL(names[0])
            lib.H5Pset_file_image_callbacks.argtypes = (ctypes.c_int64, ctypes.c_void_p)
            lib.H5Pset_file_image_callbacks.restype = ctypes.c_int
    except (OSError, AttributeError):
        lib = None
    _LIBHDF5.append(lib)
    return lib


_LIBHDF5: list[Any] = []


def set_image_callbacks(fapl_id: int, callbacks: int) -> None:
    """``H5Pset_file_image_callbacks(fapl_id, callbacks)`` (the address of an ``H5FD_file_image_callbacks_t``)."""
    lib = libhdf5()
    if lib is None or lib.H5Pset_file_image_callbacks(fapl_id, callbacks) < 0:
        raise BertpipeError("HDF5 refused the file-image callbacks (H5Pset_file_image_callbacks)")


def close_after_failure(f: h5py.File) -> None:
    """Close ``f`` after an error in the block that wrote it, without fsync, never raising: the error on its way is
    the one that counts, and the file is removed (or, in memory, never reaches the disk)."""
    try:
        h5_close_for_good(f, fsync=False)
    except Exception:  # noqa: BLE001,S110 - closing after a failure: the file is removed anyway
        pass


def h5_close_for_good(f: h5py.File, *, fsync: bool = True) -> None:
    """Close ``f`` (from :func:`h5_open_new`) so that its bytes on disk are final, then fsync it.

    Every object of the file that is open in this process (datasets, groups, attributes, other ids of the file)
    is closed, however many references to it are still held (by a profiler's or debugger's frames, for
    instance: h5py's ``File.close()`` does the same, plus a sweep over every object the process has open,
    which costs milliseconds per file with hundreds of files open). The ids still held become invalid.

    Raises:
        BertpipeError: an object of the file is still open afterwards (the same file opened a second time in
            this process): its bytes are not final, so it must not be renamed or hashed.
    """
    from h5py import h5f, h5i

    fid = f.id
    if not fid.valid:
        raise BertpipeError(f"h5_close_for_good: {f!r} was closed already; let h5_create / h5_close_for_good "
                            "close it (a file closed otherwise may not be closed for good)")
    path = f.filename
    every = h5f.get_obj_ids(fid, h5f.OBJ_ALL)  # what is open of this file in this process (one ref more each)
    mine = h5f.get_obj_ids(fid, h5f.OBJ_ALL | h5f.OBJ_LOCAL)  # ... opened through this handle of it
    failed: BaseException | None = None
    for obj in sorted(mine, key=lambda o: isinstance(o, h5f.FileID)):  # the file's objects first, then the file
        while obj.valid:
            refs = h5i.get_ref(obj)
            try:
                h5i.dec_ref(obj)
            except Exception as exc:  # noqa: BLE001 - the close's flush failed (a full disk): HDF5 keeps the id
                failed = failed or exc
            if obj.valid and h5i.get_ref(obj) >= refs:  # no progress: never decrement past it (that crashes)
                break
    if failed is not None:
        del every, mine
        raise failed
    left = [type(o).__name__ for o in every if o.valid]
    del every, mine  # the refs taken above on what is left open: given back
    if left:
        raise BertpipeError(f"{path}: the HDF5 file cannot be closed for good: {len(left)} object(s) of it "
                            f"({', '.join(sorted(set(left)))}) are still open in this process (the file was "
                            "opened a second time?); its bytes are not final, so it is not renamed or hashed")
    if fsync:
        fsync_file(path)


@contextmanager
def h5_create(path: Path | str, *, in_memory: bool = False, fsync: bool = True, **kw: Any) -> Iterator[h5py.File]:
    """``with h5_create(tmp) as f:`` write ``f``; when the block ends the file is closed for good and fsynced
    (:func:`h5_close_for_good`), so it may be renamed and hashed. On an error it is closed and the error
    raised (the caller removes the file: :func:`atomic_path` / :func:`stage_file`). Arguments: see
    :func:`h5_open_new`. Every HDF5 writer of bertpipe goes through here (see the module docstring)."""
    if in_memory:  # built in memory, its image written here: a full disk is an ordinary OSError, never HDF5's
        f = h5_open_new(path, in_memory=True, **{**kw, "backing_store": False})
        try:
            yield f
            f.flush()
            image = f.id.get_file_image()  # the bytes HDF5's core driver would write at close (same file)
        finally:
            h5_close_for_good(f, fsync=False)  # in memory: nothing to write
        with open(path, "wb") as out:
            out.write(image)
            out.flush()
            if fsync:
                sync_fd(out.fileno())
        return
    f = h5_open_new(path, in_memory=in_memory, **kw)
    try:
        yield f
    except BaseException:
        close_after_failure(f)
        raise
    h5_close_for_good(f, fsync=fsync)


def fsync_file(path: Path | str) -> None:
    """Flush a closed file's data to the disk (as StageOutput does for the files it writes): now, or inside a
    deferred-md5 block, at its end (core.manifest.writes.sync_fd)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        sync_fd(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system that cannot fsync: nothing to do
            raise
    finally:
        os.close(fd)


@contextmanager
def stage_file(out: StageOutput, name: str) -> Iterator[Path]:
    """Like :func:`atomic_path` for a file of a stage: recorded (size, md5) in its manifest."""
    with atomic_path(out.path(name)) as tmp:
        yield tmp
        out.fault("rename")
    out.add_file(name)


def verify_inputs(paths: Sequence[Path], upstream: Sequence[Manifest], *, workers: int = 1) -> None:
    """Check each input against the upstream manifest entry of the same name (size and md5).

    The md5 is not recomputed for a file whose size, mtime, ctime and inode are those recorded beside the
    upstream manifest when that md5 was last known (``.verified.json``, written by the data DAG: the rule of
    every "done?" check, see core.manifest.verify_manifest); in the DAG that spares re-reading each 500 MB
    TFRecord that was hashed while it was written a moment before. The md5s that are due are taken side by side
    (core.manifest.md5_files), on ``workers`` processes when there are several files.

    Raises:
        ManifestError: an input is not listed upstream or its size differs.
        ChecksumError: its md5 differs.
    """
    if not upstream:
        return
    checks = []
    for p in paths:
        p = Path(p)
        entry = next((f for m in upstream for f in m.files
                      if f.name == p.name or p.as_posix().endswith("/" + f.name)), None)
        if entry is None:
            stages = ", ".join(sorted({m.stage for m in upstream}))
            raise ManifestError(f"{p} is not listed in the upstream manifest(s) of {stages}; "
                                "pass the files that stage produced")
        checks.append(FileCheck(p, entry.md5, entry.bytes, not _stat_known(p, entry.name, entry.md5),
                                "per the upstream manifest"))
    due = [c for c in checks if c.check_md5]
    if workers <= 1 or len(due) < 2:
        verify_files(checks)
        return
    verify_files([replace(c, check_md5=False) for c in checks])  # every presence and size, here, first
    n = min(len(due), 2 * workers)
    run_all(verify_files, [(due[i::n],) for i in range(n)], workers)  # round robin: calls of similar bytes


def _stat_known(path: Path, name: str, md5: str) -> bool:
    """Whether ``path`` (manifest entry ``name``) is unchanged since its md5 ``md5`` was recorded."""
    from core.manifest import read_stat_records

    posix = path.as_posix()
    if not posix.endswith(name):
        return False
    rec = read_stat_records(Path(posix[:len(posix) - len(name)] or ".")).get(name)
    if not rec or rec[-1] != md5:
        return False
    try:
        st = path.stat()
    except OSError:
        return False
    return rec[:-1] == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


@contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """Turn h5py's errors while reading ``what`` of ``path`` into a RecordError naming the file.

    Only reads go in here: an OSError while *writing* (a full disk) is not a corrupt input.
    """
    try:
        yield
    except BertpipeError:
        raise
    except H5_ERRORS as exc:
        raise RecordError(f"{path}: cannot read {what} ({type(exc).__name__}: {exc}); the HDF5 file is "
                          "corrupt or truncated: re-create it (tfrecord-to-hdf5 / split-4bins)") from exc


def open_padded(path: Path, *, max_seq_length: int = 512, max_predictions_per_seq: int = 76) -> h5py.File:
    """Open a padded MLPerf HDF5 for reading, checking its six datasets (names, shapes, integer dtypes).

    Raises:
        InputError: the file is missing, not HDF5, or a dataset is missing or malformed.
        RecordError: the file's structure is damaged (h5py fails to read its metadata).
    """
    import h5py

    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"HDF5 file {path} does not exist") from None
    except H5_ERRORS as exc:
        raise InputError(f"{path} is not a readable HDF5 file ({exc}); re-create it with tfrecord-to-hdf5") from None
    try:
        with reading(path, "its datasets"):
            _check_padded(f, path, max_seq_length, max_predictions_per_seq)
    except BaseException:
        f.close()
        raise
    return f


def _check_padded(f: h5py.File, path: Path, max_seq_length: int, max_predictions_per_seq: int) -> None:
    import h5py

    n = None
    for name, _, kind in HDF5_DATASETS:
        if name not in f:
            raise InputError(f"{path} has no dataset {name!r}; an MLPerf padded HDF5 has "
                             f"{', '.join(d[0] for d in HDF5_DATASETS)} (make it with tfrecord-to-hdf5)")
        ds = f[name]
        if not isinstance(ds, h5py.Dataset):
            raise InputError(f"{path}: {name!r} is a {type(ds).__name__}, not a dataset; the file is corrupt or "
                             "not an MLPerf padded HDF5 (make it with tfrecord-to-hdf5)")
        want = row_shape(kind, max_seq_length, max_predictions_per_seq)
        if ds.shape[1:] != want or ds.dtype.kind not in "iu" or (n is not None and ds.shape[0] != n):
            raise InputError(f"{path}: dataset {name!r} has shape {ds.shape} and dtype {ds.dtype}, expected "
                             f"({n if n is not None else 'N'}, {', '.join(map(str, want))}) integers "
                             "(check --max_seq_length / --max_predictions_per_seq)")
        n = ds.shape[0]


def chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` row ranges of at most ``size`` rows covering ``range(n)``."""
    for a in range(0, n, size):
        yield a, min(a + size, n)


def sequence_lengths(input_mask: np.ndarray) -> np.ndarray:
    """``sum(input_mask)`` per row in int64 (summing int8 in int8 overflows under NumPy 2). Summed in int32 where
    that is exact (bytes, rows of up to 2**23 values): twice as fast as int64 sums over 512 values a row."""
    if input_mask.ndim == 2 and input_mask.shape[1] <= (1 << 23) and input_mask.dtype.itemsize == 1:
        return input_mask.sum(axis=1, dtype=np.int32).astype(np.int64)
    return input_mask.sum(axis=1, dtype=np.int64)


#: HDF5's H5Dwrite, from the library h5py loaded (``[fn]``; ``[None]`` where it cannot be found): see vlen_write.
_H5DWRITE: list[Any] = []


def _h5dwrite() -> Any:
    """ctypes' H5Dwrite of the HDF5 library h5py has loaded (the one file of ``/proc/self/maps`` named
    ``libhdf5[-.]…``, of h5py's own version), or None: another platform, several HDF5 libraries, or
    ``BERTPIPE_H5_DIRECT=0``."""
    if not _H5DWRITE:
        fn = None
        if os.environ.get("BERTPIPE_H5_DIRECT", "1").lower() not in ("0", "false", "no"):
            try:
                import ctypes
                import re

                import h5py

                with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
                    libs = {ln.split()[-1] for ln in maps if re.search(r"/libhdf5[-.][^/]*$", ln.strip())}
                if len(libs) == 1:
                    lib = ctypes.CDLL(libs.pop())
                    major, minor, release = (ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint())
                    lib.H5get_libversion(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
                    if f"{major.value}.{minor.value}.{release.value}" == h5py.version.hdf5_version:
                        fn = lib.H5Dwrite
                        fn.argtypes = [ctypes.c_int64] * 5 + [ctypes.c_void_p]
                        fn.restype = ctypes.c_int
            except (OSError, AttributeError, ValueError):
                fn = None
        _H5DWRITE.append(fn)
    return _H5DWRITE[0]


def vlen_write(dsid: Any, mspace: Any, fspace: Any, buf: np.ndarray, mtype: Any) -> None:
    """``dsid.write(mspace, fspace, buf, mtype=mtype)`` for a variable-length dataset (``buf``: the ``hvl_t``
    elements), as one H5Dwrite of HDF5 itself. h5py's write first converts every element into a buffer of its own
    (H5Tconvert: an allocation and a copy of each row's values), then writes that; HDF5 reads the elements where
    they are, so the values are copied once less (the same heap objects, in the same order: the same bytes). Where
    the direct call is not available, or fails, h5py's write runs (and raises what it always raised)."""
    fn = _h5dwrite()
    if fn is not None:
        from h5py._objects import phil

        buf = np.ascontiguousarray(buf)
        with phil:  # h5py's lock around every HDF5 call
            if fn(dsid.id, mtype.id, mspace.id, fspace.id, 0, buf.ctypes.data) >= 0:  # 0: H5P_DEFAULT
                return
    dsid.write(mspace, fspace, buf, mtype=mtype)


def write_vlen(ds: Any, flat: np.ndarray, counts: np.ndarray, start: int = 0) -> None:
    """``ds[start + i] = row i`` of a variable-length dataset, rows of ``counts[i]`` values of ``flat`` back to back,
    in one HDF5 write: the ``hvl_t`` elements (length, pointer) point into ``flat`` (cast to the dataset's element
    type: check the range first). The same bytes as h5py's write of the rows as an object array, without a Python
    object per row (pack-nvidia's writer, with a start row: the chop and the shuffle write a shard chunk by chunk)."""
    import h5py
    from h5py import h5s, h5t

    n = len(counts)
    if not n:
        return
    base = h5py.check_vlen_dtype(ds.dtype)
    flat = np.ascontiguousarray(flat, dtype=base)
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) != flat.shape[0]:
        raise ValueError(f"write_vlen: {flat.shape[0]} values for rows of {int(counts.sum())}")
    hvl = np.empty(n, dtype=[("len", np.uintp), ("p", np.uintp)])
    hvl["len"] = counts
    hvl["p"] = flat.ctypes.data + (np.cumsum(counts) - counts) * flat.itemsize
    fspace = ds.id.get_space()
    fspace.select_hyperslab((start,), (n,))
    vlen_write(ds.id, h5s.create_simple((n,)), fspace, hvl, h5t.vlen_create(h5t.py_create(flat.dtype)))
