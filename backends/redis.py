"""redis: django-redis against a redis-server started by the harness."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": env.server("redis"),
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }


TARGET = Target(
    name="redis",
    description="django-redis + redis-server (persistence off, loopback)",
    caches=caches,
    servers=("redis",),
    modules=("django_redis", "redis"),
    note="no key-count limit (no maxmemory set)",
    rank=50,
)
