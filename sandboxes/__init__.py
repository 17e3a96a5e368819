"""Sandboxes that run untrusted candidate programs and return a verdict (see base.Sandbox)."""
from __future__ import annotations

from .base import ExecResult, Sandbox, SandboxUnavailable
from .program import IMPORT_HELPER, build_program


def make_sandbox(cfg: dict) -> Sandbox:
    """Build the backend named by cfg["backend"] (conf/sandbox/*.yaml)."""
    backend = cfg.get("backend", "local")
    opts = {k: v for k, v in cfg.items() if k not in ("backend", "timeout_s", "audit", "strict")}  # caller's keys
    if backend == "local":
        from .local import LocalSandbox

        return LocalSandbox(**opts)
    if backend == "docker":
        from .docker import DockerSandbox

        return DockerSandbox(**opts)
    if backend == "e2b":
        from .e2b import E2BSandbox

        return E2BSandbox(**opts)
    raise SandboxUnavailable(f"unknown sandbox backend {backend!r}: use sandbox=local, sandbox=docker or sandbox=e2b")


__all__ = ["ExecResult", "Sandbox", "SandboxUnavailable", "IMPORT_HELPER", "build_program", "make_sandbox"]
