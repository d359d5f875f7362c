"""tiered-redis-cluster: TieredCache over django-redis, coherent across 2 simulated hosts.

The workers are split round-robin into 2 hosts (the reference's 8 processes:
2 x 4), each with its own generation-table directory, so its own host file and
subscriber; invalidations travel through the one redis-server's pub/sub
(COHERENCE="cluster", COHERENCE_URL defaulting to the L2's redis). The
freshness check holds it to its cross-host bound (``host_bound``).
"""

from djcachebench.bench.targets import Target, TargetEnv
from djcachebench.bench.worker import SIMULATED_HOSTS
from djcachebench.coherence.cluster import BOUND

HOSTS = 2


def caches(env: TargetEnv) -> dict:
    l2 = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": env.server("redis"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
    return {
        "BACKEND": "djcachebench.backends.tiered.TieredCache",
        "OPTIONS": {
            "L2": l2,
            "COHERENCE": "cluster",
            "GENERATION_PATH": str(env.workdir / "host{host}" / "generations.mmap"),
        },
    }


TARGET = Target(
    name="tiered-redis-cluster",
    description="djcachebench TieredCache over django-redis, 2 simulated hosts, "
    "cross-host coherence through redis pub/sub",
    caches=caches,
    settings=lambda env: {SIMULATED_HOSTS: HOSTS},
    servers=("redis",),
    modules=("djcachebench.backends.tiered", "django_redis", "redis"),
    note="workers split into 2 simulated hosts (own generation tables); coherence covers "
    "writes made through TieredCache only",
    rank=91,
    # The documented guarantee (docs/architecture.md): a read that starts on
    # another host more than BOUND after a write was acknowledged is current.
    host_bound=BOUND,
)
