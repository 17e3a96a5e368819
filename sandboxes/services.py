"""Warm compile services: one long-lived process per language and sandbox that does a compile step in place of a
fresh compiler per program (Java's javac in-process spends most of a verdict starting cold and little warm:
benchmarks/verdicts.py measures it).

Host side. A language offers one through `Language.service_argv` and marks the compile step it replaces
(`Step.service`). The service runs in a bubblewrap jail of its own (no network, own pid namespace, the host's root
read-only, a private /tmp, a uid no program has) and only ever reads source text and writes class files to its
/tmp; nothing of a candidate's runs in it (javac runs no annotation processor). Per program the host connects to
its socket and hands the connection to the jailed worker with the program's fds; the program's supervisor
(_jail_native.py) sends the files, writes back what the service made and closes the connection before any later
step. A service that is down, or goes down before it answers, costs nothing but speed: the step then runs itself,
so a verdict is the same with or without it (tests/test_lang_java.py checks the class files are identical).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

log = logging.getLogger("sandboxes.services")

START_TIMEOUT_S = 60.0  # a first start builds the language's prepared parts (CDS archives) before it listens


class Services:
    """The running services of one sandbox, started on a program's first need and stopped with the sandbox."""

    def __init__(self, jail_prefix, uid: int | None):
        self._jail_prefix = jail_prefix  # rw dir -> the jail's command line up to the command
        self._uid = uid
        self._lock = threading.Lock()
        self._running: dict[str, tuple[subprocess.Popen, str, str]] = {}  # language -> (process, socket, dir)
        self._broken: dict[str, str] = {}  # language -> why it could not start (not tried again)
        self._closed = False

    def connect(self, program) -> int | None:
        """A connected socket's fd for the program's served step, or None (no such step, or no service up)."""
        name = next((s.service for s in getattr(program, "steps", ()) if s.service), "")
        if not name:
            return None
        for _ in range(2):  # a service halted by an earlier program's limit is started again once
            path = self._socket(name)
            if path is None:
                return None
            deadline = time.monotonic() + 2.0  # its socket file exists from bind(), a moment before listen()
            while True:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(path)
                    return sock.detach()
                except OSError:
                    sock.close()
                if not self._alive(name) or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            self._stop(name)
        return None

    def _alive(self, name: str) -> bool:
        with self._lock:
            run = self._running.get(name)
            return run is not None and run[0].poll() is None

    def _socket(self, name: str) -> str | None:
        with self._lock:
            if self._closed or name in self._broken:
                return None
            run = self._running.get(name)
            if run is not None and run[0].poll() is None:
                return run[1]
            if run is not None:
                self._running.pop(name)
                shutil.rmtree(run[2], ignore_errors=True)
            try:
                self._running[name] = self._start(name)
            except (OSError, ValueError, RuntimeError) as e:
                self._broken[name] = str(e)
                log.warning("sandbox: no warm %s compile service (%s); its compile steps run one by one", name, e)
                return None
            return self._running[name][1]

    def _start(self, name: str) -> tuple[subprocess.Popen, str, str]:
        from .languages import language
        from .toolchains import prepared

        lang = language(name)
        prep = prepared(lang)
        where = tempfile.mkdtemp(prefix=f"fixlab-{name}-service-")
        path = os.path.join(where, "socket")
        if self._uid is not None:
            os.chown(where, self._uid, self._uid)
        argv = lang.service_argv(prep, path)
        if not argv:
            raise ValueError(f"{name} has no compile service")
        drop = ["setpriv", f"--reuid={self._uid}", f"--regid={self._uid}", "--clear-groups", "--"] \
            if self._uid is not None else []
        err_path = os.path.join(where, "stderr")
        with open(err_path, "wb") as err:  # a file, not a pipe: a service that writes a lot never blocks on it
            proc = subprocess.Popen([*self._jail_prefix(where), *drop, *argv], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(err_path, "rb") as f:
                    said = f.read().decode(errors="replace").strip()[-300:]
                _kill(proc)
                shutil.rmtree(where, ignore_errors=True)
                raise RuntimeError(said or ("it exited" if proc.poll() is not None else
                                            "no socket after %.0f s" % START_TIMEOUT_S))
            time.sleep(0.02)
        return proc, path, where

    def _stop(self, name: str) -> None:
        with self._lock:
            run = self._running.pop(name, None)
        if run is not None:
            _kill(run[0])
            self._wait_gone()
            shutil.rmtree(run[2], ignore_errors=True)

    def _wait_gone(self, within_s: float = 5.0) -> None:
        """Until nothing of the service's uid is left: its jail's pid namespace dies with bwrap, a moment later."""
        from .procs import processes_of_uids

        if self._uid is None:
            return
        deadline = time.monotonic() + within_s
        while processes_of_uids(range(self._uid, self._uid + 1)) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            names = list(self._running)
        for name in names:
            self._stop(name)


def _kill(proc: subprocess.Popen) -> None:
    """The service's whole session (bwrap and what it started), then reaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
