"""Real memcached and redis-server instances on free loopback ports.

This module is the one place in the project that starts servers: the
benchmark harness and the test suite (``tests/conftest.py``) both use it, so
every instance is started, probed and stopped the same way.

Why each choice:

* **Loopback only.** The host is fixed to ``127.0.0.1`` and checked: nothing
  here may ever listen on or talk to another address.
* **Free port from the kernel** (bind to port 0, read the port, close). Another
  process may grab it between our close and the server's bind, so a server
  that exits at once is retried on a new port a few times. And the answer to
  the ping must be our own server's: another process that took the port
  answers too, while ours is exiting on "address in use". So a start counts
  only when our process still runs and the listening socket on that port is
  one of its open files (:func:`owns_port`, Linux ``/proc``); otherwise it is
  retried on a new port.
* **Ready means a real protocol answer** (memcached ``version``, redis
  ``PING``), not "the port accepts connections": a server can accept before
  it serves. Waiting is bounded; a server that never answers is an error.
* **Stopped by PID**: terminate, wait, then kill (paused and resumed by PID
  too: SIGSTOP/SIGCONT make a hung server for outage measurements). Never by process name, which
  would hit other users' servers on a shared machine.
* **Clear errors.** :class:`ServerUnavailable` says what failed and how to fix
  it; its subclass :class:`ServerNotInstalled` means "the binary is absent", so
  callers can treat that one case as a skip and every other failure as a bug.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from djcachebench.bench.orphans import preexec
from djcachebench.bench.signals import deferred_signals

__all__ = [
    "MemcachedServer",
    "RedisServer",
    "ServerNotInstalled",
    "ServerUnavailable",
    "find_binary",
    "free_port",
]

LOOPBACK = "127.0.0.1"
# Debian puts both binaries in /usr/bin, but a PATH stripped by sudo or cron may
# not include it, and /usr/local/bin is where a source build lands.
_EXTRA_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin")


class ServerUnavailable(RuntimeError):
    """A server could not be started or did not answer; the message says why."""


class ServerNotInstalled(ServerUnavailable):
    """The server's binary is not on this machine."""


def find_binary(name: str) -> str | None:
    """Return the path of executable ``name`` (PATH first, then the usual dirs)."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and Path(name).is_file() else None
    found = shutil.which(name)
    if found:
        return found
    for directory in _EXTRA_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def free_port(host: str = LOOPBACK) -> int:
    """Ask the kernel for a currently free TCP port on ``host``."""
    _check_loopback(host)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _check_loopback(host: str) -> None:
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"refusing non-loopback address {host!r}: servers bind to loopback only")


class LoopbackServer:
    """A server process on a free loopback port; a context manager.

    Subclasses give the binary name, the command line and the ping exchange.
    ``start()`` returns only once the server answered a real request, and
    ``stop()`` is idempotent and safe to call from ``finally``.
    """

    #: Executable name looked up on PATH.
    binary_name: str = ""
    #: Debian package that provides it, for the error message.
    package: str = ""
    #: Bytes sent to check the server is serving, and the prefix of a good answer.
    ping_request: bytes = b""
    ping_reply: bytes = b""

    def __init__(
        self,
        binary: str | None = None,
        *,
        start_timeout: float = 10.0,
        extra_args: tuple[str, ...] = (),
        attempts: int = 3,
    ) -> None:
        self.binary = binary or self.binary_name
        self.host = LOOPBACK
        self.port = 0
        self.start_timeout = start_timeout
        self.extra_args = extra_args
        self.attempts = attempts
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    # -- what subclasses define ------------------------------------------------
    def command(self, binary: str, port: int, workdir: str) -> list[str]:
        raise NotImplementedError

    @property
    def location(self) -> str:
        """The Django ``LOCATION`` string for a cache on this server."""
        raise NotImplementedError

    # -- life cycle --------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> LoopbackServer:
        """Start the server and wait until it answers; raise ServerUnavailable if not."""
        if self.process is not None:
            return self
        path = find_binary(self.binary)
        if path is None:
            raise ServerNotInstalled(
                f"{self.binary} not found on PATH: apt-get install {self.package}"
            )
        self._workdir = tempfile.TemporaryDirectory(prefix=f"djcb-{self.binary_name}-")
        last_error = ""
        try:
            for _ in range(max(1, self.attempts)):
                self.port = free_port(self.host)
                error = self._start_once(path)
                if error is None:
                    return self
                last_error = error
                if "did not answer" in error:
                    break  # a hung server will hang again; retrying only wastes time
        except BaseException:
            self.stop()
            raise
        self.stop()
        raise ServerUnavailable(last_error)

    def _start_once(self, path: str) -> str | None:
        """One try on ``self.port``: None when serving, else the reason it is not."""
        assert self._workdir is not None
        log_path = Path(self._workdir.name) / f"{self.binary_name}-{self.port}.log"
        argv = self.command(path, self.port, self._workdir.name) + list(self.extra_args)
        with open(log_path, "wb") as log:
            try:
                self.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self._workdir.name,
                    preexec_fn=preexec(),  # dies with the harness, even a SIGKILLed one
                )
            except OSError as exc:
                self.process = None
                return f"{self.binary_name} could not be executed ({path}): {exc}"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                self.process = None
                return (
                    f"{self.binary_name} exited with code {code} on start "
                    f"({' '.join(argv)}): {_tail(log_path)}"
                )
            if self.ping():
                if self.process.poll() is None and owns_port(self.process.pid, self.port):
                    return None
                # Someone else's server answered on the port ours should have had.
                self._terminate()
                return (
                    f"{self.binary_name}: another process answered on {self.host}:{self.port} "
                    f"({' '.join(argv)}): {_tail(log_path)}"
                )
            time.sleep(0.02)
        self._terminate()
        return (
            f"{self.binary_name} did not answer on {self.host}:{self.port} within "
            f"{self.start_timeout:g}s ({' '.join(argv)}): {_tail(log_path)}"
        )

    def ping(self, timeout: float = 0.5) -> bool:
        """True when the server answers its protocol's ping."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
                sock.sendall(self.ping_request)
                reply = b""
                while len(reply) < len(self.ping_reply):
                    chunk = sock.recv(256)
                    if not chunk:
                        break
                    reply += chunk
                return reply.startswith(self.ping_reply)
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process by PID (terminate, then kill) and remove its work dir.

        With SIGINT/SIGTERM held (signals.py): a second Ctrl-C must not leave
        the server running or its directory behind.
        """
        with deferred_signals():
            self._terminate(timeout)
            if self._workdir is not None:
                self._workdir.cleanup()
                self._workdir = None

    def pause(self) -> None:
        """Stop the process (SIGSTOP): it keeps its port and connections and answers
        nothing, as a hung server does (an outage that a refused connection is not)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Continue the process (SIGCONT); harmless when it was not paused."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def _terminate(self, timeout: float = 5.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        # A paused server would hold SIGTERM until continued: the wait below
        # would end in SIGKILL, which leaves redis no chance to close cleanly.
        process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.process is not None else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state}>"

    def __del__(self) -> None:
        # Last resort only: callers stop servers explicitly in finally blocks.
        with contextlib.suppress(Exception):
            self._terminate(1.0)
        with contextlib.suppress(Exception):
            if self._workdir is not None:
                self._workdir.cleanup()


class MemcachedServer(LoopbackServer):
    """``memcached`` on a free loopback port (TCP only, :attr:`memory_mb` of item memory).

    Why 1 GiB and not memcached's 64 MiB default: a production memcached is
    sized to hold its working set, and the benchmark's scenarios hold up to
    ~70 MB (``html-pages``: 1,100 pages of 50-70 KB). At 64 MiB memcached
    evicts keys that the other backends keep, and once its slabs are full it
    answers some sets of large items ``SERVER_ERROR out of memory`` (its
    ``outofmemory`` item stat); libmemcached then disables the server in that
    client for ``retry_timeout`` seconds, so every call in the process raises
    ``pylibmc.ServerDown``. memcached allocates item memory as items arrive
    (no ``-L``), so the larger bound costs nothing until it is used.
    """

    binary_name = "memcached"
    package = "memcached"
    ping_request = b"version\r\n"
    ping_reply = b"VERSION "
    #: Item memory (``-m``), the bound of what the server holds before it evicts.
    memory_mb = 1024

    def command(self, binary: str, port: int, workdir: str) -> list[str]:
        argv = [binary, "-l", self.host, "-p", str(port), "-U", "0", "-m", str(self.memory_mb)]
        # memcached refuses to run as root unless told which user to be.
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv += ["-u", "root"]
        return argv

    @property
    def location(self) -> str:
        return f"{self.host}:{self.port}"

    def flush(self, timeout: float = 5.0) -> None:
        """Drop every item (``flush_all``)."""
        _exchange(self.host, self.port, b"flush_all\r\n", b"OK", timeout)


class RedisServer(LoopbackServer):
    """``redis-server`` on a free loopback port, persistence off."""

    binary_name = "redis-server"
    package = "redis-server"
    ping_request = b"PING\r\n"
    ping_reply = b"+PONG"

    def command(self, binary: str, port: int, workdir: str) -> list[str]:
        return [
            binary,
            "--port", str(port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "no",
            "--dir", workdir,
            "--daemonize", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip

    @property
    def location(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def flush(self, timeout: float = 5.0) -> None:
        """Drop every key of every database (``FLUSHALL``)."""
        _exchange(self.host, self.port, b"FLUSHALL\r\n", b"+OK", timeout)


def owns_port(pid: int, port: int, host: str = LOOPBACK) -> bool:
    """Whether process ``pid`` holds the socket listening on ``host:port``.

    Reads the kernel's TCP table (``/proc/net/tcp``) for the listening socket's
    inode and looks for it among the process's open files (``/proc/PID/fd``).
    A process that has gone owns nothing, and a descriptor that closes while
    the list is read is skipped: a server that fails to bind closes its files
    as it exits, and taking that moment for "cannot tell" would hand another
    process's port to us. Only where /proc cannot be read at all (not Linux)
    is the answer True: the caller has already checked that the process is alive.
    """
    try:
        inodes = _listening_inodes(host, port)
    except OSError:
        return True  # no TCP table to read: cannot tell
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return not os.path.isdir("/proc/self/fd")  # the process has gone, or no /proc
    except OSError:
        return True
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed since the directory was listed
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _listening_inodes(host: str, port: int) -> set[str]:
    """Inodes of the sockets listening on ``host:port`` (state 0A in /proc/net/tcp)."""
    address = "".join(f"{int(part):02X}" for part in reversed(host.split(".")))
    wanted = f"{address}:{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as table:
        next(table, None)
        for line in table:
            fields = line.split()
            if len(fields) > 9 and fields[1] == wanted and fields[3] == "0A":
                inodes.add(fields[9])
    return inodes


def _exchange(host: str, port: int, request: bytes, expect: bytes, timeout: float = 5.0) -> None:
    _check_loopback(host)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        reply = sock.recv(256)
    if not reply.startswith(expect):
        raise ServerUnavailable(f"{host}:{port} answered {reply!r} to {request!r}")


def _tail(path: Path, limit: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    if not text:
        return "(no output)"
    return text[-limit:].replace("\n", " | ")
