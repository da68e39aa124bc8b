"""The small core every layer may import: errors, manifests, the work-dir lock, process pools, the
MLPerf record schema, progress bars. It imports nothing of bertpipe's own (cli, flows, tasks,
preprocessing, pretrain) and nothing heavy.

Imports flow one way: bertpipe (cli) -> flows -> tasks -> (preprocessing | pretrain) -> core.
"""

__version__ = "0.1.0"

import os as _os

# OpenBLAS (numpy's and SciPy's) starts a thread per core when numpy is imported, and each spins ~0.1 CPU-s waiting
# for work: every bertpipe process paid it, on a 2-core machine out of the other worker's core. bertpipe does no
# matrix work a second thread would speed up (the packers' NNLS is small). A value the user set is kept.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
