"""``djcachebench stampede``: many processes ask for one absent key at the same moment.

The process-level twin of the stampede probe of ``djcachebench http``: no web
server between the callers and the cache, so what it shows is the cache's own
``get_or_set`` (how many computations, how long the callers wait), not
gunicorn's queue. Parts, one job each:

* :mod:`.command`: the CLI, the rows (targets, with and without protection),
  servers, the interleaved rounds;
* :mod:`.rounds` and :mod:`.crowd`: one round, the parent's side (start,
  step and stop the worker processes) and a worker's (Django set-up, its
  threads, the timed calls);
* :mod:`.data`: the results file (schema ``djcachebench-stampede``) and the
  figures of a round;
* :mod:`.report` and :mod:`.chart`: report.md and stampede.png, from the file only.
"""
