"""The benchmark harness: one workload, many processes, many Django caches.

Parts, each in its own module so each can be tested alone (as pyperf splits
runner, worker and formatters): ``workload`` (scenarios and per-worker op
lists), ``targets`` (the compared backends' definitions), ``servers`` (real
memcached / redis-server on loopback), ``worker`` (the timing loop in a
spawned process), ``runner`` (orchestration), ``stats`` (merged samples and
the one percentile function), ``results`` (the versioned JSON file),
``report`` and ``plot`` (which read only that file), ``cli``.
"""
