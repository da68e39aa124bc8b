"""Prefect tasks around the library stages (tasks/stages.py); tasks/calls.py is Prefect-free; the work-dir lock is core/lock.py."""
