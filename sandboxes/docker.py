"""Docker backend: warm containers, one per worker slot, each running the local backend's worker (_jail.py).

A container starts with no network, a read-only root, a small tmpfs scratch, cgroup memory/pids/CPU limits, and
only the capabilities the worker needs to drop each program to its own non-root uid. Its worker connects back to
a unix socket in a bind-mounted host directory; over it this process sends each program with fresh pipes
(SCM_RIGHTS crosses the container boundary), so the secret, the verdict and the per-program cost are exactly
the local backend's (host side: local._Worker). Image: sandboxes/image/ (`make docker-image`). Limits and
defences: sandboxes/README.md.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import toolchains
from .base import SandboxUnavailable
from .config import DockerSandboxConf, conf_with
from .local import _WORKER_CAPS
from .pool import _WorkerPool, _live
from .worker import _JAIL, _Worker

log = logging.getLogger("sandboxes.docker")

DEFAULT_IMAGE = DockerSandboxConf.image  # fixlab's own image: the only one built on first use
_SCRATCH = "/scratch"            # the container's only writable place (tmpfs); one dir per program below it
_CTL_DIR = "/run/fixlab"         # the host's socket directory, bind-mounted read-only
_JAIL_IN = "/opt/fixlab/_jail.py"  # sandboxes/_jail.py, bind-mounted read-only: the image never goes stale
_JAIL_NATIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jail_native.py")  # mounted beside it
_LABEL = "fixlab.sandbox"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process (with its pid, names it even after pids wrap), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


# Socket directories carry their owner (pid, start time): the next sandbox removes those of owners killed before close().
_DIR_PREFIX = f"fixlab-docker-{os.getpid()}-{_start_time(os.getpid())}-"
_container_numbers = itertools.count(1)  # container names are unique per process, across its sandboxes
_OWNER = f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def _docker(docker: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([docker, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else ""


def build_once(docker: str, image: str) -> str | None:
    """First use on a machine (as packs are converted on first use): start dockerd if it is installed and not running,
    and build the image with sandboxes/image/build.sh (a few minutes offline), under a cross-process lock so that
    concurrent jobs build it once. Returns what is still missing, as docker_problem does."""
    from filelock import FileLock

    script = Path(__file__).parent / "image" / "build.sh"
    lock = Path(tempfile.gettempdir()) / "fixlab-docker-image.lock"
    with FileLock(str(lock)):
        if docker_problem(docker, image) is None:  # another job built it meanwhile
            return None
        print(f"sandbox=docker: first use here: starting dockerd if needed and building image {image} if missing "
              f"({script.relative_to(Path(__file__).parent.parent)}; a few minutes offline)", file=sys.stderr, flush=True)
        r = subprocess.run(["bash", str(script)], env={**os.environ, "IMAGE": image}, capture_output=True, text=True)
        if r.returncode != 0:
            return f"sandbox=docker: building the image failed ({_last_line(r.stderr or r.stdout)}): run `make docker-image`"
    return docker_problem(docker, image)


def docker_problem(docker: str = "docker", image: str = DEFAULT_IMAGE) -> str | None:
    """None when `image` can run here, else one line saying what is missing and how to fix it."""
    exe = shutil.which(docker)
    if exe is None:
        return (f"sandbox=docker: the docker CLI ({docker!r}) is not installed: `make setup` installs docker.io "
                "(as root), then build the image with `make docker-image`")
    try:
        r = _docker(exe, "image", "inspect", "--format", "{{.Id}}", image, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"sandbox=docker: `docker image inspect` failed: {e}"
    if r.returncode == 0:
        return None
    err = _last_line(r.stderr)
    if "no such image" in err.lower():
        return f"sandbox=docker: image {image!r} not found: build it with `make docker-image`"
    if "daemon" in err.lower() or "docker.sock" in err:
        return (f"sandbox=docker: the Docker daemon is not reachable ({err}): start it (as root `dockerd &`, "
                "or `systemctl start docker`)")
    return f"sandbox=docker: {err or 'docker image inspect failed'}"


def daemon_running(docker: str = "docker") -> bool:
    exe = shutil.which(docker)
    if exe is None:
        return False
    try:
        return _docker(exe, "version", "--format", "{{.Server.Version}}", timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_daemon(log_path: str, docker: str = "docker", wait_s: float = 60.0) -> subprocess.Popen | str:
    """Start dockerd (for tests and CI: the caller stops it); returns its process, or why it cannot."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        return "dockerd is not installed (`make setup` installs docker.io as root)"
    if os.geteuid() != 0:
        return "dockerd is not running and only root can start it"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if daemon_running(docker):
            return proc
        if proc.poll() is not None:
            return f"dockerd exited with {proc.returncode} at start (log: {log_path})"
        time.sleep(0.5)
    stop_daemon(proc)
    return f"dockerd did not answer within {wait_s:.0f} s (log: {log_path})"


def stop_daemon(proc: subprocess.Popen, wait_s: float = 30.0) -> None:
    """SIGTERM the dockerd we started (it stops its containers and containerd), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def remove_stale(docker: str = "docker") -> list[str]:
    """Remove sandbox containers (and socket directories) left by processes of this machine that are gone (killed
    before close()). A container whose worker waits on a sleeping program would otherwise stay up forever."""
    tmp = tempfile.gettempdir()
    for d in os.listdir(tmp):
        pid, _, rest = d.removeprefix("fixlab-docker-").partition("-")
        started = rest.partition("-")[0]
        if d.startswith("fixlab-docker-") and pid.isdigit() and started.isdigit() and _start_time(int(pid)) != started:
            shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    try:
        r = _docker(docker, "ps", "-a", "--filter", f"label={_LABEL}", "--format",
                    '{{.Names}}\t{{.Label "fixlab.owner"}}', timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    stale = []
    for line in r.stdout.splitlines():
        name, _, owner = line.partition("\t")
        host, _, rest = owner.partition(":")
        pid, _, started = rest.partition(":")
        if host == socket.gethostname() and pid.isdigit() and _start_time(int(pid)) != started:
            stale.append(name)
    if stale:
        _docker(docker, "rm", "-f", *stale, timeout=120)
    return stale


class _ContainerWorker(_Worker):
    """One warm container whose main process is the worker (under docker's tiny init, which reaps orphans)."""

    sbx: "DockerSandbox"

    def _start(self) -> None:
        sbx = self.sbx
        self.scratch_root, self.sock, self.removed = None, None, False
        self.dir = tempfile.mkdtemp(prefix=_DIR_PREFIX)  # 0700: only root (the worker) enters it
        self.sock_path = os.path.join(self.dir, "ctl.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.sock_path)
        self.listener.listen(1)
        self.name = sbx.container_name(self.slot)
        cfg = self._config(_SCRATCH)
        cfg["nice"] = os.getpriority(os.PRIO_PROCESS, 0)  # dockerd starts containers at 0: keep the caller's `nice`
        cmd = sbx.run_command(self.name, self.dir, cfg)
        # Attached (not -d): the client's stderr is the worker's last words, its exit the container's end.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def wait_ready(self, timeout: float) -> str | None:
        if self.sock is None:
            why = self._accept(timeout)
            if why:
                return why
        return super().wait_ready(timeout)

    def _accept(self, timeout: float) -> str | None:
        """Wait for the container's worker to connect; then nothing else can (the listener is gone)."""
        deadline = time.monotonic() + timeout
        self.listener.settimeout(0.2)
        while True:
            try:
                conn, _ = self.listener.accept()
                break
            except socket.timeout:
                if self.proc.poll() is not None:
                    return "container exited at start: " + self._stderr_tail()
                if time.monotonic() > deadline:
                    return f"container {self.name} did not connect within {timeout:.0f} s"
            except OSError as e:
                return f"control socket: {e}"
        self.listener.close()
        os.unlink(self.sock_path)
        self.sock = conn
        return None

    def _stderr_tail(self) -> str:
        """The docker client's (or the worker's) last meaningful line, not docker's `Run 'docker run --help'`."""
        try:
            self.proc.wait(timeout=5)
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        except Exception:
            err = ""
        lines = [x for x in err.strip().splitlines() if x.strip() and not x.startswith(("Run 'docker", "Usage:"))]
        return lines[-1].strip() if lines else f"exit code {self.proc.returncode}"

    def _terminate(self) -> None:
        """Remove the container (SIGKILL to everything in it), unless close() already did for all at once."""
        try:
            self.listener.close()
        except OSError:
            pass
        if not self.removed:
            self.removed = True
            self.sbx.remove([self.name])

    def kill(self) -> None:
        super().kill()
        if self.proc.poll() is None:  # the client outlived its container: should not happen
            self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


class DockerSandbox(_WorkerPool):
    """Docker backend. mode=fork (default): warm containers whose worker forks a child per program;
    mode=fresh: a new container per program (what one-container-per-run harnesses do; slow)."""

    name = "docker"
    worker_class = _ContainerWorker
    isolated = True    # own pid namespace: the worker's kill(-1) ends whatever a program left behind
    switch_uid = True  # the worker is the container's root (6 capabilities); each program runs as uid_base+slot

    def __init__(self, conf: DockerSandboxConf | None = None, **options):
        """`conf` (sandboxes/config.py: the defaults), or its defaults, with keyword `options` applied."""
        c = conf_with(DockerSandboxConf, conf, options)
        # uids apart from the local backend's (100000+...): RLIMIT_NPROC counts per uid across the machine.
        self._init_pool(c, 800000)
        image, memory_mb, scratch_mb, cpus, pids_limit = c.image, c.memory_mb, c.scratch_mb, c.cpus, c.pids_limit
        container_memory_mb, cgroup_parent, docker, build_image = (c.container_memory_mb, c.cgroup_parent, c.docker,
                                                                   c.build_image)
        if container_memory_mb is None:  # the program, its scratch (tmpfs pages count) and the worker itself
            container_memory_mb = int(memory_mb + scratch_mb + 256)
        for k, v in (("cpus", cpus), ("container_memory_mb", container_memory_mb)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise SandboxUnavailable(f"sandbox option {k} must be a positive number, got {v!r}")
        if not isinstance(pids_limit, int) or pids_limit < 8:
            raise SandboxUnavailable(f"sandbox option pids_limit must be an integer of at least 8, got {pids_limit!r}")
        self.image, self.cpus, self.pids_limit = str(image), float(cpus), int(pids_limit)
        self.container_memory_mb = int(container_memory_mb)
        self.cgroup_parent = cgroup_parent
        why = docker_problem(docker, self.image)
        # our own image only: a missing image of the user's is theirs to build
        if why and build_image and image == DEFAULT_IMAGE and ("not found" in why or "not reachable" in why):
            why = build_once(docker, self.image)
        if why:
            raise SandboxUnavailable(why)
        self.docker = shutil.which(docker)
        remove_stale(self.docker)
        self._toolchains_ok: set[str] = set()
        _live.add(self)

    def container_name(self, slot: int) -> str:
        return f"fixlab-sbx-{os.getpid()}-{slot}-{next(_container_numbers)}"

    def run_command(self, name: str, ctl_dir: str, cfg: dict) -> list[str]:
        """`docker run` for one worker container; the limits are sandboxes/README.md's Docker table."""
        mem = f"{self.container_memory_mb}m"
        caps = [a for cap in _WORKER_CAPS for a in ("--cap-add", cap.removeprefix("CAP_"))]
        return [self.docker, "run", "--rm", "--init", "--name", name,
                "--label", f"{_LABEL}=1", "--label", f"fixlab.owner={_OWNER}",
                "--network", "none", "--ipc", "none", "--hostname", "sandbox", "--read-only",
                # exec: a compiled language's program is a binary built in its scratch dir
                "--tmpfs", f"{_SCRATCH}:rw,nosuid,nodev,exec,size={self.scratch_mb}m,mode=0755",
                "--tmpfs", "/dev/mqueue:ro,size=4k,mode=0555",  # else a writable place kept between programs
                "--user", "0:0", "--cap-drop", "ALL", *caps, "--security-opt", "no-new-privileges",
                "--memory", mem, "--memory-swap", mem, "--pids-limit", str(self.pids_limit),
                "--cpus", f"{self.cpus:g}",
                *(["--cgroup-parent", self.cgroup_parent] if self.cgroup_parent else []),
                "--env", "PATH=/usr/local/bin:/usr/bin:/bin", "--env", "LANG=C.UTF-8",
                "--env", "OPENBLAS_NUM_THREADS=1", "--env", "OMP_NUM_THREADS=1", "--workdir", _SCRATCH,
                "-v", f"{ctl_dir}:{_CTL_DIR}:ro", "-v", f"{_JAIL}:{_JAIL_IN}:ro",
                "-v", f"{_JAIL_NATIVE}:{os.path.dirname(_JAIL_IN)}/_jail_native.py:ro", *self.toolchain_mounts(),
                self.image, "python3", "-I", "-B", _JAIL_IN, f"{_CTL_DIR}/ctl.sock", json.dumps(cfg)]

    def run(self, program, timeout_s: float):
        """As the pool runs it; a compiled language's first program checks that the image carries its toolchain."""
        if not isinstance(program, str):
            self._check_toolchain(program.language)
        return super().run(program, timeout_s)

    def _check_toolchain(self, name: str) -> None:
        if name in self._toolchains_ok:
            return
        from .languages import language

        lang = language(name)
        need = [*lang.toolchain.commands, *lang.toolchain.files] if lang.toolchain else []
        r = _docker(self.docker, "run", "--rm", "--network", "none", "--entrypoint", "ls", self.image, *need,
                    timeout=120)
        if r.returncode != 0:
            raise SandboxUnavailable(f"the image {self.image} has no {lang.title} toolchain "
                                     f"({_last_line(r.stderr)}); rebuild it: make docker-image FORCE=1")
        self._toolchains_ok.add(name)

    def toolchain_mounts(self) -> list[str]:
        """The compiled languages' prepared parts (sandboxes/toolchains.py), read-only at the host's path, and the
        harness sources their steps name: the image carries the same Debian toolchains that built them."""
        tools = str(toolchains.cache_root())
        harness = str(toolchains.HARNESS)
        out = ["-v", f"{harness}:{harness}:ro"]
        return out + (["-v", f"{tools}:{tools}:ro"] if os.path.isdir(tools) else [])

    def remove(self, names: list[str]) -> None:
        """`docker rm -f`: SIGKILL to every process of these containers, then they are gone (synchronous)."""
        if not names:
            return
        try:
            r = _docker(self.docker, "rm", "-f", *names, timeout=120)
            if r.returncode != 0 and "No such container" not in r.stderr:
                log.warning("sandbox: docker rm -f failed: %s", _last_line(r.stderr))
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("sandbox: docker rm -f failed: %s", e)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = self._idle + list(self._busy)
            self._idle = []
        self.remove([w.name for w in workers if not w.removed])  # one call for all: faster than one each
        for w in workers:
            w.removed = True
            w.kill()

