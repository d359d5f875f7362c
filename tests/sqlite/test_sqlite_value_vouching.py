"""Value files trusted by identity: when that is sound, and how processes share it.

A value file's tag costs a hash of the whole file, so a process that verified
a file trusts it afterwards by its identity (inode, size, times), and, since
the fix these tests came with, tells the other processes of the host through
the vouch board (``store/vouch.py``). The first test is the attack that made
identity unsound before: a shared writable mapping of the file, made before
the file was verified, changes its bytes afterwards without changing any of
its times. It failed on the code before the fix (the altered bytes were
returned, and a pickle would have been loaded); the board tests fail there
too, as there was no board.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import pytest

from djcachebench.backends.sqlite import ShardedSQLiteCache
from djcachebench.serializers import TAG_SIZE
from djcachebench.store import values
from djcachebench.store.codec import LARGE_MIN

from .helpers import raw_shard, shard_path

BIG = b"x" * (LARGE_MIN + 10)
VALUES: dict[str, object] = {"raw": BIG, "text": BIG.decode(), "pickled": {"pad": BIG}}


def value_file(cache: ShardedSQLiteCache, key: str) -> Path:
    with raw_shard(shard_path(cache, key)) as conn:
        (name,) = conn.execute("SELECT file FROM cache WHERE key = ?",
                               (cache.make_key(key),)).fetchone()
    return Path(cache._store.shards[cache._store.route(cache.make_key(key))].files.path(name))


def another_process(cache: ShardedSQLiteCache) -> ShardedSQLiteCache:
    """A second cache over the same directory: its own memos, as another process has."""
    return ShardedSQLiteCache(str(cache.location), {})


@pytest.mark.parametrize("kind", list(VALUES))
def test_a_writable_mapping_cannot_change_a_value_file_after_it_verified(
        cache: ShardedSQLiteCache, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "SETTLE_NS", 0)  # even a file old enough to be trusted
    value = VALUES[kind]
    cache.set("k", value)
    path = value_file(cache, "k")
    payload = path.read_bytes()
    at = payload.index(b"x" * 200) + 100  # a byte of the padding, in the same page
    fd = os.open(path, os.O_RDWR)
    mapping = mmap.mmap(fd, 0)
    try:
        mapping[0:1] = mapping[0:1]  # the first write faults in: the file's times change now
        reader = another_process(cache)
        assert reader.get("k") == value
        assert cache.get("k") == value
        mapping[at:at + 1] = b"y"  # the page is writable already: no fault, no new times
        assert path.read_bytes() != payload
        assert reader.get("k", "default") == "default"
        assert cache.get("k", "default") == "default"
        assert another_process(cache).get("k", "default") == "default"
    finally:
        mapping.close()
        os.close(fd)


def test_a_file_verified_in_one_process_is_not_hashed_again_in_another(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    cache.set("k", BIG)
    first, second = another_process(cache), another_process(cache)
    assert first.get("k") == BIG
    assert first.stats()["file_hashes"] == 1
    assert first.get("k") == BIG  # its own memo
    assert first.stats()["file_hashes"] == 1
    assert second.get("k") == BIG
    assert second.stats()["file_hashes"] == 0
    assert second.stats()["file_vouched"] == 1


def test_no_vouch_outlives_a_reboot(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk edited while its host was down (from another machine, or its image)
    can keep a file's identity (a loop-mounted image altered underneath, say):
    board entries are bound to the boot, so after a reboot (another boot id)
    every file is hashed again at its first read, whatever the board says."""
    from djcachebench.store import vouch

    monkeypatch.setattr(values, "SETTLE_NS", 0)
    cache.set("k", BIG)
    assert another_process(cache).get("k") == BIG  # verified and vouched for
    monkeypatch.setattr(vouch, "BOOT_ID", b"another-boot")
    after = another_process(cache)
    assert after.get("k") == BIG
    assert after.stats()["file_vouched"] == 0 and after.stats()["file_hashes"] == 1


def test_the_writer_does_not_vouch_for_its_own_file(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between its write and its look at the file, another writer could have
    changed it within the same tick of the clock: the writer's first read
    hashes, like anyone's."""
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    cache.set("k", BIG)
    assert cache.get("k") == BIG
    assert cache.stats()["file_hashes"] == 1


def vouched_by_another(cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """``k`` set, then read (and so vouched for) by another process."""
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    cache.set("k", BIG)
    reader = another_process(cache)
    assert reader.get("k") == BIG
    assert reader.stats()["file_hashes"] == 1


def test_a_forged_board_vouches_for_nothing(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    vouched_by_another(cache, monkeypatch)
    board = Path(cache.location) / "vouched"
    board.write_bytes(os.urandom(board.stat().st_size))
    reader = another_process(cache)
    assert reader.get("k") == BIG
    assert reader.stats()["file_hashes"] == 1
    assert reader.stats()["file_vouched"] == 0


def test_a_vouched_file_changed_afterwards_is_verified_again(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    vouched_by_another(cache, monkeypatch)
    path = value_file(cache, "k")
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.seek(100)
        f.write(b"y")
    reader = another_process(cache)
    assert reader.get("k", "default") == "default"
    assert reader.stats()["tampered"] == 1


def test_a_file_open_for_writing_is_not_vouched(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """While anyone holds the file open for writing, its bytes may change
    without new times (through a mapping): every reader hashes it."""
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    cache.set("k", BIG)
    fd = os.open(value_file(cache, "k"), os.O_RDWR)
    try:
        first, second = another_process(cache), another_process(cache)
        assert first.get("k") == BIG
        assert first.get("k") == BIG
        assert second.get("k") == BIG
        assert first.stats()["file_hashes"] == 2
        assert second.stats()["file_hashes"] == 1
    finally:
        os.close(fd)
    third = another_process(cache)
    assert third.get("k") == BIG
    assert third.get("k") == BIG
    assert third.stats()["file_hashes"] == 1


def test_where_times_are_coarse_only_a_settled_file_is_vouched(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fine-grained change times a change within the same tick keeps
    the time: a file is vouched for only once its last change is older than
    ``SETTLE_NS``."""
    monkeypatch.setattr(values, "fine_change_times", lambda directory: False)
    cache.set("k", BIG)
    reader = another_process(cache)
    assert reader.get("k") == BIG
    assert reader.get("k") == BIG
    assert reader.stats()["file_hashes"] == 2  # too young
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    assert reader.get("k") == BIG
    assert reader.get("k") == BIG
    assert reader.stats()["file_hashes"] == 3


def test_the_board_unusable_costs_hashes_not_values(
        cache: ShardedSQLiteCache, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    (Path(cache.location) / "vouched").mkdir()  # a directory in its place
    cache.set("k", BIG)
    first, second = another_process(cache), another_process(cache)
    assert first.get("k") == BIG
    assert second.get("k") == BIG
    assert second.stats()["file_hashes"] == 1
    assert second.get("k") == BIG  # its own memo still works
    assert second.stats()["file_hashes"] == 1


def test_a_writer_opening_the_file_during_the_look_does_not_end_the_reader(
        tmp_path: Path) -> None:
    """An ``open`` for writing while the lease is held breaks it, and the kernel
    signals the holder: with the default signal (SIGIO) that ended the reading
    process. Run in a child, so that a regression fails this test instead of
    ending the test run; the writer's open is made inside the look, as the
    narrowest race would."""
    import subprocess
    import sys

    code = f"""
import errno, os
from djcachebench.store import values
path = {str(tmp_path / "value")!r}
with open(path, "wb") as f:
    f.write(b"x" * 100)
fd = os.open(path, os.O_RDONLY)
real, seen = values.identity, []
def writer_meanwhile(info):
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        seen.append("opened")
    except OSError as exc:
        seen.append(errno.errorcode[exc.errno])
    return real(info)
values.identity = writer_meanwhile
print(values.look_alone(fd) is not None, seen)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    # The writer was refused while the lease was held (EWOULDBLOCK is EAGAIN here).
    assert done.stdout.split() in (["True", "['EAGAIN']"], ["True", "['EWOULDBLOCK']"])


@pytest.mark.parametrize("kind", ["raw", "text"])
def test_a_shrunk_size_column_does_not_return_a_prefix_of_a_vouched_file(
        cache: ShardedSQLiteCache, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's ``size`` (not covered by the tag) says how much of the file to
    read, so a file verified whole must not be trusted on its identity for any
    prefix: else whoever can write a shard makes ``get`` return the first bytes
    of a value, sealed by nobody, in the process that verified it and, through
    the vouch board, in every other."""
    monkeypatch.setattr(values, "SETTLE_NS", 0)
    value = VALUES[kind]
    cache.set("k", value)
    assert cache.get("k") == value  # verified; remembered here and on the board
    with raw_shard(shard_path(cache, "k")) as conn:
        conn.execute("UPDATE cache SET size = ? WHERE key = ?",
                     (TAG_SIZE + 5, cache.make_key("k")))
    assert cache.get("k", "miss") in (value, "miss")
    assert another_process(cache).get("k", "miss") in (value, "miss")
    assert cache.get_many(["k"]).get("k", "miss") in (value, "miss")


def _descriptors_on(path: Path) -> int:
    """Descriptors of this process open on the file at ``path``, by identity: the
    one that created it may show the temporary name it was linked from."""
    st = os.stat(path)
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            other = os.stat(f"/proc/self/fd/{fd}")
            found += (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_instances_share_one_descriptor_of_the_board(cache_dir: Path) -> None:
    """Instances (Django builds one per thread) share one descriptor of the board:
    one per instance, never closed, grows with the instances until, at the
    open-file limit, every large value reads as a miss."""
    import gc

    writer = ShardedSQLiteCache(str(cache_dir), {})
    writer.set("big", b"x" * (LARGE_MIN + 1))
    for _ in range(50):
        reader = ShardedSQLiteCache(str(cache_dir), {})
        assert reader.get("big") == b"x" * (LARGE_MIN + 1)
        reader.close()
        del reader
    gc.collect()
    assert _descriptors_on(cache_dir / "vouched") == 1
