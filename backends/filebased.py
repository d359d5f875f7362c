"""filebased: Django's FileBasedCache, one file per key in a directory."""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": str(env.workdir / "filebased"),
        "OPTIONS": env.key_limit(),
    }


TARGET = Target(
    name="filebased",
    description="Django FileBasedCache (one file per key)",
    caches=caches,
    rank=20,
    max_keys=1_000_000,
    max_keys_reason="one file per key, and FileBasedCache culls by listing the directory: "
    "ten million files take hours to write and to cull",
)
