"""The timed loops: every op of a list called on the cache, each call bracketed by the clock.

Two loops with one contract: :func:`run_calls` calls the sync methods
(``get``, ``set``, ``delete``, ``incr``), in a worker process or in one of its
threads; :func:`arun_calls` awaits their async twins (``aget``, ``aset``,
``adelete``, ``aincr``) in an asyncio task. Both record into a :class:`Tally`
and a freshness history in the same way, so the parent merges a thread's, a
task's and a process's samples alike (merge.py).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from typing import Any

from djcachebench.bench.freshness import DONE, HIT, MISS, RAISED, REFUSED, History
from djcachebench.bench.verify import Observer
from djcachebench.bench.workload import ACTIONS, DELETE, GET, SET, Op

#: How often (in ops) a loop publishes its progress to the shared counter.
PROGRESS_EVERY = 512


class Tally:
    """Per action: latencies of the calls that returned, misses, and the errors by type.

    With an ``observer``, every value a get returned is also counted for the
    parent's check (verify.py); the warm-up runs without one, but records its
    fingerprints (``printer``) in the ``history`` too: its writes are part of
    what a later answer must be fresh against (freshness.py).
    """

    def __init__(
        self,
        observer: Observer | None = None,
        history: History | None = None,
        printer: Observer | None = None,
    ) -> None:
        self.observer = observer
        self.history = history
        self._printer = printer or observer
        self.lat: list[array[int]] = [array("q") for _ in ACTIONS]
        self.miss = [0] * len(ACTIONS)
        self.errors = [0] * len(ACTIONS)
        self.kinds: list[dict[str, int]] = [{} for _ in ACTIONS]
        self.first_error: Exception | None = None

    def note(self, key: Any, value: Any) -> None:
        """A get's answer: counted (measured ops) and kept in the history."""
        if self.observer is not None:
            print_ = self.observer.add(key, value)
        elif self._printer is not None:
            print_ = self._printer.recognize(value)
        else:
            return
        if self.history is not None:
            self.history.answer(print_)

    def error(self, code: int, exc: Exception) -> None:
        self.errors[code] += 1
        name = error_name(exc)
        self.kinds[code][name] = self.kinds[code].get(name, 0) + 1
        if self.first_error is None:
            self.first_error = exc


def error_name(exc: BaseException) -> str:
    """``pylibmc.TooBig``: the exception's type, as a traceback names it."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def run_calls(
    cache: Any, ops: Sequence[Op], tally: Tally, done: Any, index: int, offset: int
) -> None:
    """Run ``ops``, recording each call's latency and misses in ``tally``.

    A miss is a get that returned None, or a set/delete that returned False
    (Django's ``delete`` says whether the key existed), or an incr of an
    absent key. Django's ``incr`` raises ValueError then, and a counter in a
    Django project is then created with ``set(key, 1)``: that set is inside
    the incr's timing, as it is inside the view that counts.

    A get that returns a value hands it to the tally after its second clock
    read, and every op's clock reads and outcome go to the tally's history
    (status codes of freshness.py), so the parent can check both what was
    returned and whether it was current (verify.py, freshness.py). A set or
    delete that returned False, or raised, is recorded as such: its effect is
    unknown, and it is never taken for an acknowledged write.

    A call that raises is counted as an error of its type and left out of the
    latencies (a refusal is not a fast answer): memcached's client refuses
    values over its 1 MB item size, and that is a finding to report, not a
    reason to lose the target's other figures. The ``try`` costs nothing on
    the timed path (3.11's zero-cost exceptions). The progress counter is
    written every PROGRESS_EVERY ops, outside the timed brackets.
    """
    get, set_, delete, incr = cache.get, cache.set, cache.delete, cache.incr
    clock = time.perf_counter_ns
    lat, miss = tally.lat, tally.miss
    note = tally.note
    history = tally.history
    if history is not None:
        t0s, t1s, statuses = history.t0.append, history.t1.append, history.status.append
    for n, (code, key, value) in enumerate(ops, 1):
        t0 = 0
        try:
            if code == GET:
                t0 = clock()
                result = get(key)
                t1 = clock()
                missed = result is None
                if not missed:
                    note(key, result)  # after t1: never timed (verify.py)
                status = MISS if missed else HIT
            elif code == SET:
                t0 = clock()
                result = set_(key, value)
                t1 = clock()
                missed = result is False
                status = REFUSED if missed else DONE
            elif code == DELETE:
                t0 = clock()
                result = delete(key)
                t1 = clock()
                missed = result is False
                # False: absent, or (diskcache) a lock timeout; never an acknowledgement.
                status = REFUSED if missed else DONE
            else:
                t0 = clock()
                try:
                    incr(key)
                    missed = False
                except ValueError:
                    set_(key, 1)
                    missed = True
                t1 = clock()
                status = DONE
        except Exception as exc:
            t1 = clock()
            status = RAISED
            tally.error(code, exc)
        else:
            lat[code].append(t1 - t0)
            if missed:
                miss[code] += 1
        if history is not None:
            t0s(t0)
            t1s(t1)
            statuses(status)
        if n % PROGRESS_EVERY == 0:
            done[index] = offset + n
    done[index] = offset + len(ops)


async def arun_calls(
    cache: Any, ops: Sequence[Op], tally: Tally, done: Any, index: int, offset: int
) -> None:
    """:func:`run_calls` through the async methods, in a task of a running event loop.

    The same brackets, outcomes and history as the sync loop; a call's time
    includes any wait for the loop or for a ``sync_to_async`` thread, which is
    what a request awaiting the cache waits. Where the backend has no native
    async method, Django's ``BaseCache`` runs the sync one in a thread
    (``sync_to_async``); the harness adds no hop of its own.
    """
    aget, aset, adelete, aincr = cache.aget, cache.aset, cache.adelete, cache.aincr
    clock = time.perf_counter_ns
    lat, miss = tally.lat, tally.miss
    note = tally.note
    history = tally.history
    if history is not None:
        t0s, t1s, statuses = history.t0.append, history.t1.append, history.status.append
    for n, (code, key, value) in enumerate(ops, 1):
        t0 = 0
        try:
            if code == GET:
                t0 = clock()
                result = await aget(key)
                t1 = clock()
                missed = result is None
                if not missed:
                    note(key, result)  # after t1: never timed (verify.py)
                status = MISS if missed else HIT
            elif code == SET:
                t0 = clock()
                result = await aset(key, value)
                t1 = clock()
                missed = result is False
                status = REFUSED if missed else DONE
            elif code == DELETE:
                t0 = clock()
                result = await adelete(key)
                t1 = clock()
                missed = result is False
                status = REFUSED if missed else DONE
            else:
                t0 = clock()
                try:
                    await aincr(key)
                    missed = False
                except ValueError:
                    await aset(key, 1)
                    missed = True
                t1 = clock()
                status = DONE
        except Exception as exc:
            t1 = clock()
            status = RAISED
            tally.error(code, exc)
        else:
            lat[code].append(t1 - t0)
            if missed:
                miss[code] += 1
        if history is not None:
            t0s(t0)
            t1s(t1)
            statuses(status)
        if n % PROGRESS_EVERY == 0:
            done[index] = offset + n
    done[index] = offset + len(ops)
