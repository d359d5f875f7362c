"""locmem: Django's LocMemCache.

Each process has its own private cache: nothing is shared between the
workers, so a get hits what this process set (or the pre-fill did not reach
it at all: the pre-fill runs in worker 0 only). It is the floor of what a
Django cache call costs, not a shared cache to choose.
"""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "djcachebench",
        "OPTIONS": env.key_limit(),
    }


TARGET = Target(
    name="locmem",
    description="Django LocMemCache (per-process memory)",
    caches=caches,
    note="per-process: not shared between workers; only worker 0 sees the pre-fill",
    rank=10,
    per_process=True,
    # Each worker process holds its own copy, built by its own sets (Python
    # objects: ~300 B a small entry); ten million keys in each of eight
    # processes is tens of GiB, and only worker 0's pre-fill would fill one.
    max_keys=1_000_000,
    max_keys_reason="a per-process dict: every worker would hold its own copy of every key",
)
