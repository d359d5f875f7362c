"""TieredCache's internals; the Django class is ``djcachebench.backends.tiered``.

One job a module, imported one way (``backends.tiered`` -> these -> ``coherence``,
``l1``): ``config`` reads the settings (``options`` is their table), ``state``
holds what the instances of one configuration share in a process (the L1 map,
its record layout, the counters, the shared files), ``wiring`` builds one
instance's parts, ``fill`` is what a miss keeps in the L1, ``writes`` is every
mutation with its L1 effect (``write_through``: keeping a written value), and
``l2/`` is what is known of particular L2 backends, one module per family
behind one adapter protocol (how they fail, the expiry of what they return,
how long they keep what they are given, what their LOCATION names).
"""
