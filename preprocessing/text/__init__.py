"""The text chain: a Wikipedia dump (or MLCommons' published text) to MLPerf's 500 part files, ``eval.txt`` and
``eval.md5``.

download (and archive), extract (the pinned 2019 ``WikiExtractor.py`` MLPerf uses: ``mlperf_extractor``; or the
``wikiextractor`` 3.1.0 package: ``extract``, ``extract_streams``), clean, segment (nltk punkt, with ``punkt_345``),
split_eval, gather, the fused ``pipeline``, ``text_import`` (MLCommons' text) and the vocabulary (``vocab``).

Equals: MLCommons' text chain (``process_wiki.sh``, ``cleanup_file.py``, ``do_sentence_segmentation.py``,
``seperate_test_set.py``, ``do_gather.py``) and the WikiExtractor commit MLPerf pins (../shared/reference).
Imports nothing of the other families.
"""
