"""bertpipe: the MLPerf BERT pre-training data set, byte-exact to the reference scripts, and BERT
pre-training with DeepSpeed on Gaudi, CUDA or the CPU, orchestrated by Prefect."""

__version__ = "0.1.0"
