"""Prefect flows: data (flows/data_flow.py), pretrain (flows/pretrain_flow.py), end to end (flows/e2e_flow.py),
refresh (flows/refresh_flow.py).

Library loggers (preprocessing, pretrain) are forwarded to Prefect's run logger; the setting must be in the
environment before Prefect configures logging, hence here (a no-op when Prefect was imported first).
"""

import os

os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "preprocessing,pretrain,tasks,flows")
