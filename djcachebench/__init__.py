"""djcachebench: a sharded SQLite disk cache and a host-coherent tiered cache for
Django, and a multiprocess benchmark harness for Django caches."""

__version__ = "0.2.0"
