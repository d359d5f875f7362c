"""Key making and validation with Django's results and warnings, without its per-call cost.

Django's ``BaseCache.validate_key`` runs ``memcache_key_warnings``, whose
regular expression is a lazily compiled object: every call goes through a
``SimpleLazyObject`` proxy, a large share of a ``LocMemCache.get``. We
check the same two conditions with a compiled pattern and only call Django's
function (which emits the exact same warnings) when one of them holds.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from django.core.cache.backends.base import (
    MEMCACHE_MAX_KEY_LENGTH,
    BaseCache,
    CacheKeyWarning,
    default_key_func,
    memcache_key_warnings,
)

from djcachebench import memo_policy

# Made keys remembered per cache instance; the memo is emptied when full.
MEMO_SIZE = 4096

#: ``search`` for a character Django warns about (``memcache_key_warnings``):
#: one compiled pattern for every module that must tell such keys apart.
MEMCACHE_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]").search

# Key types whose made key is a pure function of their value, and whose values
# never equal one of another type in the memo (an ``int`` would: ``1 == 1.0 ==
# True`` but Django makes ":1:1", ":1:1.0" and ":1:True"). ``bytes`` keys are
# what the benchmark uses; Django formats them as ``str(b"...")``.
_MEMO_TYPES = frozenset({str, bytes})
# The same holds for versions: ``1``, ``1.0`` and ``True`` are equal memo keys
# but Django makes ":1:k", ":1.0:k" and ":True:k" of them, so a memo that took
# them for one version returned version 1's entry to a caller asking for
# version ``True``. Only versions of exactly these types are remembered.
_MEMO_VERSION_TYPES = frozenset({int, str})


def validate_key(key: str) -> None:
    """Warn, exactly as Django does, about keys memcached would not accept."""
    if len(key) > MEMCACHE_MAX_KEY_LENGTH or MEMCACHE_BAD_CHARS(key):
        for warning in memcache_key_warnings(key):
            warnings.warn(warning, CacheKeyWarning, stacklevel=3)


class FastKeyValidation:
    """Mixin for ``BaseCache`` subclasses: same keys and warnings, made cheaper.

    ``validate_key`` checks with a compiled pattern. ``make_and_validate_key``
    also remembers the keys it made (a real share of a disk-cache read under
    the reference workload; docs/benchmarks.md), but only where that cannot change a
    result: Django's default ``KEY_FUNCTION`` (a pure function of key, prefix
    and version; a custom one might not be), ``make_key``/``validate_key``
    not overridden further, ``str`` and ``bytes`` keys, and only keys that passed
    validation, so a key that deserves a warning gets it on every call. The
    prefix and version in force are part of the memo's key.
    """

    _key_memo: dict[tuple[str, Any, str], str] | None = None
    _key_judge: memo_policy.Judge  # whole or sampled (``memo_policy``), with the memo

    def validate_key(self, key: str) -> None:
        validate_key(key)

    def make_and_validate_key(self, key: Any, version: Any = None) -> str:
        memo = self._key_memo
        if memo is None:
            return BaseCache.make_and_validate_key(self, key, version)  # type: ignore[arg-type]
        if type(key) not in _MEMO_TYPES:  # never remembered: nothing to look up
            return BaseCache.make_and_validate_key(self, key, version)  # type: ignore[arg-type]
        if version is None:
            version = self.version  # type: ignore[attr-defined]
        prefix = self.key_prefix  # type: ignore[attr-defined]
        if (type(version) not in _MEMO_VERSION_TYPES or type(prefix) is not str
                or self.key_func is not default_key_func):  # type: ignore[attr-defined]
            # Not a key the memo can tell apart (see _MEMO_VERSION_TYPES), or
            # KEY_FUNCTION replaced on the instance since the memo was enabled.
            return BaseCache.make_and_validate_key(self, key, version)  # type: ignore[arg-type]
        # Over a key set far larger than the memo it keeps a hash sample of the
        # keys only (memo_policy): the others skip the lookup.
        judge = self._key_judge
        sampled = judge.whole or not hash(key) % memo_policy.SAMPLE
        if sampled:
            judge.lookups += 1
            if judge.lookups >= memo_policy.WINDOW and judge.judge():
                memo.clear()  # its next entries are the sample's
            made = memo.get((key, version, prefix))
            if made is not None:
                judge.hits += 1
                return made
        # Not seen yet (at many keys, most reads): Django's default key function
        # inlined (the memo is on only where it is the one in force), without an
        # exception for the miss or a second check.
        made = f"{prefix}:{version}:{key}"
        if len(made) <= MEMCACHE_MAX_KEY_LENGTH and not MEMCACHE_BAD_CHARS(made):
            if sampled:
                if len(memo) * judge.scale >= MEMO_SIZE:
                    memo.clear()
                memo[key, version, prefix] = made
            return made
        # A key that deserves a warning gets it on every call: never remembered.
        return BaseCache.make_and_validate_key(self, key, version)  # type: ignore[arg-type]

    def enable_key_memo(self) -> None:
        """Turn the memo on if this instance makes keys the default way (call after init)."""
        cls = type(self)
        if (getattr(self, "key_func", None) is default_key_func
                and cls.make_key is BaseCache.make_key
                and cls.validate_key is FastKeyValidation.validate_key):
            self._key_memo = {}
            self._key_judge = memo_policy.Judge(MEMO_SIZE)
