"""Prefect flows: data (flows/data_flow.py), pretrain (flows/pretrain_flow.py), end to end (flows/e2e_flow.py)."""
