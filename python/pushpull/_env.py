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

   torchrun's variables are read the same way where BytePS's are not set (both set and
   different: an error naming both):

   ================================  ==============================================
   ``MASTER_ADDR``, ``MASTER_PORT``  the scheduler's address (its QUIC port may be the
                                     same number as torch's TCP store: UDP and TCP)
   ``WORLD_SIZE``                    ``cluster.num_workers`` (every worker process)
   ``RANK``                          this worker's rank
   ``LOCAL_RANK``,                   ``BYTEPS_LOCAL_RANK`` and ``BYTEPS_LOCAL_SIZE``
   ``LOCAL_WORLD_SIZE``
   ================================  ==============================================

Without ``DMLC_WORKER_ID`` the scheduler gives this worker the lowest free rank. Without a
cluster file, the scheduler's address and the TLS files must come from the environment.
``pushpull local --workers N -- COMMAND`` sets all of these for each copy of COMMAND.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, Optional


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


# torchrun's variable for each BytePS one it stands in for.
_TORCHRUN = {
    "DMLC_PS_ROOT_URI": "MASTER_ADDR",
    "DMLC_PS_ROOT_PORT": "MASTER_PORT",
    "BYTEPS_LOCAL_RANK": "LOCAL_RANK",
    "BYTEPS_LOCAL_SIZE": "LOCAL_WORLD_SIZE",
}


def _with_torchrun(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` with BytePS's variables filled in from torchrun's where only those are set;
    raises ``ValueError`` naming both when a pair disagrees. ``WORLD_SIZE`` and ``RANK`` count
    worker processes, so they become ``DMLC_NUM_WORKER`` and ``DMLC_WORKER_ID`` in hosts of
    ``LOCAL_WORLD_SIZE`` (checked to divide them)."""
    out = dict(env)
    for byteps, torchrun in _TORCHRUN.items():
        b, t = env.get(byteps) or None, env.get(torchrun) or None
        if b is not None and t is not None and b != t:
            raise ValueError(f"{byteps}={b!r} and {torchrun}={t!r} disagree: set one of them")
        if b is None and t is not None:
            out[byteps] = t
    world, rank = env.get("WORLD_SIZE") or None, env.get("RANK") or None
    if world is None and rank is None:
        return out
    g = _int(out, "BYTEPS_LOCAL_SIZE", 1) or 1
    if world is not None:
        n = _int(env, "WORLD_SIZE", 1)
        if n % g:
            raise ValueError(f"WORLD_SIZE={n} is not a multiple of LOCAL_WORLD_SIZE={g}")
        hosts = str(n // g)
        if out.get("DMLC_NUM_WORKER") not in (None, "", hosts):
            raise ValueError(
                f"DMLC_NUM_WORKER={out['DMLC_NUM_WORKER']!r} and WORLD_SIZE={n} "
                f"(hosts of {g}) disagree: set one of them"
            )
        out["DMLC_NUM_WORKER"] = hosts
    if rank is not None:
        r = _int(env, "RANK", 0)
        local = _int(out, "BYTEPS_LOCAL_RANK", 0) or 0
        if r % g != local:
            raise ValueError(f"RANK={r} is not on local rank {local} of hosts of {g} (LOCAL_RANK)")
        host = str(r // g)
        if out.get("DMLC_WORKER_ID") not in (None, "", host):
            raise ValueError(
                f"DMLC_WORKER_ID={out['DMLC_WORKER_ID']!r} and RANK={r} (hosts of {g}) "
                "disagree: set one of them"
            )
        out["DMLC_WORKER_ID"] = host
        out["BYTEPS_LOCAL_RANK"] = str(local)
    return out


def join_settings(config: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> JoinSettings:
    """Reads the sources above (``env`` defaults to ``os.environ``); raises ``ValueError``
    naming the variable that is wrong."""
    env = _with_torchrun(os.environ if env is None else env)
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
