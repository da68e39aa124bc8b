"""Prefect tasks around the library stages (tasks/stages.py); tasks/calls.py and tasks/lock.py are Prefect-free."""
