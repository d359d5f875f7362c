"""Servers are our own, a dead worker is noticed at once, and clean-up survives signals.

Real memcached, redis-server and gunicorn processes on loopback; the
"foreign" server is a real socket server on 127.0.0.1 that answers
memcached's ping, as another user's memcached would.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from djcachebench.bench import servers
from djcachebench.bench.servers import MemcachedServer, RedisServer, ServerNotInstalled

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def foreign_memcached() -> Iterator[int]:
    """A loopback listener that answers ``version`` like memcached, and is not ours."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(256)
                    conn.sendall(b"VERSION 1.6.0-foreign\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_port_answered_by_another_process_is_not_taken_for_ours(
    foreign_memcached: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # free_port's race, forced: the first port handed out is the foreign one.
    ports = iter([foreign_memcached])
    real_free_port = servers.free_port
    monkeypatch.setattr(servers, "free_port", lambda host="127.0.0.1": next(ports, None)
                        or real_free_port(host))  # fmt: skip
    server = MemcachedServer()
    try:
        server.start()
    except ServerNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        assert server.port != foreign_memcached
        assert server.process is not None and server.process.poll() is None
        assert servers.owns_port(server.process.pid, server.port)
    finally:
        server.stop()


def test_owns_port_tells_our_listener_from_another() -> None:
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        ours.listen(1)
        port = ours.getsockname()[1]
        assert servers.owns_port(os.getpid(), port)
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not servers.owns_port(sleeper.pid, port)
        finally:
            sleeper.kill()
            sleeper.wait()


def test_owns_port_is_false_for_a_process_that_has_gone() -> None:
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        ours.listen(1)
        port = ours.getsockname()[1]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert not servers.owns_port(gone.pid, port)


def test_a_descriptor_closing_while_listed_is_not_taken_for_ownership(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A server that fails to bind closes its files as it exits; one of them
    # vanishing between listdir and readlink must not answer "ours".
    with socket.socket() as ours:
        ours.bind(("127.0.0.1", 0))
        ours.listen(1)
        port = ours.getsockname()[1]
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        real_readlink = os.readlink

        def vanishing(path: str, *args: Any, **kwargs: Any) -> str:
            if path == f"/proc/{sleeper.pid}/fd/0":
                raise FileNotFoundError(path)
            return real_readlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "readlink", vanishing)
        try:
            assert not servers.owns_port(sleeper.pid, port)
            assert servers.owns_port(os.getpid(), port)
        finally:
            sleeper.kill()
            sleeper.wait()


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raising KeyboardInterrupt, as in a run started from a terminal. A test
    runner started in the background by a non-interactive shell inherits SIGINT
    ignored, and Python then leaves it ignored: the signal these tests send would
    never arrive, whatever the code under test does with it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class InterruptedStopRedis(RedisServer):
    """A redis whose stop is hit by a Ctrl-C in the middle (a second signal), once."""

    interrupts = 1

    def _terminate(self, timeout: float = 5.0) -> None:
        if self.interrupts:
            self.interrupts -= 1
            os.kill(os.getpid(), signal.SIGINT)
        super()._terminate(timeout)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_a_signal_during_stop_leaves_no_server_nor_directory() -> None:
    server = InterruptedStopRedis()
    try:
        server.start()
    except ServerNotInstalled as exc:
        pytest.skip(str(exc))
    process = server.process
    assert server._workdir is not None and process is not None
    workdir = Path(server._workdir.name)
    with pytest.raises(KeyboardInterrupt):  # delivered once the clean-up is done
        server.stop()
    assert process.poll() is not None
    assert not workdir.exists()


def test_an_interrupted_gunicorn_start_leaves_no_log_nor_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from djcachebench.bench.http.gunicorn import GunicornSite, gunicorn_missing

    if gunicorn_missing():
        pytest.skip(gunicorn_missing() or "")
    started: list[Any] = []

    def interrupted(self: GunicornSite) -> bool:
        started.append((self.process, Path(self._log.name)))
        raise KeyboardInterrupt  # Ctrl-C while gunicorn starts

    monkeypatch.setattr(GunicornSite, "_answers", interrupted)
    site = GunicornSite(tmp_path / "site.json", workers=1)
    with pytest.raises(KeyboardInterrupt), site:
        pass
    ((process, log),) = started
    try:
        assert not log.exists()
        assert process is not None and process.poll() is not None
    finally:
        if process is not None and process.poll() is None:  # the code before left it
            process.kill()
            process.wait()
        log.unlink(missing_ok=True)


CRASH_TARGET = textwrap.dedent('''
    import os, sys
    from django.core.cache.backends.locmem import LocMemCache
    from djcachebench.bench.progress import Progress
    from djcachebench.bench.runner import RunOptions, run_targets
    from djcachebench.bench.targets import Target
    from djcachebench.bench.workload import REFERENCE

    class CrashingCache(LocMemCache):
        """Worker 0 pre-fills (set_many); every other worker dies at its first get."""
        prefilled = False

        def set_many(self, *args, **kwargs):
            type(self).prefilled = True
            return super().set_many(*args, **kwargs)

        def get(self, *args, **kwargs):
            if not type(self).prefilled:
                os._exit(3)
            return super().get(*args, **kwargs)

    if __name__ == "__main__":
        target = Target("crashing", "worker 1 dies", caches=lambda env: {
            "BACKEND": "crash_target.CrashingCache", "LOCATION": "c"})
        scenario = REFERENCE.with_overrides(procs=2, ops=20_000, warmup=10)
        # Generous waits: only the crash may end the target quickly.
        options = RunOptions(scenario=scenario, ready_timeout=3600, timeout=3600)
        results = run_targets([target], options, Progress(live=False))
        print("REASON", results.skipped[0].status, results.skipped[0].reason)
''')


@pytest.mark.slow
def test_a_worker_that_dies_fails_its_target_without_waiting(tmp_path: Path) -> None:
    (tmp_path / "crash_target.py").write_text(CRASH_TARGET)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}"}
    # Its own session, so that a harness that hangs is stopped with its workers.
    proc = subprocess.Popen([sys.executable, str(tmp_path / "crash_target.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the harness waited for a dead worker (no result in 120 s, not seconds)")
    assert "REASON failed worker 1 exited with code 3" in stdout, stdout + stderr


@pytest.mark.usefixtures("ctrl_c_raises")
def test_deferred_signals_deliver_the_held_signal_afterwards() -> None:
    from djcachebench.bench.signals import deferred_signals

    finished = []
    with pytest.raises(KeyboardInterrupt), deferred_signals():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        finished.append(True)
    assert finished == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
