"""Host-wide counters: every process's counts of a cache, summed, readable from any process.

``file.py`` (the shared file: layout, slots, sums) and ``publish.py`` (when a
process writes its counts) import nothing from Django; ``report.py`` (what
``manage.py cachestats`` and ``djcachebench.metrics`` show of each alias)
and ``formats.py`` (text, JSON, Prometheus) do.
"""
