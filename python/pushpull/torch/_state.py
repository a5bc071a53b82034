"""The worker of :mod:`pushpull.torch` and its module-level state (the one place it lives:
other modules read and change it as ``_state.NAME``, never through a copy), joining and
leaving the job (:func:`init`, :func:`shutdown`), the job's sizes, and :func:`suspend` /
:func:`resume`.

The package's other modules import this one, and this one imports none of them: the record of
a declared tensor (:class:`_Decl`) is defined here, next to its table ``declared``, and the
rounds held here (``handles``, ``live``: ``_round._Round`` objects) are held without naming
their class, as ``deferred`` holds its optimizers."""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Tuple

from .. import _native
from .._env import JoinSettings, join_settings
from .._native import PushPullError

if TYPE_CHECKING:
    import torch


class _Decl(NamedTuple):
    """A tensor declared on this worker (the values of ``declared``, written by
    ``_declare.declare``): its length in float32 elements (twice the elements of an integer
    tensor), priority, parameter map and each chunk's codec."""

    numel: int
    priority: int
    params: Dict[str, str]
    codecs: List[str]


# The worker while joined (None before init() and after shutdown()), and its settings.
worker: Optional[_native.Worker] = None
# shutdown() (or the exit's) has ended this process's part of the job.
left = False
settings: Optional[JoinSettings] = None
# Rounds started and not yet synchronized, by handle (each a _round._Round).
handles: Dict[int, Any] = {}
next_handle = itertools.count(1)
noname = itertools.count()

# The tensors declared on this worker, by name.
declared: Dict[str, _Decl] = {}
# Which parameter each DistributedOptimizer gradient name stands for (a weak reference), so
# that a second model whose parameters have the same names gets names of its own
# (optimizer._gradient_name).
gradient_params: Dict[str, "weakref.ref"] = {}
# Names declared with BytePS's declare(name, **kwargs), before their first round: the
# parameter map and priority they will be declared with.
pending: Dict[str, Tuple[Dict[str, str], Optional[int]]] = {}
# Every round started and not yet dropped (each a _round._Round; suspend() waits on its
# native handle, ``.native``), and whether rounds are suspended.
live: "weakref.WeakSet" = weakref.WeakSet()
suspended = False
# Whatever holds rounds whose outcomes are collected later (a DistributedOptimizer with
# ordered_step): each has _collect(), which raises the first error; collect_deferred() calls it.
deferred: "weakref.WeakSet" = weakref.WeakSet()


def collect_deferred() -> None:
    """Collects the outcomes of rounds left for later (``ordered_step``), every holder's,
    then raises the first error; before a checkpoint, a suspend, another CUDA round, or
    leaving the job."""
    raise_first([holder._collect for holder in list(deferred)])


def raise_first(calls) -> None:
    """Makes every call of ``calls``, then raises the first ``PushPullError`` one raised."""
    first = None
    for call in calls:
        try:
            call()
        except PushPullError as e:
            first = first or e
    if first is not None:
        raise first

# PUSHPULL_TORCH_ROUTE: where CPU float32 tensors are reduced ("host", or "emulated": the
# device path on the emulated device). Read at init().
ROUTES = ("host", "emulated")
route = "host"
# The worker's CUDA streams, as torch streams, by device name ("cuda:N").
streams: Dict[str, "torch.cuda.ExternalStream"] = {}


# --- joining and leaving -----------------------------------------------------------------


def init(config: Optional[str] = None, lazy: bool = True) -> None:
    """Joins the job: reads the cluster file ``config`` (default: ``PUSHPULL_CONFIG``) and the
    BytePS environment (see ``pushpull._env``), connects to the scheduler and waits until every
    node has registered. Calling it again does nothing; calling it after :func:`shutdown`
    raises ``PushPullError`` at once (a process joins one job: the job ends at shutdown).

    ``lazy`` is BytePS's (``bps.init(lazy=False)``, as BytePS's own tests call it): pushpull
    joins the job in ``init`` either way, which is what ``lazy=False`` asks; with
    ``lazy=True`` (BytePS's default) BytePS defers setting up its communication, which
    changes no result, only when the wait happens.

    If the script ends without :func:`shutdown`, it runs at exit, unless the script ends with
    an uncaught exception: then the worker leaves at once, telling the other nodes the
    exception, so that they fail naming it (and why) instead of waiting for rounds it will
    never push."""
    global worker, settings, route
    if worker is not None:
        return
    if left:
        raise PushPullError(
            "init() after shutdown(): the job ended for this process at shutdown (every worker "
            "finishes together and the scheduler then shuts the job down); pushpull joins one "
            "job per process: start a new process (and job) to join again"
        )
    new_route = os.environ.get("PUSHPULL_TORCH_ROUTE", "host")
    if new_route not in ROUTES:
        raise ValueError(f"PUSHPULL_TORCH_ROUTE = {new_route!r}: expected one of {ROUTES}")
    route = new_route
    new_settings = join_settings(config)
    worker = _native.Worker(**new_settings.worker_kwargs())
    settings = new_settings
    sys.excepthook = _noting_uncaught(sys.excepthook)
    atexit.register(_shutdown_at_exit)


def _noting_uncaught(previous_hook):
    """An excepthook that runs ``previous_hook`` (the traceback first, whatever happens next)
    and then notes the exception in ``uncaught``, for :func:`_shutdown_at_exit`."""

    def note_uncaught(kind, value, tb):
        global uncaught
        try:
            previous_hook(kind, value, tb)
        finally:
            try:
                text = str(value)
            except BaseException:  # an exception whose __str__ raises still ends the job
                text = "(its message could not be printed)"
            uncaught = f"the script raised {kind.__name__}: {text}"

    return note_uncaught


def shutdown() -> None:
    """Leaves the job cleanly: waits for rounds in flight, tells the scheduler, and waits until
    every worker has finished (the job ends together). Raises the error of a round that an
    ordered step (``DistributedOptimizer(ordered_step=True)``) left for later."""
    w = worker
    if w is None:
        return
    try:
        collect_deferred()  # a round's error left for later is raised here
    finally:
        deferred.clear()
        _leave(w)


def _leave(w: _native.Worker) -> None:
    global worker, suspended, left
    worker = None
    left = True
    suspended = False
    handles.clear()
    declared.clear()
    gradient_params.clear()
    pending.clear()
    streams.clear()
    w.finish()


# Why the script died, when an exception reached the top (`init` notes it).
uncaught: str | None = None


def _shutdown_at_exit() -> None:
    global worker
    if worker is not None and uncaught:
        # The other workers fail at once, told why, instead of waiting for rounds this one
        # will never push.
        w, worker = worker, None
        w.abort(uncaught[:1000])
        return
    if worker is not None:
        try:
            collect_deferred()
        except PushPullError as e:
            # The script never saw it: the last ordered step's rounds failed after step().
            print(f"pushpull: the rounds of the last ordered step failed: {e}", file=sys.stderr)
        try:
            shutdown()
        except PushPullError:
            pass  # the job already failed; the script's own error says why


def _w() -> _native.Worker:
    if worker is None:
        raise PushPullError("pushpull.torch.init() has not been called (or shutdown() has)")
    return worker


def is_initialized() -> bool:
    """Whether :func:`init` has joined the job (and :func:`shutdown` has not left it):
    Horovod's ``is_initialized``."""
    return worker is not None


def rank() -> int:
    """This worker's rank, ``0 .. size() - 1``."""
    return _w().rank


def size() -> int:
    """The number of workers of the job."""
    return _w().num_workers


def local_rank() -> int:
    """This worker's index on its host (``BYTEPS_LOCAL_RANK``, default 0)."""
    _w()
    return settings.local_rank if settings else 0


def local_size() -> int:
    """The number of workers on this host (``BYTEPS_LOCAL_SIZE``, default 1)."""
    _w()
    return settings.local_size if settings else 1


def cross_rank() -> int:
    """Horovod's ``cross_rank``: this worker's host among the job's hosts,
    ``rank() // local_size()`` (workers are numbered host by host)."""
    return rank() // local_size()


def cross_size() -> int:
    """Horovod's ``cross_size``: the number of hosts, ``size() // local_size()``."""
    return size() // local_size()


def metrics() -> dict:
    """This worker's counters: raw and payload bytes pushed and pulled, rounds, seconds spent
    compressing, waiting and decompressing, in total and per tensor (with each tensor's codecs
    and where it was compressed, ``device``: ``cpu``, ``cuda:N`` or ``emulated``); the GPU and
    page-locked memory the worker holds for device tensors (``device_bytes``) and the driver
    calls it made (``driver_calls``)."""
    return _w().metrics()


# --- suspend and resume --------------------------------------------------------------------


def _check_running(what: str) -> None:
    if suspended:
        raise PushPullError(
            f"{what}: pushpull.torch is suspended (suspend()); call resume(...) first"
        )


def suspend() -> None:
    """BytePS's ``suspend()``, without elastic training: waits for every round in flight (their
    handles stay valid: :func:`synchronize` still returns, or raises, their outcome), then
    refuses new rounds and declarations (:class:`PushPullError` naming the call) until
    :func:`resume`. The worker stays in the job (pushpull has no elastic mode: the job's
    workers and servers are fixed at :func:`init`); other workers' rounds wait for this one
    meanwhile. Raises (and does not suspend) with the error of a round that an ordered step
    left for later."""
    global suspended
    _w()
    collect_deferred()
    for r in list(live):
        if r.native is not None:
            try:
                r.native.wait()
            except PushPullError:
                pass  # raised again by the round's synchronize
    suspended = True


def resume(num_workers: int, num_servers: int, global_rank: Optional[int] = None, context=None) -> None:
    """BytePS's ``resume(num_workers, num_servers, global_rank=None, context=None)`` after
    :func:`suspend`: with the job's own sizes, rounds may start again. ``num_workers`` counts
    worker hosts, as BytePS's (``DMLC_NUM_WORKER``: ``size() // local_size()`` here),
    ``num_servers`` the servers, ``global_rank`` (if given) must be :func:`rank`. Different
    values raise ``ValueError`` naming what differs: elastic resizing is not supported (the
    job's nodes are fixed at :func:`init`). ``context`` is accepted and unused. Calling it
    without :func:`suspend` does nothing beyond the checks."""
    global suspended
    w = _w()
    hosts = w.num_workers // local_size()
    wrong = []
    if num_workers != hosts:
        wrong.append(f"num_workers = {num_workers!r} (this job's worker hosts: {hosts}, "
                     f"{local_size()} workers each, size() = {w.num_workers})")
    if num_servers != w.num_servers:
        wrong.append(f"num_servers = {num_servers!r} (this job: {w.num_servers})")
    if global_rank is not None and global_rank != w.rank:
        wrong.append(f"global_rank = {global_rank!r} (this worker: rank {w.rank})")
    if wrong:
        raise ValueError(
            "resume: " + "; ".join(wrong) + ": elastic resizing is not supported (the job's "
            "workers, servers and ranks are fixed at init())"
        )
    suspended = False
