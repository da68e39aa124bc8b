"""Which length bins the rows of one micro-batch come from (``--batch-mix``), and one step over mixed rows.

Three ways, over the 4-bin layout (``{128,256,384,512}/part_<k>_of_<N>.hdf5``):

* ``one-bin``: every micro-batch from one bin, the bins' batches shuffled over the epoch (bertpipe's own, the
  fastest: a batch is padded to its bin only). No reference trains this way: with the golden sample 73 % of
  the steps are all-512 rows, the others all-short.
* ``random``: rows of any length drawn at random from all of this rank's rows (a permutation per epoch), as
  NVIDIA's MLPerf trainer, MLCommons' reference and Habana's DeepSpeed BERT sample rows from their files; the
  batch's composition varies from step to step with the data's length mix. The runs MLPerf's reference
  convergence points come from draw batches this way: the default of ``--model large`` (and base, 1.5b, 5b).
* ``split`` (``--split-batch-cnt 6 3 2 5``): exactly that many rows of the bins 128, 256, 384, 512 in every
  micro-batch, Samsung's MLPerf v1.1 trainer (``--use_split_data --split_batch_cnt 6 3 2 5``: its
  ``SplitRandomSampler`` takes a permutation of each bin's rows, cut into groups of the bin's count, and
  concatenates one group of each bin per batch, for as many batches as the scarcest bin allows). The
  micro-batch is the counts' sum (16 for Samsung's).

A mixed micro-batch runs as one forward per bin (each piece padded to its bin's bound, not to 512), and its
loss is the loss of the same rows in one padded batch: masked-LM loss = the pieces' summed token losses over
all masked tokens, NSP loss = the pieces' summed row losses over all rows (:func:`combined_losses`;
tests/pretrain/test_batch_mix.py checks it against the padded batch).
"""

from __future__ import annotations

from core.errors import InputError

MIXES = ("one-bin", "random", "split")
SAMSUNG_COUNTS = (6, 3, 2, 5)


def split_counts(cfg) -> tuple[int, ...] | None:  # noqa: ANN001 - a TrainConfig
    """The ``--split-batch-cnt`` counts (bins 128, 256, 384, 512), or None when the mix is not ``split``.

    Raises:
        InputError: malformed counts, or ``split`` without counts, or counts with another mix.
    """
    text = cfg.split_batch_cnt.replace(",", " ").split()
    if cfg.batch_mix != "split":
        if text:
            raise InputError(f"--split-batch-cnt {cfg.split_batch_cnt} goes with --batch-mix split, not "
                             f"{cfg.batch_mix}")
        return None
    if not text:
        raise InputError("--batch-mix split needs --split-batch-cnt C128 C256 C384 C512, the rows of each bin in a "
                         f"micro-batch (Samsung's: {' '.join(map(str, SAMSUNG_COUNTS))})")
    try:
        counts = tuple(int(t) for t in text)
    except ValueError:
        raise InputError(f"--split-batch-cnt {cfg.split_batch_cnt}: expected 4 integers (rows of the bins 128, 256, "
                         "384, 512 in a micro-batch), e.g. 6 3 2 5") from None
    if len(counts) != 4 or min(counts) < 0 or sum(counts) == 0:
        raise InputError(f"--split-batch-cnt {cfg.split_batch_cnt}: expected 4 integers >= 0, not all 0 (rows of "
                         "the bins 128, 256, 384, 512 in a micro-batch), e.g. 6 3 2 5")
    if cfg.micro_batch and cfg.micro_batch != sum(counts):
        raise InputError(f"--micro-batch {cfg.micro_batch} is not the sum of --split-batch-cnt "
                         f"{' '.join(map(str, counts))} ({sum(counts)}): drop --micro-batch or make them agree")
    return counts


def check_bins(cfg, bins: dict) -> None:  # noqa: ANN001 - a TrainConfig, {bound: shards}
    """Refuse, before any rank starts, a split mix whose bins the padded training data lacks (``bins``: the
    data's bins, {} for packed data)."""
    counts = split_counts(cfg)
    if not counts or not bins:
        return
    from core.schema import BIN_BOUNDS

    want = [b for b, c in zip(BIN_BOUNDS, counts, strict=True) if c]
    have = [b for b, shards in bins.items() if any(s.rows for s in shards)]
    missing = [b for b in want if b not in have]
    if missing or set(bins) - set(BIN_BOUNDS):
        raise InputError(f"--split-batch-cnt {' '.join(map(str, counts))} draws from the bins "
                         f"{', '.join(map(str, want))}, but {cfg.train_dir} has rows in the bins "
                         f"{', '.join(map(str, sorted(have)))}: give a 4-bin folder (split-4bins) or 0 for the missing bins")


def describe_mix(cfg) -> str:  # noqa: ANN001
    if cfg.batch_mix == "one-bin":
        return "batches: one length bin per micro-batch (bertpipe's)"
    if cfg.batch_mix == "random":
        return ("batches: rows of any length at random, one forward per bin (as NVIDIA's and MLCommons' MLPerf "
                "trainers and Habana's)")
    counts = split_counts(cfg)
    return (f"batches: {'/'.join(map(str, counts))} rows of bins 128/256/384/512 per micro-batch (Samsung's "
            "--split_batch_cnt)")


def combined_losses(outs: list, rows: list[int]):  # noqa: ANN001 - PretrainingOutput list, torch tensors
    """(loss, mlm_loss, nsp_loss) of a micro-batch run as pieces: what one padded batch of all their rows gives.

    MLM: each piece's mean over its masked tokens, weighted by its token count over all tokens; NSP: each
    piece's mean over its rows, weighted by its rows over all rows.
    """
    if len(outs) == 1:
        return outs[0].loss, outs[0].mlm_loss, outs[0].nsp_loss
    counts = [o.mlm_count for o in outs]
    total = sum(counts).clamp(min=1)
    mlm = sum(o.mlm_loss * c for o, c in zip(outs, counts, strict=True)) / total
    nsp = sum(o.nsp_loss * n for o, n in zip(outs, rows, strict=True)) / sum(rows)
    return mlm + nsp, mlm, nsp
