"""Local backend: warm workers inside a bubblewrap jail fork one child per program.

Host side. The worker (sandboxes/_jail.py) runs in its own pid/net/ipc/uts namespaces with a read-only
root and a tmpfs scratch; it preloads the import helper and forks a child per program. This process
owns the per-run secret, the pipes and the clock. Here: LocalSandbox, whether bubblewrap works (probe_bwrap) and the
jail's command line. The pool and the host side of a worker (pool.py _WorkerPool, worker.py _Worker) serve the Docker
backend too (docker.py: the same worker in a container); verdict.py reads what a run left. Limits and defences:
sandboxes/README.md.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

from . import toolchains
from .base import SandboxUnavailable
from .config import LocalSandboxConf, conf_with
from .pool import _WorkerPool, _live
from .services import Services
from .verdict import parse_failure
from .worker import _JAIL, _probe_lock

__all__ = ["LocalSandbox", "parse_failure", "probe_bwrap"]

log = logging.getLogger("sandboxes.local")

_NS_FLAGS = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
# The worker keeps these to switch each child to its own uid, kill what the child left and clean its dir.
_WORKER_CAPS = ["CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"]

_probe_cache: dict[str, str | None] = {}
_warned = False


def probe_bwrap(bwrap: str = "bwrap") -> str | None:
    """None when bubblewrap can build our jail here, else the reason it cannot (cached per command)."""
    with _probe_lock:
        if bwrap in _probe_cache:
            return _probe_cache[bwrap]
        exe = shutil.which(bwrap)
        if exe is None:
            reason = f"{bwrap!r} not found on PATH (install the bubblewrap package)"
        else:
            cmd = [exe, *_NS_FLAGS, "--die-with-parent", "--ro-bind", "/", "/", "--tmpfs", "/proc"]
            if os.geteuid() == 0:
                for cap in _WORKER_CAPS:
                    cmd += ["--cap-add", cap]
            else:
                cmd.insert(1, "--unshare-user")
            try:
                r = subprocess.run(cmd + ["true"], capture_output=True, timeout=30)
                reason = None if r.returncode == 0 else (
                    "bwrap cannot create namespaces: " + r.stderr.decode(errors="replace").strip()[:200])
            except (OSError, subprocess.TimeoutExpired) as e:
                reason = f"bwrap failed to start: {e}"
        _probe_cache[bwrap] = reason
        return reason


class LocalSandbox(_WorkerPool):
    """Local backend. mode=fork (default): warm workers fork a child per program; mode=fresh: a new
    jailed interpreter per program (the slow reference, same isolation and verdict rule)."""

    name = "local"

    def __init__(self, conf: LocalSandboxConf | None = None, **options):
        """`conf` (sandboxes/config.py: the defaults), or its defaults, with keyword `options` applied."""
        c = conf_with(LocalSandboxConf, conf, options)
        self._init_pool(c, 100000)
        python, bwrap, require_isolation = c.python, c.bwrap, c.require_isolation
        self.python = python or sys.executable
        self.bwrap = bwrap
        reason = probe_bwrap(bwrap)
        if reason is not None and require_isolation:
            raise SandboxUnavailable(f"sandbox isolation required but unavailable: {reason}")
        if reason is not None:
            global _warned
            if not _warned:
                _warned = True
                log.warning("sandbox: no bubblewrap isolation (%s); running with rlimits only", reason)
        self.isolated = reason is None
        self.isolation_reason = reason
        self.switch_uid = os.geteuid() == 0
        self._services = None
        if self.isolated and self.mode == "fork" and self.workers < 63 and c.compile_services:
            self._services = Services(self._service_jail, self.uid_base + 63 if self.switch_uid else None)
        _live.add(self)

    def _visible_mounts(self) -> list[str]:
        """Hide the home directory, and keep the interpreter readable for the child's uid when it lives
        under a directory others cannot enter (e.g. pyenv under /root, mode 700)."""
        exe = os.path.realpath(self.python)
        needed = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(exe)), os.path.dirname(_JAIL)}
        tools = str(toolchains.cache_root())
        if os.path.isdir(tools):  # compiled languages' prepared parts (sandboxes/toolchains.py), read-only
            needed.add(tools)
        hidden = []
        home = os.path.expanduser("~")
        if home not in ("/", "") and os.path.isdir(home):
            hidden.append(home)
        for path in sorted(needed):
            parts = path.split("/")
            for i in range(2, len(parts)):
                anc = "/".join(parts[:i])
                if not os.stat(anc).st_mode & 0o001 and anc not in hidden:
                    hidden.append(anc)
                    break
        args = []
        for h in hidden:
            args += ["--tmpfs", h]
        # /tmp and /dev/shm are fresh tmpfs mounts (made before these): a checkout or venv under them
        # (CI clones often live in /tmp) must be bound back in, or the worker cannot even start.
        hidden += ["/tmp", "/dev/shm"]
        for path in sorted(needed):
            under = [h for h in hidden if path.startswith(h + "/")]
            if under:
                parts = path[len(under[0]) + 1:].split("/")
                for i in range(1, len(parts)):  # bwrap would create these 0700: the child could not enter
                    args += ["--perms", "0755", "--dir", under[0] + "/" + "/".join(parts[:i])]
                args += ["--ro-bind", path, path]
        return args

    def service_fd(self, program) -> int | None:
        """A warm compile service's connection for the program's served step (sandboxes/services.py), or None:
        only inside a working jail, and only with a uid of its own beside the workers' (uid_base+63)."""
        if self._services is None:
            return None
        return self._services.connect(program)

    def _service_jail(self, rw_dir: str) -> list[str]:
        """A service's jail: the workers' mounts and namespaces, its one writable place its socket's folder and a
        private /tmp, and only the capabilities setpriv needs to drop to the service's uid."""
        cmd = [self.bwrap, *_NS_FLAGS, "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
               "--tmpfs", "/proc", "--dev", "/dev", "--size", str(self.scratch_mb * 1024 * 1024), "--perms", "1777",
               "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", *self._visible_mounts(), "--bind", rw_dir, rw_dir,
               "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--chdir", "/tmp"]
        if self.switch_uid:
            cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            cmd.insert(1, "--unshare-user")
        return cmd

    def close(self) -> None:
        super().close()
        if self._services is not None:
            self._services.close()

    def jail_prefix(self) -> list[str]:
        cmd = [self.bwrap, *_NS_FLAGS, "--die-with-parent", "--new-session", "--ro-bind", "/", "/",
               "--tmpfs", "/proc", "--dev", "/dev", "--size", str(self.scratch_mb * 1024 * 1024),
               "--tmpfs", "/tmp", "--tmpfs", "/dev/shm", *self._visible_mounts(), "--clearenv",
               "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
               "--setenv", "OPENBLAS_NUM_THREADS", "1", "--setenv", "OMP_NUM_THREADS", "1", "--chdir", "/tmp"]
        if self.switch_uid:
            for cap in _WORKER_CAPS:
                cmd += ["--cap-add", cap]
        else:
            cmd.insert(1, "--unshare-user")
        return cmd
