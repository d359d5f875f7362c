"""TieredCache's internals; the Django class is ``djcachebench.backends.tiered``.

One job a module, imported one way (``backends.tiered`` -> these -> ``coherence``,
``l1``): ``config`` reads the settings, ``state`` holds what the instances of
one configuration share in a process (the L1 map, its record layout, the
counters, the shared files), ``writes`` is every mutation with its L1 effect,
and ``l2_traits`` is what is known of particular L2 backends (how they fail,
the expiry of what they return, how long they keep what they are given).
"""
