"""sqlite-floor: one bare SQLite statement per call (a measuring instrument).

Not a cache to choose: ``djcachebench.bench.floor.BareSQLiteCache`` has no
expiry, no integrity tag, no culling. It runs 8 WAL shards with the same lock
waiting as ShardedSQLiteCache and nothing else, so its figures are what SQLite
itself costs on this machine: the floor under any SQLite-backed backend.
"""

from djcachebench.bench.targets import Target, TargetEnv


def caches(env: TargetEnv) -> dict:
    return {
        "BACKEND": "djcachebench.bench.floor.BareSQLiteCache",
        "LOCATION": str(env.workdir / "bare"),
    }


TARGET = Target(
    name="sqlite-floor",
    description="bare SQLite statements, 8 WAL shards (instrument, not a cache)",
    caches=caches,
    modules=("djcachebench.bench.floor",),
    note="a measuring instrument: no expiry, integrity tag or limit; "
         "what SQLite itself costs here",
    rank=65,
)
