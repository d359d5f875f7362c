"""Bad settings are refused at start-up with a message that says how to fix them.

Pinned (docs/settings.md, first paragraph): every mistake in a ShardedSQLiteCache entry of
``CACHES`` raises ``ImproperlyConfigured`` when the backend is built, naming
the exact setting path (``CACHES['default']['OPTIONS']['SHARDS']`` when the
alias is in settings), the value given and what is allowed. Nothing falls
back silently to a default, as Django's own backends do for
``MAX_ENTRIES="abc"``. Where the cache lives (LOCATION, its directory, the manifest) is pinned in
``test_sqlite_location.py``.

Django's own settings (``TIMEOUT``, ``MAX_ENTRIES``, ``CULL_FREQUENCY``) are
the exception to "no coercion": every value Django's ``BaseCache`` accepts is
accepted with Django's meaning (``TIMEOUT: "1"``, as Django's own
``CacheMiddlewareTest`` writes it), and so are the legacy lower-case keys
``timeout``, ``max_entries``, ``cull_frequency``, with Django's precedence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.cache.backends.locmem import LocMemCache
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.sqlite import ShardedSQLiteCache

from .helpers import build_from_settings, caches_entry, config_error, new_cache

OPTS = "CACHES['default']['OPTIONS']"


# -- OPTIONS keys -------------------------------------------------------------------


@pytest.mark.parametrize(("given", "suggested"), [
    ("SHARD", "SHARDS"),
    ("shards", "SHARDS"),
    ("LOCK_TIMEOUTS", "LOCK_TIMEOUT"),
    ("MAX_ENTRY", "MAX_ENTRIES"),
    ("SERIALISER", "SERIALIZER"),
])
def test_unknown_option_names_it_and_the_nearest_valid_key(
    settings: Any, cache_dir: Path, given: str, suggested: str
) -> None:
    message = config_error(settings, caches_entry(cache_dir, {given: 8}))
    assert f"{OPTS}[{given!r}]" in message
    assert f"did you mean {suggested!r}" in message


def test_unknown_option_without_a_near_match_lists_the_valid_ones(
    settings: Any, cache_dir: Path
) -> None:
    message = config_error(settings, caches_entry(cache_dir, {"COMPRESSOR": "zlib"}))
    assert f"{OPTS}['COMPRESSOR']" in message
    for name in ("SHARDS", "LOCK_TIMEOUT", "MAX_ENTRIES", "SERIALIZER"):
        assert name in message


# (option, bad value, a phrase of the "allowed" text the message must carry)
BAD_VALUES: list[tuple[str, Any, str]] = [
    ("SHARDS", "8x", "an integer from 1 to 1024"),
    ("SHARDS", "8", "an integer from 1 to 1024"),  # strings are not coerced
    ("SHARDS", 0, "an integer from 1 to 1024"),
    ("SHARDS", 1025, "an integer from 1 to 1024"),
    ("SHARDS", 2.0, "an integer from 1 to 1024"),
    ("SHARDS", True, "an integer from 1 to 1024"),
    ("LOCK_TIMEOUT", -1, "a number of seconds >= 0"),
    ("LOCK_TIMEOUT", "0.5", "a number of seconds >= 0"),
    ("LOCK_TIMEOUT", float("nan"), "a number of seconds >= 0"),
    ("RETRIES", 1.5, "an integer from 0 to 100"),
    ("RETRIES", -1, "an integer from 0 to 100"),
    ("RETRY_BACKOFF", -0.1, "a number of seconds >= 0"),
    # Django's own settings: what int() refuses (Django would use its default) is refused.
    ("MAX_ENTRIES", "abc", "an integer, or a string int() reads"),
    ("MAX_ENTRIES", "2.5", "an integer, or a string int() reads"),
    ("MAX_ENTRIES", [300], "an integer, or a string int() reads"),
    ("MAX_ENTRIES", float("inf"), "an integer, or a string int() reads"),
    ("CULL_FREQUENCY", "abc", "an integer, or a string int() reads"),
    ("CULL_FREQUENCY", None, "an integer, or a string int() reads"),
    ("SIZE_LIMIT", 0, "an integer number of bytes >= 1, or None"),
    ("RAISE_ON_TIMEOUT", "yes", "True or False"),
    ("RAISE_ON_TIMEOUT", 1, "True or False"),
    ("SERIALIZER", "nope.Nothing", "'pickle', 'msgpack', or a dotted path"),
    ("SERIALIZER", "json", "'pickle', 'msgpack', or a dotted path"),
    ("SERIALIZER", "djcachebench.serializers.NoSuchClass", "a dotted path"),
    ("SERIALIZER", "tests.sqlite.helpers.NotASerializer", "dumps()/loads()"),
    ("SERIALIZER", 42, "'pickle', 'msgpack', or a dotted path"),
    ("SERIALIZER", "", "'pickle', 'msgpack', or a dotted path"),
    ("INTEGRITY_KEY", "too-short", "at least 16 bytes"),
    ("INTEGRITY_KEY", 1234567890123456789, "a str or bytes"),
    ("MMAP_SIZE", -1, "an integer number of bytes from 0 to 2**40"),
    ("MMAP_SIZE", 2**40 + 1, "an integer number of bytes from 0 to 2**40"),
    ("PAGE_CACHE", -1, "an integer number of bytes from 0 to 2**40"),
    ("PAGE_CACHE", 1.5, "an integer number of bytes from 0 to 2**40"),
    # SQLite would read this as no cache at all, silently.
    ("PAGE_CACHE", 10**30, "an integer number of bytes from 0 to 2**40"),
    # Accepted, infinity would make get_or_set raise OverflowError.
    ("STAMPEDE_LEASE", float("inf"), "a number of seconds > 0 and at most 86400"),
    ("STAMPEDE_LEASE", 86401, "a number of seconds > 0 and at most 86400"),
    ("LOCK_TIMEOUT", float("inf"), "a number of seconds >= 0"),
    ("EARLY_REFRESH", float("inf"), "a number > 0"),
    # Past any float: refused by name, not a bare OverflowError.
    ("LOCK_TIMEOUT", 10**400, "a number of seconds >= 0"),
    ("RETRY_BACKOFF", 10**400, "a number of seconds >= 0"),
    ("STAMPEDE_LEASE", 10**400, "a number of seconds > 0 and at most 86400"),
    ("EARLY_REFRESH", 10**400, "a number > 0"),
    # A serializer constructor's own ValueError is named, not let out bare.
    ("SERIALIZER", "tests.sqlite.helpers.RefusingSerializer", "'pickle', 'msgpack', or a dotted"),
]


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_VALUES,
                         ids=[f"{n}={v!r}" for n, v, _ in BAD_VALUES])
def test_bad_value_names_setting_path_value_and_what_is_allowed(
    settings: Any, cache_dir: Path, name: str, value: Any, allowed: str
) -> None:
    message = config_error(settings, caches_entry(cache_dir, {name: value}))
    assert f"{OPTS}[{name!r}]" in message
    assert repr(value) in message
    assert allowed in message


def test_bad_value_keeps_the_parser_error_as_cause(settings: Any, cache_dir: Path) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        build_from_settings(settings, caches_entry(cache_dir, {"SERIALIZER": "nope.Nothing"}))
    assert isinstance(info.value.__cause__, ImportError)


def test_path_is_generic_when_the_alias_is_not_in_settings(cache_dir: Path) -> None:
    """Built outside ``settings.CACHES``, the message still names the option."""
    with pytest.raises(ImproperlyConfigured) as info:
        new_cache(cache_dir, {"SHARDS": 0})
    assert "['OPTIONS']['SHARDS']" in str(info.value)
    assert "0" in str(info.value)


def test_options_none_reads_as_no_options(cache_dir: Path) -> None:
    """``"OPTIONS": None`` reads as no options, not an AttributeError from
    Django's BaseCache."""
    cache = new_cache(cache_dir, None, OPTIONS=None)
    cache.set("k", 1)
    assert cache.get("k") == 1 and cache._store.n == 8


@pytest.mark.parametrize("options", [[("SHARDS", 4)], [], "", 0, ()])
def test_options_must_be_a_dict(settings: Any, cache_dir: Path, options: Any) -> None:
    """An empty list, str or tuple is no dict either (they read as no options
    before: a misconfiguration passed without a word)."""
    entry = caches_entry(cache_dir)
    entry["OPTIONS"] = options
    message = config_error(settings, entry)
    assert "['OPTIONS'] must be a dict" in message


def test_no_directory_is_created_for_a_refused_configuration(
    settings: Any, cache_dir: Path
) -> None:
    config_error(settings, caches_entry(cache_dir, {"SHARDS": 0}))
    assert not cache_dir.exists()


# -- top-level params ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["SHARDS", "LOCK_TIMEOUT", "MAX_ENTRIES", "SERIALIZER"])
def test_option_misplaced_at_top_level_is_refused(
    settings: Any, cache_dir: Path, name: str
) -> None:
    """``SHARDS`` next to ``LOCATION`` (diskcache's habit) would be silently ignored."""
    value: Any = "pickle" if name == "SERIALIZER" else 4
    message = config_error(settings, caches_entry(cache_dir, **{name: value}))
    assert f"CACHES['default'][{name!r}]" in message
    assert f"{OPTS}[{name!r}]" in message


@pytest.mark.parametrize("timeout", ["abc", "2.5", "", [1], {}, float("nan"), float("inf")])
@pytest.mark.parametrize("key", ["TIMEOUT", "timeout"])
def test_timeout_django_would_replace_by_300_is_refused(
    settings: Any, cache_dir: Path, timeout: Any, key: str
) -> None:
    """Django's BaseCache quietly uses 300 for these (or crashes, for infinity)."""
    message = config_error(settings, caches_entry(cache_dir, **{key: timeout}))
    assert f"CACHES['default'][{key!r}] = {timeout!r} is invalid" in message
    assert "a string int() reads" in message and "None for no expiry" in message


@pytest.mark.parametrize("key", ["max_entries", "cull_frequency"])
def test_legacy_top_level_value_django_would_replace_is_refused(
    settings: Any, cache_dir: Path, key: str
) -> None:
    message = config_error(settings, caches_entry(cache_dir, **{key: "lots"}))
    assert f"CACHES['default'][{key!r}] = 'lots' is invalid" in message


def test_lower_case_options_key_is_refused_with_the_name_django_reads(
    settings: Any, cache_dir: Path
) -> None:
    """Django reads only ``OPTIONS["MAX_ENTRIES"]``: ``OPTIONS["max_entries"]`` would be
    ignored by it, so it is an unknown option here (the legacy key is top-level)."""
    message = config_error(settings, caches_entry(cache_dir, {"max_entries": 10}))
    assert f"{OPTS}['max_entries'] is not a known option" in message
    assert "did you mean 'MAX_ENTRIES'" in message


# -- Django's own settings: every value BaseCache accepts, with its meaning ------------

# (params as in CACHES, (default_timeout, _max_entries, _cull_frequency) expected)
DJANGO_ACCEPTS: list[tuple[dict[str, Any], tuple[Any, int, int]]] = [
    ({"TIMEOUT": "1"}, (1, 300, 3)),  # Django's CacheMiddlewareTest
    ({"TIMEOUT": " 60 "}, (60, 300, 3)),
    ({"TIMEOUT": "0"}, (0, 300, 3)),
    ({"TIMEOUT": "-5"}, (-5, 300, 3)),
    ({"TIMEOUT": None}, (None, 300, 3)),
    ({"TIMEOUT": b"7"}, (7, 300, 3)),
    ({"OPTIONS": {"MAX_ENTRIES": "1000", "CULL_FREQUENCY": "4"}}, (300, 1000, 4)),
    ({"OPTIONS": {"MAX_ENTRIES": 99.9, "CULL_FREQUENCY": 2.0}}, (300, 99, 2)),
    ({"OPTIONS": {"MAX_ENTRIES": 0, "CULL_FREQUENCY": -1}}, (300, 0, -1)),
    ({"OPTIONS": {"MAX_ENTRIES": "-3"}}, (300, -3, 3)),
    # The legacy lower-case top-level keys, read before the documented ones.
    ({"timeout": "5"}, (5, 300, 3)),
    ({"timeout": 5, "TIMEOUT": 60}, (5, 300, 3)),
    ({"timeout": None, "TIMEOUT": 60}, (None, 300, 3)),
    ({"max_entries": "20", "cull_frequency": "0"}, (300, 20, 0)),
    ({"max_entries": 20, "OPTIONS": {"MAX_ENTRIES": 50}}, (300, 20, 3)),
    ({"cull_frequency": 5, "OPTIONS": {"CULL_FREQUENCY": 2}}, (300, 300, 5)),
]


@pytest.mark.parametrize(("params", "expected"), DJANGO_ACCEPTS,
                         ids=[repr(p) for p, _ in DJANGO_ACCEPTS])
def test_settings_django_accepts_mean_what_they_mean_to_django(
    settings: Any, cache_dir: Path, params: dict[str, Any], expected: tuple[Any, int, int]
) -> None:
    """Built from ``settings.CACHES`` like any alias, the backend reads these as
    Django's own LocMemCache does; the engine culls with the same values."""
    django = LocMemCache("same-as-django", params)
    assert (django.default_timeout, django._max_entries, django._cull_frequency) == expected
    entry = caches_entry(cache_dir, **params)
    backend = build_from_settings(settings, entry)
    assert (backend.default_timeout, backend._max_entries, backend._cull_frequency) == expected
    assert (backend._store.max_entries, backend._store.cull_frequency) == expected[1:]


def test_timeout_string_one_keeps_values_for_one_second(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """``TIMEOUT: "1"`` (Django's CacheMiddlewareTest): values live one second, not 300."""
    cache = make_cache(TIMEOUT="1")
    cache.set("k", "v")
    assert cache.get("k") == "v"
    time.sleep(1.2)
    assert cache.get("k") is None


@pytest.mark.parametrize("timeout", ["0", "-1", 0, -1])
def test_timeout_zero_or_negative_string_stores_nothing(
    make_cache: Callable[..., ShardedSQLiteCache], timeout: Any
) -> None:
    """Django: a default timeout of 0 or less expires at once."""
    cache = make_cache(TIMEOUT=timeout)
    cache.set("k", "v")
    assert cache.get("k") is None
    assert cache.entry_count() == 0


def test_legacy_timeout_beats_timeout(make_cache: Callable[..., ShardedSQLiteCache]) -> None:
    cache = make_cache(timeout=None, TIMEOUT=1)
    cache.set("k", "v")
    time.sleep(1.2)
    assert cache.get("k") == "v"


def test_legacy_max_entries_is_honoured(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """``max_entries`` next to ``BACKEND`` bounds the cache (it used to be ignored: 300)."""
    cache = make_cache({"MAX_ENTRIES": 500}, max_entries="10", cull_frequency="2")
    for i in range(40):
        cache.set(f"k{i}", i)
    assert cache.entry_count() <= 10
    assert cache.get("k39") == 39


def test_max_entries_zero_culls_at_every_new_key(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Django's meaning of MAX_ENTRIES <= 0 (its own suite sets ``_max_entries = -1``
    to force a cull): every new key culls; the key just written stays."""
    cache = make_cache({"MAX_ENTRIES": "0", "CULL_FREQUENCY": "2"})
    for i in range(30):
        cache.set(f"k{i}", i)
        assert cache.get(f"k{i}") == i
    assert cache.entry_count() <= 3


def test_negative_cull_frequency_culls_only_expired_entries(
    make_cache: Callable[..., ShardedSQLiteCache]
) -> None:
    """Django's database and locmem backends remove ``count // CULL_FREQUENCY`` entries,
    which is nothing for a negative frequency: only expired entries go."""
    cache = make_cache({"MAX_ENTRIES": 5, "CULL_FREQUENCY": -1})
    cache.set("old", 0, timeout=0.2)
    time.sleep(0.3)
    for i in range(12):
        cache.set(f"k{i}", i)
    assert cache.entry_count() == 12
    assert cache.get_many([f"k{i}" for i in range(12)]) == {f"k{i}": i for i in range(12)}


# -- SECRET_KEY and INTEGRITY_KEY ---------------------------------------------------


def test_empty_secret_key_without_integrity_key_is_refused(
    settings: Any, cache_dir: Path
) -> None:
    settings.SECRET_KEY = ""
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY"):
        build_from_settings(settings, caches_entry(cache_dir))


def test_integrity_key_replaces_an_empty_secret_key(settings: Any, cache_dir: Path) -> None:
    settings.SECRET_KEY = ""
    backend = build_from_settings(
        settings, caches_entry(cache_dir, {"INTEGRITY_KEY": "k" * 32}))
    backend.set("k", ["v"])
    assert backend.get("k") == ["v"]
    backend.close_connections()


# -- valid settings are taken as given ----------------------------------------------


def test_valid_options_are_used_as_given(settings: Any, cache_dir: Path) -> None:
    backend = build_from_settings(settings, caches_entry(cache_dir, {
        "SHARDS": 3, "LOCK_TIMEOUT": 1, "RETRIES": 0, "RETRY_BACKOFF": 0,
        "RAISE_ON_TIMEOUT": True, "MAX_ENTRIES": None, "CULL_FREQUENCY": 0,
        "SIZE_LIMIT": 10**6, "SERIALIZER": "msgpack", "INTEGRITY_KEY": b"b" * 16,
        "MMAP_SIZE": 2**20,
    }))
    store = backend._store
    assert store.n == 3 and len(list(cache_dir.glob("shard-*.sqlite3"))) <= 3
    assert (store.policy.lock_timeout, store.policy.retries, store.policy.backoff) == (1.0, 0, 0.0)
    assert store.max_entries is None and store.cull_frequency == 0
    assert store.size_limit == 10**6
    assert backend.options["RAISE_ON_TIMEOUT"] is True
    assert backend._max_entries is None  # not Django's silent fallback to 300


def test_a_path_object_is_a_location(tmp_path: Path) -> None:
    """``BASE_DIR / "cache"``, as Django's FileBasedCache takes it, names a
    directory like its str."""
    cache = ShardedSQLiteCache(tmp_path / "c", {})  # type: ignore[arg-type]
    cache.set("k", "v")
    assert ShardedSQLiteCache(str(tmp_path / "c"), {}).get("k") == "v"
    assert cache.location == str(tmp_path / "c")


def test_a_serializer_whose_dumps_gives_no_bytes_is_named_and_nothing_changes(
        cache_dir: Path) -> None:
    cache = ShardedSQLiteCache(str(cache_dir),
                               {"OPTIONS": {"SERIALIZER": "tests.sqlite.helpers.TextSerializer"}})
    cache.set("k", b"kept")  # bytes need no serializer
    with pytest.raises(TypeError, match="SERIALIZER's dumps\\(\\) must return bytes"):
        cache.set("k", {"a": 1})
    assert cache.get("k") == b"kept"
