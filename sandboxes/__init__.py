"""Sandboxes that run untrusted candidate programs and return a verdict (see base.Sandbox)."""
from __future__ import annotations

from .base import ExecResult, Sandbox, SandboxUnavailable
from .config import SANDBOX_CONFS, DockerSandboxConf, E2BSandboxConf, LocalSandboxConf, SandboxConf
from .program import IMPORT_HELPER, build_program


def make_sandbox(conf: SandboxConf) -> Sandbox:
    """The backend `conf` is the record of (sandboxes/config.py; conf/sandbox/*.yaml)."""
    if isinstance(conf, LocalSandboxConf):
        from .local import LocalSandbox

        return LocalSandbox(conf)
    if isinstance(conf, DockerSandboxConf):
        from .docker import DockerSandbox

        return DockerSandbox(conf)
    if isinstance(conf, E2BSandboxConf):
        from .e2b import E2BSandbox

        return E2BSandbox(conf)
    options = ", ".join(f"sandbox={name}" for name in SANDBOX_CONFS)
    raise SandboxUnavailable(f"unknown sandbox backend {conf.backend!r}: use {options}")


__all__ = ["ExecResult", "Sandbox", "SandboxConf", "SandboxUnavailable", "IMPORT_HELPER", "build_program",
           "make_sandbox"]
