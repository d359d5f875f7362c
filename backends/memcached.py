"""memcached: Django's PyLibMCCache against a memcached started by the harness.

The server is sized to hold every scenario's data set (1 GiB, see
:class:`djcachebench.bench.servers.MemcachedServer` for why not 64 MiB), as a
production memcached is; items over its 1 MB item size are refused, as they
are by a default memcached.
"""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
        "LOCATION": env.server("memcached"),
        # The options Django's documentation shows for pylibmc: the binary
        # protocol, and no Nagle delay on a request/response socket.
        "OPTIONS": {"binary": True, "behaviors": {"tcp_nodelay": True}},
    }


TARGET = Target(
    name="memcached",
    description="Django PyLibMCCache + memcached (1 GiB, loopback)",
    caches=caches,
    servers=("memcached",),
    modules=("pylibmc",),
    note="no key-count limit (bounded by memory, 1 GiB, as diskcache by its size_limit)",
    rank=40,
    # The harness's memcached has 1 GiB: 10M keys of ~100-byte values need
    # ~1.5 GiB with memcached's ~50-byte item header and slab rounding, so it
    # would evict the pre-fill (a production memcached would be sized for it).
    max_keys=5_000_000,
    max_keys_reason="the harness's memcached has 1 GiB; ten million items do not fit and "
    "would be evicted while pre-filling",
)
