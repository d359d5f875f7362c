"""memcached: Django's PyLibMCCache against a memcached started by the harness."""

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
    description="Django PyLibMCCache + memcached (64 MiB, loopback)",
    caches=caches,
    servers=("memcached",),
    modules=("pylibmc",),
    note="no key-count limit (bounded by memory, 64 MiB)",
    rank=40,
)
