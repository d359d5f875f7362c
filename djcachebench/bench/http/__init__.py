"""``djcachebench http``: a Django site under gunicorn, loaded with wrk, per cache.

Users do not call ``cache.get`` in a loop: they put ``cache_page``,
``get_or_set`` and cache-backed sessions in front of slow views, behind an app
server. This package ships such a site (``site_settings``, ``views``,
``seed``), starts it under gunicorn on a free loopback port once per backend
target (``gunicorn``), loads each route with Debian's wrk (``wrk``), checks
that no worker serves a stale page after an invalidating write and counts the
computations of a stampede (``probes``), and writes results, a report and
charts (``results``, ``command``).
"""
