"""TieredCache across hosts (COHERENCE="cluster"): checked reads, latency, transports.

    python bench/cluster_stress.py check --seconds 40 --hosts 3 --procs 2
    python bench/cluster_stress.py latency --hosts 2 --procs 4 --ops 20000
    python bench/cluster_stress.py cost --calls 3000
    python bench/cluster_stress.py transports --events 5000
    python bench/cluster_stress.py wakeup --calls 3000

``check``: simulated hosts (each its own generation-table directory, its own
subscriber, ``--procs`` processes with warm L1s) share one redis-server on
loopback; writers and readers on every host. Reports the reads checked, the
reads that started more than ``--bound`` after an acknowledged write and
returned an older value (must be 0; exit 1 otherwise, or when fewer than
``--min-reads`` were checked), the late reads within the bound, the share of
reads served from L1, the propagation delay (writer's stamp to remote apply,
from the hosts' histograms) and the publication lag. How a read is checked:
tests/cluster/workers.py.

``latency``: the reference mix (90% get, 9% set, 1% delete; 1,100 keys, values
1-495 bytes) on ``--hosts`` x ``--procs`` processes, timed per call with
``perf_counter_ns``, against TieredCache(cluster) over django-redis and against
django-redis alone, and TieredCache(host) on one host, on the same redis-server:
get and set p50 and the ratios,
L1 share, propagation delay p50/p99. (The harness runs one CACHES for every
worker, so "2 hosts" is measured here.)

``cost``: one process, calls one after another, in ``--rounds`` interleaved
rounds: set through django-redis, TieredCache (host) and TieredCache (cluster,
which publishes before it returns), and gets; p50 wall time, its ratio to
django-redis's, and CPU time per call. The host's subscriber runs in a second
process unless ``--subscriber-here``.

``wakeup``: redis-py ``SET`` against ``SET`` and ``PUBLISH`` in one send: with no
subscriber, with one subscribed process that redis wakes on every message, and
on a host's own channel while its subscriber holds the other-host patterns.

``fanout``: the server's cost of a ``PUBLISH`` as hosts are added, one channel
for all against a channel per host with the other-host patterns.

``transports``: the two ways redis can carry invalidations, measured on one
server: pub/sub (``PUBLISH`` to a subscribed connection) and RESP3 client
tracking in broadcast mode (``SET`` to an invalidation push); the delay from
the writer's send to arrival, and what each adds to a write.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from djcachebench.bench.servers import RedisServer
from djcachebench.bench.stats import percentile
from djcachebench.coherence.cluster.hostfile import (
    BUCKETS,
    delay_percentile,
    open_host_file,
)


def _delays(host_dirs: list[str]) -> dict[str, float | None]:
    counts = [0] * BUCKETS
    for d in host_dirs:
        for i, n in enumerate(open_host_file(os.path.join(d, "generations.mmap")).delay_counts()):
            counts[i] += n
    return {"n": sum(counts), "p50_ms": delay_percentile(counts, 0.5),
            "p99_ms": delay_percentile(counts, 0.99)}


# --- check --------------------------------------------------------------------------


def check(args: argparse.Namespace) -> int:
    from tests.cluster.workers import run_hosts

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        results, run = run_hosts(tmp, [server.location] * args.hosts, procs=args.procs,
                                 nkeys=args.keys, duration=args.seconds, bound=args.bound,
                                 strict_lease=args.strict_lease)
    # (the host files are read before the directory goes: below uses the results)
        delays = _delays(run.host_dirs)
        hosts = [run.host_stats(h) for h in range(args.hosts)]
    reads = sum(r["reads"] for r in results)
    violations = [v for r in results for v in r["violations"]]
    l1 = sum(r["stats"]["l1_hits"] for r in results)
    late = sum(r["late"] for r in results)
    lag_max = max(r["cluster"]["publish_lag_ms_max"] for r in results)
    lag_mean = sum(r["cluster"]["publish_lag_ms_mean"] for r in results) / len(results)
    print(f"hosts {args.hosts} x {args.procs} processes, {args.seconds:g} s, bound "
          f"{args.bound:g} s")
    print(f"reads checked {reads}, writes {sum(r['writes'] for r in results)}, "
          f"served from L1 {l1 / max(reads, 1):.1%}")
    print(f"stale beyond the bound: {len(violations)}; older than the newest ack but within "
          f"the bound: {late}")
    print(f"propagation delay (stamp -> remote apply): p50 <= {delays['p50_ms']} ms, "
          f"p99 <= {delays['p99_ms']} ms over {delays['n']} messages")
    print(f"publication lag (stamp -> PUBLISH answered): mean {lag_mean:.2f} ms, "
          f"max {lag_max:.1f} ms")
    print("degraded seconds per host: "
          + ", ".join(f"{h['degraded_seconds']:.3f}" for h in hosts)
          + "; gaps: " + ", ".join(str(h["gaps"]) for h in hosts))
    if args.strict_lease is not None:
        strict = sum(r["cluster"]["strict_writes"] for r in results)
        wait = sum(r["cluster"]["strict_wait_ms_mean"] * r["cluster"]["strict_writes"]
                   for r in results) / max(strict, 1)
        print(f"strict writes (lease {args.strict_lease:g} s): {strict}, unconfirmed "
              f"{sum(r['cluster']['strict_unconfirmed'] for r in results)}; publish to "
              f"the last host's ack: mean {wait:.2f} ms")
    for v in violations[:10]:
        print("  ", v)
    return 1 if violations or reads < args.min_reads else 0


# --- latency ------------------------------------------------------------------------


def _l2(location: str) -> dict[str, Any]:
    return {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"}}


def timed(caches_setting: dict[str, Any], seed: int, ops: int, barrier: Any, out: Any) -> None:
    """One process of the latency run: the reference mix, each call timed."""
    import django
    from django.conf import settings

    from tests.cluster.workers import SECRET_KEY

    settings.configure(SECRET_KEY=SECRET_KEY, CACHES=caches_setting, USE_TZ=True)
    django.setup()
    from django.core.cache import caches

    cache = caches["default"]
    if "cluster_host_fresh" in getattr(cache, "stats", dict)():
        while not cache.stats()["cluster_host_fresh"]:  # the subscriber is caught up
            time.sleep(0.01)
    rng = random.Random(seed)
    keys = [f"k{i}".encode() for i in range(1100)]
    values = [os.urandom(rng.randint(1, 495)) for _ in range(64)]
    for _ in range(ops // 5):  # warm-up, not counted
        cache.get(rng.choice(keys))
    gets: list[int] = []
    sets: list[int] = []
    clock = time.perf_counter_ns
    barrier.wait(120)
    for _ in range(ops):
        key = rng.choice(keys)
        roll = rng.random()
        if roll < 0.90:
            t = clock()
            cache.get(key)
            gets.append(clock() - t)
        elif roll < 0.99:
            value = rng.choice(values)
            t = clock()
            cache.set(key, value)
            sets.append(clock() - t)
        else:
            cache.delete(key)
    stats = cache.stats() if hasattr(cache, "stats") else {}
    out.put({"gets": gets, "sets": sets, "l1_hits": stats.get("l1_hits", 0),
             "unserved": stats.get("unserved", 0)})


def _run_timed(settings: list[dict[str, Any]], procs: int, ops: int) -> list[dict[str, Any]]:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    n = len(settings) * procs
    barrier, out = ctx.Barrier(n), ctx.Queue()
    children = [ctx.Process(target=timed, daemon=True,
                            args=(settings[w % len(settings)], w, ops, barrier, out))
                for w in range(n)]
    for p in children:
        p.start()
    try:
        return [out.get(timeout=600) for _ in range(n)]
    finally:
        for p in children:
            p.join(10)


def latency(args: argparse.Namespace) -> int:
    from tests.cluster.workers import SECRET_KEY

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        import django
        from django.conf import settings

        settings.configure(SECRET_KEY=SECRET_KEY, USE_TZ=True,
                           CACHES={"default": _l2(server.location)})
        django.setup()
        from django.core.cache import caches

        rng = random.Random(0)
        caches["default"].set_many({f"k{i}".encode(): os.urandom(rng.randint(1, 495))
                                    for i in range(1100)}, timeout=None)  # pre-fill
        plain = _run_timed([{"default": _l2(server.location)}], args.hosts * args.procs,
                           args.ops)
        one_host = _run_timed([{"default": {
            "BACKEND": "djcachebench.backends.tiered.TieredCache",
            "OPTIONS": {"L2": _l2(server.location),
                        "GENERATION_PATH": os.path.join(tmp, "one", "generations.mmap")}}}],
            args.hosts * args.procs, args.ops)
        dirs = [os.path.join(tmp, f"host{h}") for h in range(args.hosts)]
        tiered = _run_timed([{"default": {
            "BACKEND": "djcachebench.backends.tiered.TieredCache",
            "OPTIONS": {"L2": _l2(server.location), "COHERENCE": "cluster",
                        "GENERATION_PATH": os.path.join(d, "generations.mmap")}}}
            for d in dirs], args.procs, args.ops)
        delays = _delays(dirs)

    def p50(results: list[dict[str, Any]], kind: str) -> int:
        return percentile(sorted(x for r in results for x in r[kind]), 50)

    reads = sum(len(r["gets"]) for r in tiered)
    print(f"{args.hosts} hosts x {args.procs} processes, {args.ops} ops each (90% get, "
          f"9% set, 1% delete; 1,100 keys; values 1-495 bytes)")
    for kind in ("gets", "sets"):
        ours, theirs, host = p50(tiered, kind), p50(plain, kind), p50(one_host, kind)
        print(f"{kind[:-1]} p50: tiered-redis-cluster {ours / 1000:.1f} us, redis "
              f"{theirs / 1000:.1f} us, ratio {ours / theirs:.3f} (tiered-redis on one "
              f"host: {host / 1000:.1f} us, {host / theirs:.3f})")
    print(f"served from L1: {sum(r['l1_hits'] for r in tiered) / reads:.1%} of gets; "
          f"unserved (host degraded): {sum(r['unserved'] for r in tiered)}")
    print(f"propagation delay: p50 <= {delays['p50_ms']} ms, p99 <= {delays['p99_ms']} ms "
          f"over {delays['n']} messages")
    return 0


# --- cost ---------------------------------------------------------------------------


def _subscriber_process(caches_setting: dict[str, Any], alias: str, ready: Any,
                        leave: Any) -> None:
    """Another process of the host that holds the subscriber election (spawned)."""
    import django
    from django.conf import settings

    from tests.cluster.workers import SECRET_KEY

    settings.configure(SECRET_KEY=SECRET_KEY, USE_TZ=True, CACHES=caches_setting)
    django.setup()
    from django.core.cache import caches

    cache = caches[alias]
    while not cache.stats()["cluster_subscriber_here"]:
        time.sleep(0.01)
    ready.set()
    leave.wait(3600)


def cost(args: argparse.Namespace) -> int:
    """One process, one host, calls one after another: what the cluster link adds.

    The host's subscriber runs in another process (as for all but one process of
    a host), unless ``--subscriber-here``: then this process also applies every
    message and answers the heartbeat, under the same GIL as its writes.
    """
    import multiprocessing

    from tests.cluster.workers import SECRET_KEY

    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        import django
        from django.conf import settings

        def tiered(name: str, **options: Any) -> dict[str, Any]:
            return {"BACKEND": "djcachebench.backends.tiered.TieredCache",
                    "OPTIONS": {"L2": _l2(server.location), **options,
                                "GENERATION_PATH": os.path.join(tmp, name, "g.mmap")}}

        setting = {"default": _l2(server.location), "host": tiered("host"),
                   "cluster": tiered("cluster", COHERENCE="cluster")}
        leave = None
        if not args.subscriber_here:
            spawn = multiprocessing.get_context("spawn")
            ready, leave = spawn.Event(), spawn.Event()
            other = spawn.Process(target=_subscriber_process,
                                  args=(setting, "cluster", ready, leave), daemon=True)
            other.start()
            if not ready.wait(60):
                raise SystemExit("the subscriber process did not start")
        settings.configure(SECRET_KEY=SECRET_KEY, USE_TZ=True, CACHES=setting)
        django.setup()
        from django.core.cache import caches

        redis, host, cluster = caches["default"], caches["host"], caches["cluster"]
        while not cluster.stats()["cluster_host_fresh"]:
            time.sleep(0.01)
        value = os.urandom(200)
        calls = [("redis set", lambda k: redis.set(k, value)),
                 ("tiered-redis (host) set", lambda k: host.set(k, value)),
                 ("tiered-redis-cluster set", lambda k: cluster.set(k, value)),
                 ("redis get", redis.get),
                 ("tiered-redis-cluster get", cluster.get)]
        wall: dict[str, list[int]] = {name: [] for name, _ in calls}
        cpu: dict[str, float] = {name: 0.0 for name, _ in calls}
        per_round = max(1, args.calls // args.rounds)
        for _ in range(args.rounds):  # ABAB: the load moves, every call sees it
            for name, call in calls:
                xs = wall[name]
                c0 = time.process_time()
                for i in range(per_round):
                    key = f"k{i % 500}"
                    t = time.perf_counter_ns()
                    call(key)
                    xs.append(time.perf_counter_ns() - t)
                cpu[name] += time.process_time() - c0
        base = {"set": percentile(sorted(wall["redis set"]), 50),
                "get": percentile(sorted(wall["redis get"]), 50)}
        for name, _ in calls:
            xs = sorted(wall[name])
            p50 = percentile(xs, 50)
            kind = name.rsplit(" ", 1)[1]
            print(f"{name:26s} p50 {p50 / 1000:7.1f} us ({p50 / base[kind]:.2f}x redis)   "
                  f"p90 {percentile(xs, 90) / 1000:7.1f} us   "
                  f"cpu {cpu[name] / len(xs) * 1e6:6.1f} us/call")
        st = cluster.stats()
        l2_reads = st["l2_hits"] + st["l2_misses"]
        print(f"subscriber in this process: {st['cluster_subscriber_here']}; cluster cache: "
              f"l1_hits {st['l1_hits']}, l2 reads {l2_reads}, unserved {st['unserved']}")
        print(f"publication lag: mean {st['cluster_publish_lag_ms_mean']:.2f} ms, "
              f"max {st['cluster_publish_lag_ms_max']:.1f} ms")
        if leave is not None:
            leave.set()
    return 0


def _idle_subscriber(url: str, channel: str, patterns: list[str] | None = None) -> None:
    """A subscribed connection that reads and drops every message (spawned):
    ``SUBSCRIBE channel``, or ``PSUBSCRIBE`` of ``patterns`` when given."""
    from djcachebench.coherence.cluster.resp import RespConnection, parse_url

    conn = RespConnection(parse_url(url), 3600.0)
    if patterns:
        conn.send("PSUBSCRIBE", *patterns)
    else:
        conn.call("SUBSCRIBE", channel)
    while True:
        conn.reply()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wakeup(args: argparse.Namespace) -> int:
    """What a PUBLISH in the write's own send costs, and what waking a subscriber
    adds: redis-py ``SET`` against ``SET`` + ``PUBLISH`` packed in one send
    (``tiered/inline.py``) on a channel nobody hears; on a channel one subscribed
    process hears (every host's subscriber, before each host had a channel of its
    own); and on this host's own channel while a process holds the other-host
    patterns of ``coherence/cluster/channels.py`` (the host's subscriber now, not
    woken). All four interleaved in every round, p50 per round."""
    import multiprocessing

    import redis as redis_py

    from djcachebench.coherence.cluster.channels import host_channel, other_hosts_patterns
    from djcachebench.tiered.l2.redis import send_both as _send_both

    own_host = 0x3A5F00C0FFEE1234
    with RedisServer() as server:
        client = redis_py.Redis.from_url(server.location)
        value = os.urandom(200)
        message = b'[1,2,3,4,["k"]]'
        spawn = multiprocessing.get_context("spawn")
        woken = spawn.Process(target=_idle_subscriber, args=(server.location, "wake"),
                              daemon=True)
        patterned = spawn.Process(
            target=_idle_subscriber,
            args=(server.location, "", other_hosts_patterns("bench", own_host)), daemon=True)
        woken.start()
        patterned.start()
        time.sleep(1.0)
        own_channel = host_channel("bench", own_host)
        if client.publish(own_channel, b"probe") != 0 or client.publish("wake", b"probe") != 1:
            raise SystemExit("the subscribers are not in place")

        def p50(call: Any) -> float:
            xs = []
            for i in range(args.calls):
                t = time.perf_counter_ns()
                call(f"k{i % 500}")
                xs.append(time.perf_counter_ns() - t)
            return percentile(sorted(xs), 50) / 1000

        cases = {
            "SET alone": lambda k: client.set(k, value),
            "SET+PUBLISH, nobody subscribed": lambda k: _send_both(
                client, ("SET", k, value), "quiet", message),
            "SET+PUBLISH, a subscriber woken": lambda k: _send_both(
                client, ("SET", k, value), "wake", message),
            "SET+PUBLISH, own channel (patterns)": lambda k: _send_both(
                client, ("SET", k, value), own_channel, message),
        }
        cpu_before = {p.pid: _cpu_seconds(p.pid) for p in (woken, patterned)}
        rounds = [{name: p50(call) for name, call in cases.items()} for _ in range(args.rounds)]
        for name in cases:
            ratios = [r[name] / r["SET alone"] for r in rounds]
            print(f"{name:36s} p50 " + " ".join(f"{r[name]:6.1f}" for r in rounds)
                  + " us;  / SET alone " + " ".join(f"{x:.2f}" for x in ratios))
        # What each subscriber process burned meanwhile: the CPU a host pays for
        # its own writes (the woken one heard args.calls * rounds messages).
        messages = args.calls * args.rounds
        for label, proc in (("woken subscriber", woken), ("patterned subscriber", patterned)):
            spent = _cpu_seconds(proc.pid) - cpu_before[proc.pid]
            print(f"{label:22s} CPU {spent:.3f} s, {spent / messages * 1e6:.1f} us per "
                  f"message published to it")
        woken.kill()
        patterned.kill()
    return 0


# --- transports ---------------------------------------------------------------------


def transports(args: argparse.Namespace) -> int:
    from djcachebench.coherence.cluster.resp import RespConnection, parse_url

    with RedisServer() as server:
        address = parse_url(server.location)
        writer = RespConnection(address, 5.0)
        sub = RespConnection(address, 5.0)
        sub.call("SUBSCRIBE", "probe")
        trk = RespConnection(address, 5.0)
        trk.call("HELLO", "3")
        trk.call("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", "probe:")
        clock = time.perf_counter_ns
        pubsub, tracking, set_alone, set_and_publish = [], [], [], []
        for i in range(args.events):
            key = f"probe:{i % 1000}"
            t = clock()
            writer.send("SET", key, "x")
            trk.reply()  # the invalidation push
            tracking.append(clock() - t)
            writer.reply()
            t = clock()
            writer.call("SET", key, "y")
            set_alone.append(clock() - t)
            trk.reply()
            t = clock()
            writer.send("PUBLISH", "probe", key)
            sub.reply()
            pubsub.append(clock() - t)
            writer.reply()
            t = clock()
            writer.sock.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nx\r\n"
                                % (len(key), key.encode())
                                + b"*3\r\n$7\r\nPUBLISH\r\n$5\r\nprobe\r\n$%d\r\n%s\r\n"
                                % (len(key), key.encode()))
            writer.reply()
            writer.reply()
            set_and_publish.append(clock() - t)
            sub.reply()
            trk.reply()
        for conn in (writer, sub, trk):
            conn.close()

    def show(name: str, xs: list[int]) -> None:
        xs.sort()
        print(f"{name:44s} p50 {percentile(xs, 50) / 1000:7.1f} us   "
              f"p99 {percentile(xs, 99) / 1000:7.1f} us")

    print(f"{args.events} events, one redis-server on loopback")
    show("pub/sub: PUBLISH sent -> message received", pubsub)
    show("tracking (BCAST): SET sent -> push received", tracking)
    show("SET alone (round trip)", set_alone)
    show("SET + PUBLISH pipelined (one round trip)", set_and_publish)
    return 0


def _drain(conns: list[Any], stop: Any) -> None:
    """Read and drop whatever the server sends these connections (a thread)."""
    import selectors

    sel = selectors.DefaultSelector()
    for conn in conns:
        conn.sock.setblocking(False)
        sel.register(conn.sock, selectors.EVENT_READ)
    while not stop.is_set():
        for key, _ in sel.select(0.05):
            try:
                if not key.fileobj.recv(1 << 16):  # type: ignore[union-attr]
                    sel.unregister(key.fileobj)
            except BlockingIOError:
                pass
    sel.close()


def fanout(args: argparse.Namespace) -> int:
    """What the server spends on a PUBLISH as hosts are added: every host
    subscribed to one channel (the scheme before ``1c0a96d``) against each host
    holding its 16 other-host patterns (``coherence/cluster/channels.py``), the
    message published on one host's channel. Both deliver to every other host;
    the patterns add 16 matches per host. Redis's own ``usec_per_call`` of
    PUBLISH (``INFO commandstats``) and the publisher's round trip p50."""
    import threading

    from djcachebench.coherence.cluster.channels import host_channel, other_hosts_patterns
    from djcachebench.coherence.cluster.resp import RespConnection, parse_url

    message = b'[1,2,3,4,[":1:some-cache-key-0123456789"]]'
    rng = random.Random(7)
    with RedisServer() as server:
        address = parse_url(server.location)
        publisher = RespConnection(address, 5.0)
        for hosts in args.hosts:
            for scheme in ("one channel", "per-host channels"):
                ids = [rng.getrandbits(64) for _ in range(hosts)]
                subs = []
                for host_id in ids:
                    conn = RespConnection(address, 5.0)
                    if scheme == "one channel":
                        conn.call("SUBSCRIBE", "bench")
                    else:
                        patterns = other_hosts_patterns("bench", host_id)
                        conn.send("PSUBSCRIBE", *patterns)
                        for _ in patterns:
                            conn.reply()
                    subs.append(conn)
                stop = threading.Event()
                drainer = threading.Thread(target=_drain, args=(subs, stop), daemon=True)
                drainer.start()
                channel = "bench" if scheme == "one channel" else host_channel("bench", ids[0])
                publisher.call("CONFIG", "RESETSTAT")
                times = []
                for _ in range(args.calls):
                    t = time.perf_counter_ns()
                    publisher.call("PUBLISH", channel, message)
                    times.append(time.perf_counter_ns() - t)
                stats = publisher.call("INFO", "commandstats").decode()
                usec = next(float(part.split("=")[1]) for line in stats.splitlines()
                            if line.startswith("cmdstat_publish:")
                            for part in line.split(":", 1)[1].split(",")
                            if part.startswith("usec_per_call="))
                receivers = publisher.call("PUBLISH", channel, message)
                print(f"{hosts:4d} hosts, {scheme:18s} PUBLISH reaches {receivers:4d}: server "
                      f"{usec:7.2f} us per call, round trip p50 "
                      f"{percentile(sorted(times), 50) / 1000:7.1f} us")
                stop.set()
                drainer.join(2)
                for conn in subs:
                    conn.close()
        publisher.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("--seconds", type=float, default=40.0)
    c.add_argument("--hosts", type=int, default=3)
    c.add_argument("--procs", type=int, default=2)
    c.add_argument("--keys", type=int, default=48)
    c.add_argument("--bound", type=float, default=0.3)
    c.add_argument("--min-reads", type=int, default=100_000)
    c.add_argument("--strict-lease", type=float, default=None,
                   help="every host writes strictly (STRICT_LEASE); check with --bound 0")
    lat = sub.add_parser("latency")
    lat.add_argument("--hosts", type=int, default=2)
    lat.add_argument("--procs", type=int, default=4)
    lat.add_argument("--ops", type=int, default=20_000)
    co = sub.add_parser("cost")
    co.add_argument("--rounds", type=int, default=5)
    co.add_argument("--subscriber-here", action="store_true",
                    help="this process is also the host's subscriber")
    co.add_argument("--calls", type=int, default=3000)
    w = sub.add_parser("wakeup")
    w.add_argument("--calls", type=int, default=3000)
    w.add_argument("--rounds", type=int, default=4)
    t = sub.add_parser("transports")
    t.add_argument("--events", type=int, default=5000)
    fo = sub.add_parser("fanout")
    fo.add_argument("--hosts", type=lambda v: [int(x) for x in v.split(",")],
                    default=[2, 10, 50, 200])
    fo.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args(argv)
    commands = {"check": check, "latency": latency, "cost": cost, "transports": transports,
                "wakeup": wakeup, "fanout": fanout}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
