"""The data DAG on a Dask cluster: what is checked before any work, and what a lost scheduler looks like.

* :func:`check_workers` (``bertpipe run --dask-address``, before the first call): every worker runs
  :func:`tasks.runtoken.probe_worker`: a GET of this run's ``PREFECT_API_URL``/health (Prefect sends the
  launcher's settings with each task, so the *head's* URL must be reachable from the workers; a worker's own
  ``PREFECT_API_URL`` is not what matters), and a read of the run's token in the work dir (the shared mount).
  A worker that fails either is named in one line (:class:`ClusterError`), and nothing runs.
* :func:`scheduler_gone`: the scheduler died or cannot be reached: one line naming it and what to do
  (:class:`ClusterGone`), instead of Dask's and Prefect's tracebacks.
* :func:`cancel`: outstanding futures of a run that stops (an error, Ctrl-C, SIGTERM) are cancelled, so no
  queued call starts after the command has ended (a call already running commits nothing: the run token).
"""

from __future__ import annotations

import logging
from typing import Any

from core.errors import BertpipeError
from tasks.runtoken import RunToken, probe_worker

#: the probe's HTTP timeout, and how long the flow waits for every worker's answer
PROBE_TIMEOUT_S = 5.0
#: how long the client may stay disconnected from the scheduler before the run gives up
GONE_AFTER_S = 20.0


class ClusterError(BertpipeError):
    """The Dask cluster cannot run this job (no workers, a worker that cannot reach Prefect or the work dir)."""


class ClusterGone(BertpipeError):
    """The Dask scheduler went away during the run."""


def check_workers(client: Any, address: str, api_url: str, token: RunToken | None, inputs: tuple[str, ...] = ()
                  ) -> int:
    """Ask every worker of ``client`` whether it reaches ``api_url``, sees ``token`` (the work dir) and the
    ``inputs`` (paths outside the work dir that calls read); the number of workers.

    Raises ClusterError naming the first worker (address and host) that cannot, and what to do."""
    try:
        answers = client.run(probe_worker, api_url, token, PROBE_TIMEOUT_S, inputs, on_error="return")
    except OSError as exc:
        raise ClusterGone(gone_line(address, exc)) from None
    if not answers:
        raise ClusterError(f"the Dask scheduler at {address} has no workers: start `dask worker {address}` on the "
                           "machines that share the work dir, then run again")
    for worker, got in sorted(answers.items()):
        if isinstance(got, BaseException) or not isinstance(got, dict):
            raise ClusterError(f"Dask worker {worker} could not run bertpipe's check ({type(got).__name__}: {got}); "
                               "does it run this checkout's environment (.venv) at the same path?")
        if got.get("work"):
            raise ClusterError(f"Dask worker {worker} on host {got['host']} does not see the run's work dir "
                               f"{token.work if token else ''} ({got['work']}): mount the shared work dir at the same "
                               "path on every worker (or stop that worker) and run again")
        if got.get("inputs"):
            raise ClusterError(f"Dask worker {worker} on host {got['host']} does not see this run's input "
                               f"({got['inputs']}): the inputs, like the work dir, must be on a file system every "
                               "worker mounts at the same path")
        if got.get("api"):
            raise ClusterError(f"Dask worker {worker} on host {got['host']} cannot reach this run's Prefect API "
                               f"({got['api']}): every worker reports its task runs to the PREFECT_API_URL of the "
                               "machine that runs `bertpipe run`; make that address reachable from the workers "
                               "(`prefect server start --host 0.0.0.0`, firewall, proxy settings) and run again")
    return len(answers)


def gone_line(address: str, why: object) -> str:
    text = " ".join(str(why).split()) or type(why).__name__
    return (f"the Dask scheduler at {address} is gone ({text[:200]}); restart it (and its workers) and run "
            "again: finished shards are kept")


def disconnected(client: Any) -> bool:
    """Whether ``client`` has lost its scheduler (closed, or reconnecting)."""
    status = getattr(client, "status", "running")
    return status not in ("running", "newly-created")


def scheduler_gone(exc: BaseException | None, client: Any, address: str) -> ClusterGone | None:
    """A ClusterGone for ``exc`` (a future's error) when the cause is the scheduler's loss, else None."""
    if client is None:
        return None
    text = str(exc or "")
    lost = "scheduler-connection-lost" in text or "lost the connection to the scheduler" in text
    if not lost and not disconnected(client):
        return None
    quiet_dask_client()
    return ClusterGone(gone_line(address, text.splitlines()[-1] if text else f"client {client.status}"))


def quiet_dask_client() -> None:
    """The client's own reconnection attempts log tracebacks: the run says what happened in one line instead."""
    for name in ("distributed.client", "distributed.comm", "distributed.core", "distributed.batched"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def cancel(futures: list[Any], client: Any) -> None:
    """Cancel ``futures`` (Prefect futures of a Dask or thread runner); quick, never raises."""
    wrapped = [getattr(f, "wrapped_future", None) for f in futures]
    dask_futures = [w for w in wrapped if hasattr(w, "key") and hasattr(w, "client")]
    for w in wrapped:
        if w is not None and not (hasattr(w, "key") and hasattr(w, "client")) and hasattr(w, "cancel"):
            try:
                w.cancel()  # a thread runner's concurrent future: only one not yet started is cancelled
            except Exception:  # noqa: BLE001 - best effort
                pass
    if dask_futures and client is not None and not disconnected(client):
        try:
            client.cancel(dask_futures, force=True)
        except Exception:  # noqa: BLE001 - the scheduler is gone: nothing will run these anyway
            pass
