"""The sandbox's typed settings, one record per backend: the only place their defaults are defined.
conf/sandbox/<name>.yaml picks a record as its schema (flows/schema.py) and holds only what differs from it.
A setting that changes no verdict (how programs are started, not what they may do) says so on its field:
`metadata={"neutral": why}` (flows/result_neutral.py). A new backend adds its record here (deriving from SandboxConf), its
entry in SANDBOX_CONFS and its case in sandboxes/__init__.py make_sandbox."""
from __future__ import annotations

from dataclasses import dataclass, field

from .base import OUTPUT_CAP_BYTES


@dataclass
class SandboxConf:
    """What every backend takes: the caller's per-program settings and the limits applied to each program."""

    backend: str  # local | docker | e2b: set by each record below
    timeout_s: float = 10.0  # per program, as in the reference harness (read by the caller)
    audit: bool = True  # re-run each pass with its return values checked; flags a lying __eq__ (sandboxes/audit.py)
    strict: bool = False  # true: a flagged pass counts as a failure
    memory_mb: int = 2048  # address space per program
    cpu_s: int = 60  # CPU seconds per program (backstop behind timeout_s)
    max_file_mb: int = 64  # largest file a program may write
    max_open_files: int = 256
    max_output_mb: int = 16  # stdout+stderr beyond this: the program is killed and fails


@dataclass
class PoolSandboxConf(SandboxConf):
    """Backends with a pool of warm workers that fork a child per program (local jails, docker containers)."""

    # fork: warm workers fork a child per program; fresh: a new worker per program (slow)
    mode: str = field(default="fork", metadata={"neutral": "how a program is started, not what it may do"})
    # concurrent programs (docker: containers); null = number of cores
    workers: int | None = field(default=None, metadata={"neutral": "how many programs run at once"})
    scratch_mb: int = 256  # size of each worker's writable tmpfs
    allow_fork: bool = False  # true lets programs fork (only for debugging: forking lets a candidate probe the test)
    max_processes: int = 32  # processes per program when allow_fork is true
    # children run as uid_base+slot (no capability); null = picked per process
    uid_base: int | None = field(default=None, metadata={"neutral": "which uid, not what it may do"})
    ready_timeout_s: float = 120.0  # a worker that is not ready by then fails its program
    output_cap_bytes: int = OUTPUT_CAP_BYTES  # output kept per stream


@dataclass
class LocalSandboxConf(PoolSandboxConf):
    """sandboxes/local.py: warm bubblewrap-jailed workers (limits and defences: sandboxes/README.md)."""

    backend: str = "local"
    require_isolation: bool = False  # true: refuse to start without the bubblewrap jail instead of rlimits only
    bwrap: str = "bwrap"  # the bubblewrap command
    python: str | None = None  # interpreter of the workers; null = this process's
    # warm compilers the programs share (sandboxes/services.py: Java's javac); false: every compile step runs itself
    compile_services: bool = field(default=True, metadata={"neutral": "how a compile runs, not what it makes"})


@dataclass
class DockerSandboxConf(PoolSandboxConf):
    """sandboxes/docker.py: warm containers, one per worker, from a locally built image (`make docker-image`)."""

    backend: str = "docker"
    image: str = "fixlab-sandbox:latest"  # sandboxes/image/ (Dockerfile online, Debian rootfs offline)
    build_image: bool = True  # first use: start dockerd if needed and build a missing image once (fixlab's image only)
    # cgroup memory (no swap) of each container; null = memory_mb + scratch_mb + 256
    container_memory_mb: int | None = None
    cpus: float = 1.0  # CPU share of each container (docker --cpus)
    pids_limit: int = 64  # processes + threads in each container (docker --pids-limit)
    # null = docker's own (all containers share one CPU-scheduler entity); "/" = one each, as local workers
    cgroup_parent: str | None = field(default=None, metadata={"neutral": "CPU scheduling, not limits"})
    docker: str = "docker"  # the docker command


@dataclass
class E2BSandboxConf(SandboxConf):
    """sandboxes/e2b.py: E2B cloud sandboxes; needs E2B_API_KEY; one remote sandbox per calling thread."""

    backend: str = "e2b"
    timeout_margin_s: float = 15.0  # room for the remote interpreter to start and the result to come back
    sandbox_timeout_s: int = 3600  # lifetime of each remote sandbox (E2B kills it after this; close() kills it sooner)
    request_timeout_s: float = 60.0  # connect timeout of each SDK request
    template: str | None = None  # null = the SDK's code-interpreter template


SANDBOX_CONFS: dict[str, type[SandboxConf]] = {"local": LocalSandboxConf, "docker": DockerSandboxConf,
                                                 "e2b": E2BSandboxConf}


def conf_with(cls: type[SandboxConf], conf: SandboxConf | None, options: dict) -> SandboxConf:
    """`conf` (or the defaults of `cls`) with keyword `options` applied: what a backend's constructor takes.
    An unknown option is one line naming it and the known ones."""
    import dataclasses

    from .base import SandboxUnavailable

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SandboxUnavailable(f"unknown {cls.backend} sandbox option(s) {unknown}; known: {sorted(known)}")
    return dataclasses.replace(conf if conf is not None else cls(), **options)
