"""Habana's packed set (``pack``), from the padded HDF5 of ``preprocessing.mlperf``.

Equals: HabanaAI/Model-References ``pack_pretraining_data_pytorch.py`` (../shared/reference/habana). Shares the C
packing loops (``preprocessing.pack_fast``) and a few helpers with ``preprocessing.nvidia.pack``; builds on
``preprocessing.mlperf``, never imported by it.
"""
