"""The small core every layer may import: errors, manifests, the work-dir lock, process pools, the
MLPerf record schema, progress bars. It imports nothing of bertpipe's own (cli, flows, tasks,
preprocessing, pretrain) and nothing heavy.

Imports flow one way: bertpipe (cli) -> flows -> tasks -> (preprocessing | pretrain) -> core.
"""

__version__ = "0.1.0"
