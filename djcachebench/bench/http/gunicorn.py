"""The demo site under gunicorn on a free loopback port, started and stopped by PID."""

from __future__ import annotations

import functools
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from djcachebench.bench.orphans import preexec
from djcachebench.bench.servers import (
    LOOPBACK,
    ServerNotInstalled,
    ServerUnavailable,
    free_port,
    owns_port,
)
from djcachebench.bench.signals import deferred_signals

APP = "djcachebench.bench.http.wsgi:application"


def gunicorn_missing() -> str | None:
    """Why gunicorn cannot run here, or None."""
    try:
        import gunicorn  # noqa: F401
    except ImportError:
        return "gunicorn is not installed (pip install 'djcachebench[bench]')"
    return None


@functools.cache
def control_socket_args() -> tuple[str, ...]:
    """``--no-control-socket`` where this gunicorn has a control socket (version 24 on).

    Why: its default socket is ``~/.gunicorn/gunicorn.ctl``, one path for every
    gunicorn the user runs: it leaves that directory in the user's home, and two
    concurrent runs would share the socket. The harness stops its servers by
    PID and needs no control interface. Older versions have neither the socket nor the flag.
    """
    try:
        done = subprocess.run([sys.executable, "-m", "gunicorn", "--help"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ()
    return ("--no-control-socket",) if "--no-control-socket" in done.stdout else ()


class GunicornSite:
    """``gunicorn`` serving the demo site with the settings file ``config``.

    ``threads`` > 1 selects the ``gthread`` worker (each worker serves that many
    requests at once); else the ``sync`` worker, gunicorn's default and the
    common production setting behind a proxy.
    """

    def __init__(self, config: Path, workers: int, threads: int = 1,
                 start_timeout: float = 30.0, attempts: int = 3) -> None:
        self.config = config
        self.workers = workers
        self.threads = threads
        self.start_timeout = start_timeout
        self.attempts = attempts
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        #: gunicorn's output, made by start() and removed by stop().
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> GunicornSite:
        """Start gunicorn and wait until it answers; on any failure, stop it and raise.

        Everything start() made is undone when it fails (a KeyboardInterrupt
        too): ``with GunicornSite(...)`` never calls ``__exit__`` when
        ``__enter__`` raises, so the log file and the process were left behind.
        A port that answers for another process (free_port's race) is retried
        on a new port.
        """
        reason = gunicorn_missing()
        if reason:
            raise ServerNotInstalled(reason)
        try:
            for attempt in range(max(1, self.attempts)):
                if self._start_once():
                    return self
                self._stop_process()
                if attempt + 1 == max(1, self.attempts):
                    raise ServerUnavailable(
                        f"gunicorn: another process answered on port {self.port}, "
                        f"{self.attempts} times")
        except BaseException:
            self.stop()
            raise
        raise AssertionError("unreachable")

    def _start_once(self) -> bool:
        """One try on a new port: True when our gunicorn answers, False when another did."""
        if self._log is None:
            self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
                prefix="djcb-gunicorn-", suffix=".log", delete=False)
        self.port = free_port()
        cmd = [sys.executable, "-m", "gunicorn", "--bind", f"{LOOPBACK}:{self.port}",
               "--workers", str(self.workers), "--backlog", "2048", "--timeout", "120",
               "--log-level", "warning", "--error-logfile", "-", *control_socket_args()]
        if self.threads > 1:
            cmd += ["--worker-class", "gthread", "--threads", str(self.threads)]
        cmd.append(APP)
        env = {**os.environ, "DJCB_HTTP_CONFIG": str(self.config),
               "DJANGO_SETTINGS_MODULE": "djcachebench.bench.http.site_settings"}
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=self._log,
                                        start_new_session=True, preexec_fn=preexec())
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerUnavailable(f"gunicorn exited ({self.process.returncode}): "
                                        f"{self.log_tail()}")
            if self._answers():
                return self.process.poll() is None and owns_port(self.process.pid, self.port)
            time.sleep(0.05)
        raise ServerUnavailable(f"gunicorn did not answer within {self.start_timeout:.0f} s: "
                                f"{self.log_tail()}")

    def _answers(self) -> bool:
        """Every worker imports Django lazily: ask a few times so most are warm."""
        try:
            conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
            conn.request("GET", "/ping")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def log_tail(self, limit: int = 600) -> str:
        if self._log is None:
            return ""
        try:
            return Path(self._log.name).read_text(errors="replace")[-limit:].strip()
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gunicorn and remove its log, with SIGINT/SIGTERM held (signals.py)."""
        with deferred_signals():
            self._stop_process(timeout)
            log, self._log = self._log, None
            if log is not None:
                log.close()
                Path(log.name).unlink(missing_ok=True)

    def _stop_process(self, timeout: float = 10.0) -> None:
        """SIGTERM the master (it stops its workers), SIGKILL the group if it lingers."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def __enter__(self) -> GunicornSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
