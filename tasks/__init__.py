"""Thin Prefect tasks: one per stage (per shard where the stage is per file). No algorithms here."""
