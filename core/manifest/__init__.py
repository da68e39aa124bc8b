"""Artifacts and manifests: how every stage writes its outputs and proves they are complete.

Three rooms, one purpose each, re-exported here (``from core.manifest import X`` is the public way in):
:mod:`core.manifest.format` (the manifest format, reading and verifying), :mod:`core.manifest.writes` (safe
writes: temporary names, renames, fsyncs, a full disk, fault hooks), :mod:`core.manifest.guards` (path and
deletion guards), and :mod:`core.manifest.output` (:class:`StageOutput`, which uses all three).

Rules (../shared/design/architecture.md, "Artifacts, manifests, caching"):

* outputs are written to temporary names (``.<name>.tmp-<pid>``), md5 computed while writing, then
  renamed into place;
* ``_manifest.json`` is written last, atomically: "done" means the manifest exists and verifies;
  anything in a stage directory without a manifest is debris from an interrupted run;
* a stage checks its inputs against the upstream manifest and refuses a mismatch with an error
  naming the file, the expected and the actual md5;
* what a work dir says never leads outside it: a manifest is checked against its schema before use
  (:func:`schema_problem`; a damaged one is :class:`~core.errors.ManifestCorrupt`), outputs are read only as
  plain files reached without a link (:func:`output_problem`), manifests and markers only as plain files
  (:func:`read_plain`), and deleting (:func:`drop_files`, :func:`begin_redo`, :func:`remove_debris`) stays
  inside the stage folder and never follows a link.

Fault injection (a test hook, a no-op unless ``BERTPIPE_FAULT`` is set): see :func:`fault_point`.

Typical use inside a stage::

    with StageOutput(out_dir, "clean", params=cfg_dict, upstream=[in_manifest]) as out:
        with out.open_text("wiki_00.1") as f:
            f.write(text)
        out.count("articles", 12)
    manifest = out.manifest
"""

from __future__ import annotations

from core.manifest.format import (  # noqa: F401 - re-exported
    _CHUNK,
    _MD5,
    _MD5_HEX,
    _RECORD_STATS,
    _SCHEMA,
    _TMP_NAME,
    DROPPED_NAME,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    RESERVED_NAMES,
    STAT_NAME,
    FileCheck,
    FileEntry,
    Manifest,
    _compare,
    _stat_key,
    canonical_json,
    is_done,
    load_manifest,
    md5_file,
    md5_files,
    name_problem,
    output_problem,
    outside,
    read_plain,
    read_stat_records,
    recording_stats,
    schema_problem,
    stage_key,
    verify_file,
    verify_files,
    verify_manifest,
    write_stat_records,
)
from core.manifest.guards import (  # noqa: F401 - re-exported
    DROPPED_FORMAT,
    _drop_files_list,
    begin_redo,
    check_inside,
    clear_links,
    drop_files,
    dropped_info,
    remove_debris,
    remove_entry,
)
from core.manifest.output import (  # noqa: F401 - re-exported
    _DEFERRED,
    StageOutput,
    _versions,
    deferred_md5,
    flush_deferred,
)
from core.manifest.writes import (  # noqa: F401 - re-exported
    _COMMIT_GATE,
    _DISK_FULL,
    _ERRNO_IN_MESSAGE,
    _SHORT_WRITE,
    FAULT_ENV,
    FAULT_POINTS,
    SLOW_ENV,
    HashingWriter,
    _tmp_name,
    atomic_write_text,
    commit_gate,
    disk_full_errno,
    fault_point,
    fsync_dir,
    fsync_path,
    fsync_paths,
    gate,
    late_fsyncs,
    md5_buffers,
    md5_then_fsync,
    parse_fault,
    raise_if_disk_full,
    slow_point,
    start_writeback,
    sync_fd,
)
