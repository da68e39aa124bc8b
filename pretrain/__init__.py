"""BERT pre-training with DeepSpeed on HPU, CUDA or CPU: a plain library (never imports Prefect).

`pretrain/train.py` is the program that the `deepspeed` launcher or `torchrun` starts.
"""
