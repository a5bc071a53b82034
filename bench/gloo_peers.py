"""Peers for `pushpull bench net --peers PYTHON`: the same exchange without pushpull.

Two jobs on PyTorch's gloo backend, one process per rank, each started by `bench net` in its
host's network namespace (the same shaped network as the pushpull runs of that sitting):

* ``allreduce``: W worker ranks, ``dist.all_reduce`` of one fp32 tensor of ``--bytes``.
* ``ps``: a naive parameter server. W worker ranks and S server ranks. Each worker cuts its
  ``--bytes`` of fp32 into ``--partition`` byte pieces, piece p belongs to server p mod S; it
  sends every piece with ``isend`` and receives the sums with ``irecv``. A server receives
  every worker's copy of its pieces and, piece by piece as soon as all copies of one have
  arrived, sums them and sends the sum back to every worker. No compression, no priorities.

Every round starts after a barrier. Each worker prints one JSON line
``{"rank": r, "seconds": [per timed round]}``; `bench net` takes the slowest worker per round
and the median over rounds.

This file is embedded in the `pushpull` binary (benchmarks/src/net/peers.rs) and written to the run's
temporary folder; it needs only torch.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--job", choices=["allreduce", "ps"], required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--servers", type=int, default=0)
    p.add_argument("--master", required=True, help="tcp://IP:PORT of rank 0")
    p.add_argument("--bytes", type=int, required=True, help="fp32 bytes per worker per round")
    p.add_argument("--partition", type=int, default=4_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    return p.parse_args()


def pieces(n, partition_elems):
    """(start, end) element ranges of the pieces of an n-element tensor."""
    return [(s, min(s + partition_elems, n)) for s in range(0, n, partition_elems)]


def ps_worker(a, data, result):
    ranges = pieces(data.numel(), a.partition // 4)
    reqs = []
    for p, (s, e) in enumerate(ranges):
        server = a.workers + p % a.servers
        reqs.append(dist.isend(data[s:e], dst=server, tag=p))
        reqs.append(dist.irecv(result[s:e], src=server, tag=p))
    for r in reqs:
        r.wait()


def ps_server(a, n):
    sid = a.rank - a.workers
    ranges = pieces(n, a.partition // 4)
    mine = [(p, s, e) for p, (s, e) in enumerate(ranges) if p % a.servers == sid]
    recvs = []
    for p, s, e in mine:
        bufs = [torch.empty(e - s) for _ in range(a.workers)]
        reqs = [dist.irecv(bufs[w], src=w, tag=p) for w in range(a.workers)]
        recvs.append((p, bufs, reqs))
    sends = []
    for p, bufs, reqs in recvs:
        for r in reqs:
            r.wait()
        total = bufs[0]
        for b in bufs[1:]:
            total += b
        sends.extend(dist.isend(total, dst=w, tag=p) for w in range(a.workers))
    for r in sends:
        r.wait()


def main():
    a = parse()
    world = a.workers + (a.servers if a.job == "ps" else 0)
    dist.init_process_group("gloo", init_method=a.master, rank=a.rank, world_size=world)
    n = a.bytes // 4
    is_worker = a.rank < a.workers
    data = torch.rand(n) if is_worker else None
    result = torch.empty(n) if is_worker else None
    times = []
    for i in range(a.warmup + a.rounds):
        dist.barrier()
        t0 = time.perf_counter()
        if a.job == "allreduce":
            dist.all_reduce(data)
        elif is_worker:
            ps_worker(a, data, result)
        else:
            ps_server(a, n)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    dist.barrier()
    if is_worker:
        print(json.dumps({"rank": a.rank, "seconds": times}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
