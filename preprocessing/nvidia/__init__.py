"""NVIDIA's MLPerf BERT formats, from the padded HDF5 of ``preprocessing.mlperf``.

chop (both rounds' rules: v1.1 and v3.1), varlength (``chop_hdf5_files_to_varlength`` / ``convert_fixed2variable``),
shuffle (``shuffle_samples``), eval_pick (``pick_eval_samples_varlength``), md5 (``hdf5_md5`` and the published
``.chk`` lists in ``nvidia_chk/``) and pack (the packed set of ``packed_data/``; its C loops are
``preprocessing/_pack_native``, shared with Habana's packer through ``preprocessing.pack_fast``).

Equals: NVIDIA's ``input_preprocessing`` in MLCommons' training results v1.1 and v3.1 (../shared/reference).
Builds on ``preprocessing.mlperf``; never imported by it.
"""
