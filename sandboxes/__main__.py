"""Debug one candidate: `python -m sandboxes run FILE.py [--backend local|docker|e2b] [--timeout S]`.

Prints the ExecResult as one JSON line; exits 0 only when the status is passed.
"""
from __future__ import annotations

import argparse
import json
import sys

from . import SandboxUnavailable, make_sandbox
from .config import SANDBOX_CONFS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sandboxes", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a complete program (e.g. build_program output) and print its verdict")
    run.add_argument("file", help="Python file with the whole program (candidate + test)")
    run.add_argument("--backend", choices=["local", "docker", "e2b"], default="local")
    run.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    args = ap.parse_args(argv)
    if args.timeout <= 0:
        ap.error(f"--timeout must be positive, got {args.timeout}")
    try:
        with open(args.file, encoding="utf-8") as f:
            program = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: cannot read {args.file}: {e}", file=sys.stderr)
        return 2
    try:
        record = SANDBOX_CONFS[args.backend]
        sbx = make_sandbox(record() if args.backend == "e2b" else record(workers=1))
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        result = sbx.run(program, args.timeout)
    finally:
        sbx.close()
    print(json.dumps(result.to_dict()))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
