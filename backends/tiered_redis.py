"""tiered-redis: this project's TieredCache (in-process L1) over django-redis."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    l2 = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": env.server("redis"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
    # The table in the run's own directory (removed with it): by default it would be
    # named after the redis URL, whose port is new at every run, and each run would
    # leave a table and value board (~38 MB) in /tmp/djcachebench-<uid>.
    return {"BACKEND": "djcachebench.backends.tiered.TieredCache",
            "OPTIONS": {"L2": l2, "GENERATION_PATH": str(env.workdir / "generations.mmap")}}


TARGET = Target(
    name="tiered-redis",
    description="djcachebench TieredCache over django-redis",
    caches=caches,
    servers=("redis",),
    modules=("djcachebench.backends.tiered", "django_redis", "redis"),
    note="L1 coherence covers writes made through TieredCache only",
    rank=90,
)
