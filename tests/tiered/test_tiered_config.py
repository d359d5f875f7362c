"""Bad TieredCache configuration: clear ImproperlyConfigured and system check errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured

from djcachebench.backends.tiered import TieredCache
from djcachebench.checks_tiered import check_tiered_caches
from tests.tiered.helpers import LOCMEM, SQLITE, TIERED, locmem_tiered


def build(options: dict[str, Any], **params: Any) -> TieredCache:
    return TieredCache(params.pop("LOCATION", ""), {"OPTIONS": options, **params})


@pytest.fixture
def locmem_l2(settings: Any, tmp_path: Path) -> dict[str, Any]:
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "l2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path), "KEY_PREFIX": "p",
               "OPTIONS": {"MAX_ENTRIES": 50}},
    }
    return settings.CACHES


def gen(tmp_path: Path) -> str:
    return str(tmp_path / "g.mmap")


@pytest.mark.parametrize(("options", "message"), [
    ({}, r"\['L2'\] is required"),
    ({"L2": 3}, r"\['L2'\] = 3 is invalid; allowed: the name of another alias"),
    ({"L2": {"LOCATION": "x"}}, r"\['L2'\] = \{'LOCATION': 'x'\} is invalid"),
    ({"L2": {"BACKEND": LOCMEM, "SHARDS": 2}}, r"\['L2'\] = .* is invalid"),
    ({"L2": "l2", "L1_MAX_ENTRIES": "10"},
     r"\['L1_MAX_ENTRIES'\] = '10' is invalid; allowed: an integer >= 0"),
    ({"L2": "l2", "L1_MAX_BYTES": -1}, r"\['L1_MAX_BYTES'\] = -1 is invalid"),
    ({"L2": "l2", "L1_TIMEOUT": 0}, r"\['L1_TIMEOUT'\] = 0 is invalid; allowed: a number"),
    ({"L2": "l2", "COHERENCE": "process"},
     r"\['COHERENCE'\] = 'process' is invalid; allowed: 'host' or 'none'"),
    ({"L2": "l2", "L1_MAX_ENTRYS": 5}, r"'L1_MAX_ENTRYS'\] is not a known option; "
     r"did you mean 'L1_MAX_ENTRIES'"),
    ({"L2": "l2", "GENERATION_SLOTS": 0}, r"\['GENERATION_SLOTS'\] = 0 is invalid"),
])
def test_bad_options_name_the_setting(locmem_l2: Any, options: dict[str, Any],
                                      message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message) as info:
        build(options)
    assert "['OPTIONS']" in str(info.value)


def test_missing_alias(locmem_l2: Any) -> None:
    with pytest.raises(ImproperlyConfigured,
                       match=r"\['L2'\] = 'nope' is not an alias of CACHES; aliases defined: "
                             r"'default', 'l2'"):
        build({"L2": "nope"})


def test_self_reference_and_cycles(settings: Any) -> None:
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "me": {"BACKEND": TIERED, "OPTIONS": {"L2": "me"}},
        "a": {"BACKEND": TIERED, "OPTIONS": {"L2": "b"}},
        "b": {"BACKEND": TIERED, "OPTIONS": {"L2": {"BACKEND": TIERED, "OPTIONS": {"L2": "a"}}}},
    }
    with pytest.raises(ImproperlyConfigured, match=r"cycle of tiered caches: me -> me"):
        caches["me"]
    with pytest.raises(ImproperlyConfigured, match=r"cycle of tiered caches: b -> <inline> -> "
                                                   r"a -> b"):
        caches["a"]
    errors = {e.obj: e for e in check_tiered_caches()}
    assert errors["CACHES['me']"].id == "djcachebench.E103"
    assert errors["CACHES['a']"].id == "djcachebench.E103"
    assert errors["CACHES['b']"].id == "djcachebench.E103"


def test_tiered_over_tiered_without_a_cycle_works(settings: Any, tmp_path: Path) -> None:
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "store": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path)},
        "inner": {"BACKEND": TIERED, "OPTIONS": {"L2": "store",
                                                 "GENERATION_PATH": str(tmp_path / "i")}},
        "outer": {"BACKEND": TIERED, "OPTIONS": {"L2": "inner",
                                                 "GENERATION_PATH": str(tmp_path / "o")}},
    }
    caches["outer"].set("k", "v")
    assert caches["store"].get("k") == "v" and caches["outer"].get("k") == "v"
    assert [e for e in check_tiered_caches() if e.level >= 40] == []


def test_alias_form_rejects_its_own_key_settings(locmem_l2: Any, tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"\['KEY_PREFIX'\] = 'x' differs from "
                                                   r"CACHES\['l2'\]\['KEY_PREFIX'\] = 'p'"):
        build({"L2": "l2"}, KEY_PREFIX="x")
    with pytest.raises(ImproperlyConfigured, match=r"\['MAX_ENTRIES'\] = 10 is invalid with an "
                                                   r"L2 alias; set CACHES\['l2'\]"):
        build({"L2": "l2", "MAX_ENTRIES": 10})
    # Repeating the L2's own values is fine.
    c = build({"L2": "l2", "GENERATION_PATH": gen(tmp_path)}, KEY_PREFIX="p", VERSION=1)
    assert c.make_key("k") == "p:1:k"
    assert c._max_entries == 50


def test_inline_form_passes_settings_through(tmp_path: Path) -> None:
    c = build({"L2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path)},
               "MAX_ENTRIES": 7, "CULL_FREQUENCY": 2, "GENERATION_PATH": gen(tmp_path)},
              KEY_PREFIX="pre", VERSION=4, TIMEOUT=11, KEY_FUNCTION=lambda k, p, v: f"{p}|{v}|{k}")
    l2 = c.l2
    assert (l2.key_prefix, l2.version, l2.default_timeout) == ("pre", 4, 11)
    assert (l2._max_entries, l2._cull_frequency) == (7, 2)
    assert c.make_key("k") == "pre|4|k"


def test_inline_conflicts_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"\['L2'\]\['KEY_PREFIX'\] = 'a' conflicts "
                                                   r"with 'b'"):
        build({"L2": {"BACKEND": LOCMEM, "KEY_PREFIX": "a"}}, KEY_PREFIX="b")
    with pytest.raises(ImproperlyConfigured, match=r"\['L2'\]\['OPTIONS'\]\['MAX_ENTRIES'\] = 5 "
                                                   r"conflicts with 6"):
        build({"L2": {"BACKEND": LOCMEM, "OPTIONS": {"MAX_ENTRIES": 5}}, "MAX_ENTRIES": 6})


def test_location_and_backend_errors(tmp_path: Path) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"\['LOCATION'\] = 'somewhere' is invalid"):
        build({"L2": {"BACKEND": LOCMEM}}, LOCATION="somewhere")
    with pytest.raises(ImproperlyConfigured, match=r"\['L2'\]\['BACKEND'\] = 'no.such.Cache' "
                                                   r"cannot be imported"):
        build({"L2": {"BACKEND": "no.such.Cache"}, "GENERATION_PATH": gen(tmp_path)})


def test_an_l2_whose_client_library_is_missing_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Django's PyLibMCCache imports pylibmc in its constructor: a missing module
    is named as a setting's problem, not a bare ModuleNotFoundError."""
    import sys

    monkeypatch.setitem(sys.modules, "pylibmc", None)
    backend = "django.core.cache.backends.memcached.PyLibMCCache"
    with pytest.raises(ImproperlyConfigured, match=r"\['L2'\]\['BACKEND'\] = '[^']*PyLibMCCache' "
                                                   r"needs a module that cannot be imported"):
        build({"L2": {"BACKEND": backend, "LOCATION": "127.0.0.1:1"},
               "GENERATION_PATH": gen(tmp_path)})


def test_generation_path_that_cannot_be_used(settings: Any, tmp_path: Path) -> None:
    """A file that is not a table is never overwritten (it may be somebody's data);
    the system check names it, and the cache works with its L1 off (a request
    must not fail for a file anything on the host can damage)."""
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"not a table" * 100)
    options = {"L2": {"BACKEND": LOCMEM, "LOCATION": "gp"}, "GENERATION_PATH": str(foreign)}
    settings.CACHES = {"default": {"BACKEND": LOCMEM},
                       "t": {"BACKEND": TIERED, "OPTIONS": options}}
    found = [m.msg for m in check_tiered_caches() if m.id == "djcachebench.E105"]
    assert len(found) == 1 and "is not a djcachebench generation table" in found[0]
    cache = build(options)
    cache.set("k", "v")
    assert [cache.get("k") for _ in range(3)] == ["v"] * 3
    assert cache.stats()["l1_hits"] == 0 and cache.stats()["coherence_faults"] >= 1
    assert foreign.read_bytes() == b"not a table" * 100


def test_checks_report_each_problem_with_its_id(settings: Any, tmp_path: Path) -> None:
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "missing": {"BACKEND": TIERED, "OPTIONS": {"L2": "nope"}},
        "badopt": {"BACKEND": TIERED, "OPTIONS": {"L2": "default", "L1_TIMEOUT": "5"}},
        "conflict": {"BACKEND": TIERED, "VERSION": 9, "OPTIONS": {"L2": "default"}},
        "local": {"BACKEND": TIERED, "OPTIONS": {"L2": "default"}},
        "fine": {"BACKEND": TIERED, "OPTIONS": {"L2": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(tmp_path)}}},
    }
    found = {e.obj: e.id for e in check_tiered_caches()}
    assert found == {
        "CACHES['missing']": "djcachebench.E102",
        "CACHES['badopt']": "djcachebench.E101",
        "CACHES['conflict']": "djcachebench.E104",
        "CACHES['local']": "djcachebench.W101",
    }


# -- Django's own settings (TIMEOUT, MAX_ENTRIES, CULL_FREQUENCY) ----------------------


def test_alias_form_timeout_string_of_the_l2_applies(settings: Any, tmp_path: Path) -> None:
    """``TIMEOUT: "1"`` (as Django's CacheMiddlewareTest writes it) on the L2 alias:
    values read through the tiered alias live one second."""
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "disk": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "disk"), "TIMEOUT": "1"},
        "tiered": {"BACKEND": TIERED, "TIMEOUT": "1", "OPTIONS": {"L2": "disk"}},
    }
    c = caches["tiered"]
    assert c.default_timeout == 1
    c.set("k", "v")
    assert c.get("k") == "v"
    time.sleep(1.2)
    assert c.get("k") is None
    assert [e for e in check_tiered_caches() if e.level >= 40] == []


@pytest.mark.parametrize("params", [{"TIMEOUT": "300"}, {"timeout": 300.0},
                                    {"timeout": "300", "TIMEOUT": 5}])
def test_alias_form_same_timeout_written_another_way_is_no_conflict(
    settings: Any, tmp_path: Path, params: dict[str, Any]
) -> None:
    settings.CACHES = {"default": {"BACKEND": LOCMEM},
                       "l2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path)}}
    c = build({"L2": "l2", "GENERATION_PATH": gen(tmp_path)}, **params)
    assert c.default_timeout == 300


def test_alias_form_legacy_keys_follow_djangos_precedence(
    settings: Any, tmp_path: Path
) -> None:
    """Django reads ``timeout`` before ``TIMEOUT``: that is the value compared with the L2's."""
    settings.CACHES = {"default": {"BACKEND": LOCMEM},
                       "l2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path), "timeout": 30,
                              "TIMEOUT": 300}}
    c = build({"L2": "l2", "GENERATION_PATH": gen(tmp_path)}, TIMEOUT="30")
    assert c.default_timeout == 30
    with pytest.raises(ImproperlyConfigured, match=r"\['timeout'\] = 300 differs from "
                                                   r"CACHES\['l2'\]\['timeout'\] = 30"):
        build({"L2": "l2"}, timeout=300, TIMEOUT=30)
    with pytest.raises(ImproperlyConfigured, match=r"\['max_entries'\] = '10' is invalid with an "
                                                   r"L2 alias; set CACHES\['l2'\]\['OPTIONS'\]"):
        build({"L2": "l2"}, max_entries="10")


@pytest.mark.parametrize("key", ["TIMEOUT", "timeout"])
def test_timeout_django_would_replace_is_refused(
    locmem_l2: Any, tmp_path: Path, key: str
) -> None:
    """Django's BaseCache would quietly use 300 for ``"abc"``; the tiered alias says so."""
    with pytest.raises(ImproperlyConfigured, match=rf"\[{key!r}\] = 'abc' is invalid; "
                                                   r"allowed: a number of seconds"):
        build({"L2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path)}}, **{key: "abc"})
    locmem_l2["bad"] = {"BACKEND": TIERED, key: "abc", "OPTIONS": {"L2": "l2"}}
    found = {e.obj: e.id for e in check_tiered_caches()}
    assert found["CACHES['bad']"] == "djcachebench.E101"


def test_inline_form_passes_legacy_keys_and_numeric_strings_through(tmp_path: Path) -> None:
    """``max_entries`` / ``cull_frequency`` / ``timeout`` next to ``BACKEND`` reach the
    inline L2 and mean there what they mean to Django (they used to be dropped)."""
    c = build({"L2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path)},
               "GENERATION_PATH": gen(tmp_path)},
              max_entries="7", cull_frequency="2", timeout="11", TIMEOUT=99)
    l2 = c.l2
    assert (l2.default_timeout, l2._max_entries, l2._cull_frequency) == (11, 7, 2)
    assert (c.default_timeout, c._max_entries, c._cull_frequency) == (11, 7, 2)


def test_inline_l2_dict_may_use_the_legacy_keys(tmp_path: Path) -> None:
    c = build({"L2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path), "timeout": 5,
                      "max_entries": 9}, "GENERATION_PATH": gen(tmp_path)}, TIMEOUT="5")
    assert (c.l2.default_timeout, c.l2._max_entries) == (5, 9)


def test_inline_form_compares_values_as_django_reads_them(tmp_path: Path) -> None:
    c = build({"L2": {"BACKEND": LOCMEM, "LOCATION": str(tmp_path), "TIMEOUT": 11,
                      "OPTIONS": {"MAX_ENTRIES": 7}},
               "MAX_ENTRIES": "7", "GENERATION_PATH": gen(tmp_path)}, TIMEOUT="11")
    assert (c.l2.default_timeout, c.l2._max_entries) == (11, 7)
    with pytest.raises(ImproperlyConfigured, match=r"\['L2'\]\['OPTIONS'\]\['MAX_ENTRIES'\] = 5 "
                                                   r"conflicts with '6'"):
        build({"L2": {"BACKEND": LOCMEM, "OPTIONS": {"MAX_ENTRIES": 5}}}, max_entries="6")


def test_inline_sqlite_l2_with_timeout_string(tmp_path: Path) -> None:
    """The tiered alias's ``TIMEOUT: "1"`` reaches a ShardedSQLiteCache L2 as Django's 1 s."""
    c = build({"L2": {"BACKEND": SQLITE, "LOCATION": str(tmp_path / "sqlite")}}, TIMEOUT="1")
    c.set("k", "v")
    assert c.get("k") == "v"
    time.sleep(1.2)
    assert c.get("k") is None


def test_a_timeout_past_any_float_is_the_l2s_to_judge(tmp_path: Path,
                                                      memcached_server: Any) -> None:
    """Over memcached, ``timeout=10**400`` must not raise OverflowError from
    TieredCache (an L1 expiry taking ``float()`` of it) where PyLibMCCache takes
    it. memcached then keeps nothing (past 30 days a timeout is a Unix time, in
    32 bits): nor may the writer's L1, or it would serve a value no other process
    can read."""
    options = {"L2": {"BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
                      "LOCATION": memcached_server.location},
               "GENERATION_PATH": str(tmp_path / "g.mmap")}
    cache = build(options)
    other = build({**options, "L1_MAX_ENTRIES": 999})  # another L1: another process
    for n, timeout in enumerate((10**400, 10**12, 2**31, 3600)):
        cache.set(f"t{n}", "v", timeout=timeout)
        assert cache.get(f"t{n}") == other.get(f"t{n}"), timeout
    assert cache.get("t3") == "v"


@pytest.mark.parametrize("call", ["set", "add", "touch", "set_many"])
def test_a_timeout_that_is_not_a_number_is_refused_as_django_refuses_it(
        tmp_path: Any, call: str) -> None:
    """``timeout="abc"`` raises TypeError, as Django's backends do, not float()'s
    ValueError."""
    from django.core.cache.backends.locmem import LocMemCache

    tiered = locmem_tiered(tmp_path)
    plain = LocMemCache("plain-timeout-check", {})
    for cache in (plain, tiered):
        cache.set("k", "v")
        args = {"set": ("k", "v", "abc"), "add": ("new", "v", "abc"),
                "touch": ("k", "abc"), "set_many": ({"k": "v"}, "abc")}[call]
        with pytest.raises(TypeError):
            getattr(cache, call)(*args)
    assert tiered.get("k") == "v"


def test_with_coherence_none_two_configurations_over_one_l2_see_each_others_writes(
        tmp_path: Any) -> None:
    """With ``COHERENCE="none"`` two aliases over one L2 in one process share a
    table: with a private table each, each would serve the value the other's
    write replaced until L1_TIMEOUT, and the setting promises that a process
    sees its own writes at once."""
    one = locmem_tiered(tmp_path, COHERENCE="none")
    two = locmem_tiered(tmp_path, COHERENCE="none", L1_MAX_ENTRIES=500)  # another L1
    one.set("k", "v1")
    assert two.get("k") == "v1"
    assert two.get("k") == "v1"  # kept in two's L1
    one.set("k", "v2")
    assert two.get("k") == "v2"
    one.delete("k")
    assert two.get("k") is None


@pytest.mark.parametrize("name", ["L1_MAX_ENTRIES", "COHERENCE", "STAMPEDE_LEASE"])
def test_an_option_beside_backend_is_an_error_not_ignored(
        locmem_l2: Any, name: str) -> None:
    """L1_MAX_ENTRIES=5 next to BACKEND (not under OPTIONS) is refused, not run
    with the default of 10,000, silently."""
    with pytest.raises(ImproperlyConfigured,
                       match=rf"\[{name!r}\] is not read by TieredCache; put it in "
                             rf".*\['OPTIONS'\]\[{name!r}\]"):
        build({"L2": "l2"}, **{name: 5})


@pytest.mark.parametrize(("options", "params", "where"), [
    ({"MAX_ENTRIES": "abc"}, {}, r"\['OPTIONS'\]\['MAX_ENTRIES'\] = 'abc'"),
    ({"CULL_FREQUENCY": "x"}, {}, r"\['OPTIONS'\]\['CULL_FREQUENCY'\] = 'x'"),
    ({}, {"max_entries": "abc"}, r"\['max_entries'\] = 'abc'"),
    ({"L2": {"BACKEND": LOCMEM, "TIMEOUT": "abc"}}, {}, r"\['L2'\]\['TIMEOUT'\] = 'abc'"),
    ({"L2": {"BACKEND": LOCMEM, "OPTIONS": {"MAX_ENTRIES": "many"}}}, {},
     r"\['L2'\]\['OPTIONS'\]\['MAX_ENTRIES'\] = 'many'"),
])
def test_a_setting_an_inline_l2_would_replace_by_a_guess_is_refused(
        options: dict[str, Any], params: dict[str, Any], where: str) -> None:
    """Like TIMEOUT='abc', these are refused, not replaced by Django's defaults
    (300, 3) in the L2 without a word."""
    with pytest.raises(ImproperlyConfigured, match=where + " is invalid; allowed: "):
        build({"L2": {"BACKEND": LOCMEM}, **options}, **params)


@pytest.mark.parametrize("backend", ["os.path", "builtins.dict"])
def test_an_inline_l2_backend_that_is_not_a_cache(backend: str) -> None:
    """Named as not a Django cache, not a TypeError from inside the class."""
    with pytest.raises(ImproperlyConfigured,
                       match=rf"\['L2'\]\['BACKEND'\] = '{backend}' is not a Django cache"):
        build({"L2": {"BACKEND": backend}})


@pytest.mark.parametrize(("value", "says"), [
    (5, "is invalid"), ("no.such.func", "cannot be imported"), ("os", "cannot be imported"),
])
def test_a_key_function_that_cannot_be_had(tmp_path: Path, value: Any, says: str) -> None:
    """These backends name the setting, where Django's get_key_func raises a bare
    AttributeError / ImportError (LocMemCache raises those too)."""
    from djcachebench.backends.sqlite import ShardedSQLiteCache

    for make in (lambda: ShardedSQLiteCache(str(tmp_path / "s"), {"KEY_FUNCTION": value}),
                 lambda: build({"L2": {"BACKEND": LOCMEM}}, KEY_FUNCTION=value),
                 lambda: build({"L2": {"BACKEND": LOCMEM, "KEY_FUNCTION": value}})):
        with pytest.raises(ImproperlyConfigured, match=rf"\['KEY_FUNCTION'\] = .*{says}"):
            make()


def test_a_relative_generation_path_is_made_absolute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cache = build({"L2": {"BACKEND": LOCMEM}, "GENERATION_PATH": "g.mmap"})
    assert cache._config.generation_path == str(tmp_path / "g.mmap")
    with pytest.raises(ImproperlyConfigured, match=r"\['GENERATION_PATH'\] = .* is invalid"):
        build({"L2": {"BACKEND": LOCMEM}, "GENERATION_PATH": "g\x00"})


def test_errors_of_an_inline_l2_name_its_path(settings: Any, tmp_path: Path) -> None:
    """A bad option of an L2 written inline in ``OPTIONS["L2"]`` is reported at
    its own path, not as ``CACHES[<alias>]['OPTIONS'][...]``, and a missing
    LOCATION as the inline L2's, not the tiered alias's own (which has none)."""
    settings.CACHES = {
        "default": {"BACKEND": LOCMEM},
        "t1": {"BACKEND": TIERED, "OPTIONS": {"L2": {"BACKEND": SQLITE}}},
        "t2": {"BACKEND": TIERED, "OPTIONS": {"L2": {
            "BACKEND": SQLITE, "LOCATION": str(tmp_path / "c"),
            "OPTIONS": {"SERIALIZER": ""}}}},
    }
    with pytest.raises(ImproperlyConfigured, match=r"^CACHES\['t1'\]\['OPTIONS'\]\['L2'\]"
                                                   r"\['LOCATION'\]"):
        caches.create_connection("t1")
    with pytest.raises(ImproperlyConfigured, match=r"^CACHES\['t2'\]\['OPTIONS'\]\['L2'\]"
                                                   r"\['OPTIONS'\]\['SERIALIZER'\] = ''"):
        caches.create_connection("t2")
