"""bertpipe: the MLPerf BERT pre-training data set, byte-exact to the reference scripts, and BERT
pre-training with DeepSpeed on Gaudi, CUDA or the CPU, orchestrated by Prefect."""

from core import __version__  # noqa: F401  (one version, declared in core)
