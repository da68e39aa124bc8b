"""The MLPerf/Samsung format: text to the records MLPerf's reference trains on.

tokenization, create_pretraining_data (seed 12345; its C core is ``preprocessing/_native``, loaded by
``cpd_fast``; ``cpd_run`` runs it over the parts), TFRecord (``tfrecord``), HDF5 records (``tfrecord_to_hdf5``,
``records``), the eval_10k pick (``pick_eval_samples``) and the 4 length bins (``split_4bins``).

Equals: MLPerf's reference scripts (``create_pretraining_data.py``, ``pick_eval_samples.py``) and Samsung's
converter and splitter (spec: ../shared/spec/reference-pipeline.md). The vendors' families build on this one; it
imports none of them.
"""
