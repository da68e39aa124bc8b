"""Prefect flows wiring the tasks: data flow, pretrain flow, end-to-end flow."""
