"""What a data run builds: its targets (``bertpipe run --target``, the flow's and the deployments' ``targets``).

A target is a data set some trainer reads: the folder its input dir is, and the eval file beside it. Several
targets in one run share their upstream stages (text, vocab, TFRecords, the padded HDF5 parts, the eval chain):
each is built once. Which stages a target needs is said by each stage's declaration (``Stage.when``, beside its
library function); here are only the targets' names, what they are, and which ``last_run.json`` outputs name
their folders. This module is light (no NumPy): the CLI's --help and DataParams read it.

    samsung-4bins      the 4 length bins (bins stage)                            Samsung's MLPerf trainer, bertpipe train
    nvidia-4320        4,320 variable-length shards (v3.1 rule), shuffled        NVIDIA's MLPerf trainer v3.x (DATADIR_PHASE2)
    nvidia-2048        2,048 shards (v1.1 rule), shuffled
    nvidia-varlength   4,320 variable-length shards (v3.1 rule) in part order    NVIDIA's trainer; v3.1's 4,320 list
    nvidia-4320-v1.1   4,320 variable-length shards (v1.1 rule) in part order    NVIDIA's trainer v1.1; v1.1's 4,320 list
    nvidia-2048-varlength  2,048 shards (v1.1 rule) in part order            NVIDIA's trainer; the 2,048 list
    nvidia-packed      NVIDIA's packed set (<= 3 sequences a sample)             NVIDIA's trainer --packed_samples
    habana-packed      Habana's packed set (<= 3 sequences a pack) + metadata   Habana's trainer, packed mode (its default)
    habana-packed-raw  the same packs uncompressed (not the script's gzip)      Habana's trainer, packed mode, alike
    habana-packed-narrow  the same packs uncompressed, narrowest int types   Habana's trainer, packed mode, alike

Which published checksum list (``bertpipe verify --against``) checks which folder: ``nvidia-4320`` the shards of
``nvidia-varlength``, ``nvidia-4320-shuffled`` the shards of ``nvidia-4320``,
``nvidia-4320-v1.1`` those of ``nvidia-4320-v1.1``, ``nvidia-2048`` those of ``nvidia-2048-varlength`` (no shuffled
2,048 list is published: ``nvidia-2048`` shuffles the same rows straight from the padded parts, as ``nvidia-4320``
does v3.1's 4,320), ``nvidia-eval`` every NVIDIA target's eval file.

Every NVIDIA target comes with NVIDIA's variable-length eval file (``nvidia_eval``); every run builds the padded
eval file (``eval_hdf5``: Samsung's, Habana's and bertpipe's eval).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InputError


@dataclass(frozen=True)
class Target:
    """One target: its name, one line of help, and the ``last_run.json`` outputs naming its trainer's input dir
    (``train``) and its eval file (``eval``)."""

    name: str
    help: str
    train: str
    eval: str


#: Every target, in the order runs list them (the first is the default).
TARGETS: tuple[Target, ...] = (
    Target("samsung-4bins", "4 length bins x N shards of padded rows (Samsung's MLPerf trainer, bertpipe train)",
           train="train_dir", eval="eval_hdf5"),
    Target("nvidia-4320", "NVIDIA's 4,320 variable-length shards (chopped by v3.1's rule) shuffled across shards "
           "(hdf5_4320_shards_varlength_shuffled: its MLPerf trainer v3.x; v3.1's shuffled list) and its "
           "variable-length eval",
           train="nvidia_4320_shuffled_dir", eval="nvidia_eval_varlength"),
    Target("nvidia-2048", "2,048 variable-length shards (chopped by v1.1's rule) shuffled across shards, straight "
           "from the padded parts, and the variable-length eval",
           train="nvidia_2048_shuffled_dir", eval="nvidia_eval_varlength"),
    Target("nvidia-varlength", "NVIDIA's 4,320 variable-length shards (v3.1's rule) in part order "
           "(hdf5_4320_shards_varlength, as v3.1's 4,320 list) and its variable-length eval",
           train="nvidia_4320_varlength_dir", eval="nvidia_eval_varlength"),
    Target("nvidia-4320-v1.1", "NVIDIA's 4,320 variable-length shards chopped by v1.1's rule (rows past the last "
           "shard dropped), in part order, as v1.1's 4,320 list and its trainer; and its variable-length eval",
           train="nvidia_4320_v11_varlength_dir", eval="nvidia_eval_varlength"),
    Target("nvidia-2048-varlength", "2,048 variable-length shards chopped by v1.1's rule, in part order "
           "(hdf5_2048_shards_varlength, which NVIDIA's 2,048 list checks) and the variable-length eval",
           train="nvidia_2048_varlength_dir", eval="nvidia_eval_varlength"),
    Target("nvidia-packed", "NVIDIA's packed set, <= 3 sequences a sample (packed_data: its trainer's "
           "--packed_samples) and its variable-length eval", train="nvidia_packed_dir", eval="nvidia_eval_varlength"),
    Target("habana-packed", "Habana's packed set, <= 3 sequences a pack, and its metadata (its trainer's packed mode, "
           "the default)", train="habana_packed_dir", eval="eval_hdf5"),
    Target("habana-packed-raw", "Habana's packed set stored uncompressed: the same datasets and values as "
           "habana-packed without its gzip level 4 (its trainer reads both alike; ~5.7x the bytes, none of the "
           "deflate's CPU) and its metadata", train="habana_packed_raw_dir", eval="eval_hdf5"),
    Target("habana-packed-narrow", "Habana's packed set uncompressed, each dataset in its narrowest integer type "
           "(int16 token ids and positions, int8 the rest): the same values, which its trainer casts to int64 as it "
           "reads them (the same tensors from ~0.46x habana-packed-raw's bytes) and its metadata",
           train="habana_packed_narrow_dir", eval="eval_hdf5"),
)
DEFAULT = TARGETS[0].name
BY_NAME: dict[str, Target] = {t.name: t for t in TARGETS}


def names() -> list[str]:
    return [t.name for t in TARGETS]


def chosen(params: Any) -> tuple[str, ...]:
    """The targets of a run's parameters (anything with a ``targets`` attribute; none: the default)."""
    got = getattr(params, "targets", None)
    return tuple(got) if got else (DEFAULT,)


def normalize(values: Iterable[str] | str | None, flag: str = "targets") -> list[str]:
    """The targets as given (``None``: the default), checked, each once, in :data:`TARGETS` order;
    ``nvidia_4320`` and ``NVIDIA-4320`` are ``nvidia-4320``. InputError (one line naming ``flag`` and every valid
    target) for an unknown or empty choice."""
    if values is None:
        return [DEFAULT]
    if isinstance(values, str):
        values = [values]
    given = []
    for v in values:
        if not isinstance(v, str):
            raise InputError(f"{flag}: {v!r} is not a target name; choose from {', '.join(names())}")
        n = v.strip().lower().replace("_", "-")
        if n not in BY_NAME:
            raise InputError(f"{flag}: unknown target {v!r}; choose from {', '.join(names())}")
        given.append(n)
    if not given:
        raise InputError(f"{flag} is empty; give at least one of {', '.join(names())}")
    return [t for t in names() if t in given]


def folders(targets: Iterable[str], outputs: Mapping[str, str]) -> dict[str, dict[str, str | None]]:
    """``{target: {"train": folder, "eval": file}}`` for ``last_run.json``, from a run's outputs (None: not built)."""
    return {t: {"train": outputs.get(BY_NAME[t].train), "eval": outputs.get(BY_NAME[t].eval)}
            for t in targets if t in BY_NAME}
