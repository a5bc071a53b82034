"""When a server's uplink idles during `pushpull bench net`, what is it waiting for?

Two steps, around one benchmark run with a frame trace (``PUSHPULL_FRAME_TRACE``, see
net/src/trace.rs):

    PUSHPULL_FRAME_TRACE=/tmp/trace pushpull bench net --rates 10mbit --compressors none \
        --scale 0.1 --rounds 3 --skip-scaling --baseline-seconds 0 &
    # once the bridge's namespace exists (`ip netns list` shows pp...-br):
    ip netns exec "$(ip netns list | awk '/-br/ {print $1; exit}')" \
        python3 bench/wire_idle.py sample /tmp/ports.log 120
    python3 bench/wire_idle.py analyze /tmp/trace /tmp/ports.log

``sample OUT SECONDS`` reads the byte counters of the bridge's ports (p0 the scheduler, p1..pS
the servers, then the workers: the order `bench net` creates them in) from /proc/net/dev every
few milliseconds. ``analyze TRACE PORTS`` cuts each server's time into 50 ms bins, takes the
bins in which its uplink carried under 30 % of the link rate (``--rate``, default 10 Mbit/s),
and says what the server held then: results in its own send queue (queued, not yet handed to
quinn), results only in transport (handed to quinn, not acknowledged), or nothing ready (it is
waiting for some worker's push of a chunk). Needs only the standard library.
"""

import argparse
import bisect
import collections
import glob
import time


def sample(out: str, seconds: float) -> None:
    end = time.time() + seconds
    with open(out, "w") as f:
        while time.time() < end:
            t = time.time()
            with open("/proc/net/dev") as dev:
                lines = dev.readlines()[2:]
            row = []
            for line in lines:
                name, rest = line.split(":", 1)
                name = name.strip()
                if name.startswith("p"):
                    v = rest.split()
                    row.append(f"{name}:{v[0]}:{v[8]}")
            f.write(f"{t:.4f} {' '.join(row)}\n")
            time.sleep(0.004)


def analyze(trace_dir: str, ports_log: str, rate_bits: float, servers: int) -> None:
    frames = collections.defaultdict(dict)  # (server, key, round, peer) -> {event: t}
    size = {}
    for path in glob.glob(f"{trace_dir}/*.trace"):
        for line in open(path):
            p = line.split()
            if len(p) < 9 or p[3] != "Result" or not p[1].startswith("server"):
                continue
            k = (p[1], p[4], p[5], p[8])
            frames[k][p[2]] = int(p[0]) / 1e6
            size[k] = int(p[7])
    samples = []
    for line in open(ports_log):
        p = line.split()
        if len(p) < 2:
            continue
        counters = {}
        for x in p[1:]:
            name, rx, tx = x.split(":")
            counters[name] = (int(rx), int(tx))
        samples.append((float(p[0]), counters))
    times = [s[0] for s in samples]

    def at(t):
        i = min(max(bisect.bisect_left(times, t), 0), len(times) - 1)
        return samples[i]

    link = rate_bits / 8
    step = 0.05
    for s in range(servers):
        node, port = f"server{s}", f"p{s + 1}"
        ev = [
            (v["queued"], v["written"], v["acked"], size[k])
            for k, v in frames.items()
            if k[0] == node and {"queued", "written", "acked"} <= v.keys()
        ]
        if not ev:
            print(f"{node}: no traced results")
            continue
        t, t_end = min(e[0] for e in ev), max(e[2] for e in ev)
        count = collections.Counter()
        while t + step <= t_end:
            a, b = at(t), at(t + step)
            if b[0] > a[0] and port in a[1] and port in b[1]:
                count["bins"] += 1
                # The bridge receives on port pN what the server sends: its uplink.
                up = (b[1][port][0] - a[1][port][0]) / (b[0] - a[0]) / link
                if up < 0.3:
                    mid = t + step / 2
                    count["idle"] += 1
                    if any(q <= mid < w for q, w, _, _ in ev):
                        count["held in its send queue"] += 1
                    elif any(w <= mid < k for _, w, k, _ in ev):
                        count["only in transport"] += 1
                    else:
                        count["nothing ready"] += 1
            t += step
        idle = max(count["idle"], 1)
        parts = ", ".join(
            f"{what} {100 * count[what] / idle:.0f} %"
            for what in ("held in its send queue", "only in transport", "nothing ready")
        )
        print(f"{node}: uplink idle in {count['idle']} of {count['bins']} bins of 50 ms; {parts}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="sample the bridge's port counters (run in its namespace)")
    s.add_argument("out")
    s.add_argument("seconds", type=float)
    a = sub.add_parser("analyze", help="what each server held while its uplink idled")
    a.add_argument("trace_dir")
    a.add_argument("ports_log")
    a.add_argument("--rate", type=float, default=10e6, help="link rate, bit/s")
    a.add_argument("--servers", type=int, default=4)
    args = ap.parse_args()
    if args.cmd == "sample":
        sample(args.out, args.seconds)
    else:
        analyze(args.trace_dir, args.ports_log, args.rate, args.servers)


if __name__ == "__main__":
    main()
