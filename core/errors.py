"""The project's own exceptions. The CLI prints them as one clear line, without a traceback."""

from __future__ import annotations


class BertpipeError(Exception):
    """Base class: a problem the user can act on (bad input, bad flag, checksum mismatch...)."""


class InputError(BertpipeError, ValueError):
    """An input file or flag is not what the stage expects. The message names it and says what to do."""


class ChecksumError(BertpipeError):
    """A file's md5 differs from the one recorded upstream or published."""

    def __init__(self, path: object, expected: str, actual: str, hint: str = "") -> None:
        self.path, self.expected, self.actual = str(path), expected, actual
        self.hint = hint
        msg = f"md5 mismatch for {path}: expected {expected}, got {actual}"
        super().__init__(msg + (f". {hint}" if hint else ""))

    def __reduce__(self):  # raised in a pool or Dask worker, it crosses a pickle with its fields
        return (type(self), (self.path, self.expected, self.actual, self.hint))


class ManifestError(BertpipeError):
    """A stage directory has no manifest, or its files do not match the manifest."""


class ManifestCorrupt(ManifestError):
    """A manifest or a marker beside it (``_dropped.json``) is not what bertpipe writes: unparseable, a missing
    key, a wrong type, a file entry that leaves its stage folder. Never trusted: the stage is redone."""


class RecordError(InputError):
    """A TFRecord/HDF5 record is corrupt or malformed (names the file and the record index)."""


class DiskFullError(BertpipeError):
    """The disk (or a file-size limit) ran out while a stage was writing. Nothing was marked done."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno

    def __reduce__(self):  # see ChecksumError.__reduce__
        return (type(self), (self.errno, str(self)))
