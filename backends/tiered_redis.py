"""tiered-redis: this project's TieredCache (in-process L1) over django-redis."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    l2 = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": env.server("redis"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
    return {"BACKEND": "djcachebench.backends.tiered.TieredCache", "OPTIONS": {"L2": l2}}


TARGET = Target(
    name="tiered-redis",
    description="djcachebench TieredCache over django-redis",
    caches=caches,
    servers=("redis",),
    modules=("djcachebench.backends.tiered", "django_redis", "redis"),
    note="L1 coherence covers writes made through TieredCache only",
    rank=90,
)
