"""How a Python worker finds its job: a cluster file and BytePS's environment variables.

Sources, strongest first:

1. the ``config`` argument of ``init()``, else the file named by ``PUSHPULL_CONFIG``;
2. environment variables, which override that file's values (as command-line flags override
   the file for pushpull's binaries):

   ================================  ==============================================
   ``DMLC_ROLE``                     must be ``worker`` if set (servers and the scheduler
                                     are pushpull's own binaries)
   ``DMLC_PS_ROOT_URI``,             the scheduler's address (``cluster.scheduler``)
   ``DMLC_PS_ROOT_PORT``
   ``DMLC_NUM_WORKER``               worker *hosts*; ``cluster.num_workers`` becomes
                                     ``DMLC_NUM_WORKER × BYTEPS_LOCAL_SIZE``
   ``DMLC_NUM_SERVER``               ``cluster.num_servers``
   ``DMLC_WORKER_ID``                this host's index; the rank is
                                     ``DMLC_WORKER_ID × BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK``
   ``BYTEPS_LOCAL_RANK``,            this process's index on its host and the processes
   ``BYTEPS_LOCAL_SIZE``             per host (default 0 and 1); without a cluster file
                                     the host's workers form a local group of
                                     ``BYTEPS_LOCAL_SIZE`` (``cluster.local_size``)
   ``PUSHPULL_TLS_CA``,              the cluster CA, this worker's certificate and key
   ``PUSHPULL_TLS_CERT``,            (``tls.ca``, ``tls.cert``, ``tls.key``)
   ``PUSHPULL_TLS_KEY``
   ``PUSHPULL_TLS_SERVER_NAME``      ``tls.server_name``
   ================================  ==============================================

Without ``DMLC_WORKER_ID`` the scheduler gives this worker the lowest free rank. Without a
cluster file, the scheduler's address and the TLS files must come from the environment.
``pushpull local --workers N -- COMMAND`` sets all of these for each copy of COMMAND.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass
class JoinSettings:
    """What ``pushpull._native.Worker(...)`` is called with; ``None`` keeps the file's value."""

    config: Optional[str] = None
    scheduler: Optional[str] = None
    num_workers: Optional[int] = None
    num_servers: Optional[int] = None
    rank: Optional[int] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    server_name: Optional[str] = None
    local_rank: int = 0
    local_size: int = 1

    def worker_kwargs(self) -> dict:
        """The keyword arguments of ``pushpull._native.Worker``. Without a cluster file the
        workers of a host form a local group of ``BYTEPS_LOCAL_SIZE`` (``cluster.local_size``);
        with one, the file says (``pushpull local --local-size G`` writes it)."""
        return {
            "local_size": self.local_size if self.config is None else None,
            "config": self.config,
            "scheduler": self.scheduler,
            "num_workers": self.num_workers,
            "num_servers": self.num_servers,
            "rank": self.rank,
            "tls_ca": self.tls_ca,
            "tls_cert": self.tls_cert,
            "tls_key": self.tls_key,
            "server_name": self.server_name,
        }


def _int(env: Mapping[str, str], name: str, minimum: int) -> Optional[int]:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}") from None
    if n < minimum:
        raise ValueError(f"{name}={value!r}: expected an integer >= {minimum}")
    return n


def join_settings(config: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> JoinSettings:
    """Reads the sources above (``env`` defaults to ``os.environ``); raises ``ValueError``
    naming the variable that is wrong."""
    env = os.environ if env is None else env
    role = env.get("DMLC_ROLE")
    if role not in (None, "", "worker"):
        raise ValueError(
            f"DMLC_ROLE={role!r}: the Python package runs workers only; start servers with "
            "`pushpull-server` and the scheduler with `pushpull-scheduler`"
        )
    s = JoinSettings(config=config or env.get("PUSHPULL_CONFIG") or None)
    uri, port = env.get("DMLC_PS_ROOT_URI"), env.get("DMLC_PS_ROOT_PORT")
    if bool(uri) != bool(port):
        missing = "DMLC_PS_ROOT_PORT" if uri else "DMLC_PS_ROOT_URI"
        raise ValueError(f"{missing} is not set, but its partner is: the scheduler's address needs both")
    if uri:
        _int(env, "DMLC_PS_ROOT_PORT", 1)
        s.scheduler = f"[{uri}]:{port}" if ":" in uri and not uri.startswith("[") else f"{uri}:{port}"
    local_size = _int(env, "BYTEPS_LOCAL_SIZE", 1) or 1
    local_rank = _int(env, "BYTEPS_LOCAL_RANK", 0) or 0
    if local_rank >= local_size:
        raise ValueError(
            f"BYTEPS_LOCAL_RANK={local_rank} is not below BYTEPS_LOCAL_SIZE={local_size}"
        )
    s.local_rank, s.local_size = local_rank, local_size
    hosts = _int(env, "DMLC_NUM_WORKER", 1)
    if hosts is not None:
        s.num_workers = hosts * local_size
    s.num_servers = _int(env, "DMLC_NUM_SERVER", 1)
    worker_id = _int(env, "DMLC_WORKER_ID", 0)
    if worker_id is not None:
        if hosts is not None and worker_id >= hosts:
            raise ValueError(f"DMLC_WORKER_ID={worker_id} is not below DMLC_NUM_WORKER={hosts}")
        s.rank = worker_id * local_size + local_rank
    s.tls_ca = env.get("PUSHPULL_TLS_CA") or None
    s.tls_cert = env.get("PUSHPULL_TLS_CERT") or None
    s.tls_key = env.get("PUSHPULL_TLS_KEY") or None
    s.server_name = env.get("PUSHPULL_TLS_SERVER_NAME") or None
    if s.config is None and s.scheduler is None:
        raise ValueError(
            "no job to join: set PUSHPULL_CONFIG (a cluster file) or DMLC_PS_ROOT_URI and "
            "DMLC_PS_ROOT_PORT (the scheduler's address), or start the script with "
            "`pushpull local --workers N -- python SCRIPT`"
        )
    return s
