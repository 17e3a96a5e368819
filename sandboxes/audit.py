"""A second look at a passing candidate: did it pass by returning values that lie about equality?

The reference harness (and so fixlab's verdict) accepts `assert f(x) == y`. A candidate can make every such
assert hold by returning an object whose `__eq__` always answers True, or a subclass of int/str/list that
overrides it. The verdict stays the reference one (scores stay identical to bigcode's); this audit only flags.

How: the same program is run again in the sandbox with the entry point wrapped, so every value it returns is
checked: only plain builtin values (bool, int, float, complex, str, bytes, None, and list/tuple/dict/set/
frozenset of them, by exact type, which a subclass cannot fake) may come back. A value that is not plain raises
`SuspiciousReturn`, so the audit run fails. The audit's verdict comes from the sandbox's secret like any run,
so a candidate cannot fake a clean audit; the reason text is read from the failure and is informational.
The wrapper and its helpers are bound before the candidate's code runs again (closures, default arguments),
so rebinding names at call time does not reach them.
"""
from __future__ import annotations

from .base import ExecResult
from .program import IMPORT_HELPER

MARKER = "SuspiciousReturn"

_WRAPPER = '''
def __fixlab_audit(fn, _type=type, _id=id, _len=len, _repr=object.__repr__, _err=AssertionError):
    plain = (bool, int, float, complex, str, bytes, type(None))
    seqs = (list, tuple, set, frozenset)

    class SuspiciousReturn(_err):
        pass

    def check(value, depth, seen):
        t = _type(value)
        if t in plain:
            return None
        if depth > 20 or _id(value) in seen:
            return None
        if t in seqs:
            seen.add(_id(value))
            for item in (list.__iter__(value) if t is list else tuple.__iter__(value) if t is tuple
                         else set.__iter__(value) if t is set else frozenset.__iter__(value)):
                bad = check(item, depth + 1, seen)
                if bad:
                    return bad
            return None
        if t is dict:
            seen.add(_id(value))
            for k, v in dict.items(value):
                bad = check(k, depth + 1, seen) or check(v, depth + 1, seen)
                if bad:
                    return bad
            return None
        return t.__module__ + "." + t.__qualname__

    def wrapped(*args, **kwargs):
        value = fn(*args, **kwargs)
        bad = check(value, 0, set())
        if bad:
            raise SuspiciousReturn("returned a " + bad + " object, not a plain value: its == cannot be trusted")
        return value

    return wrapped


{entry_point} = __fixlab_audit({entry_point})
'''


def audit_program(candidate: str, test: str, entry_point: str) -> str:
    """The harness program with the entry point wrapped by the return-value audit."""
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a Python name")
    return IMPORT_HELPER + "\n" + candidate + "\n\n" + _WRAPPER.format(entry_point=entry_point) + "\n\n" + test


def suspicion(audit: ExecResult) -> str | None:
    """None when the audit run passed; otherwise why the pass is suspicious (one line)."""
    if audit.passed:
        return None
    if audit.error_type == MARKER or MARKER in (audit.stderr or ""):
        for line in reversed((audit.stderr or "").splitlines()):
            if MARKER in line and ":" in line:
                return line.split(":", 1)[1].strip()[:200]
        return "returned a value that is not a plain builtin value"
    if audit.status == "timeout":
        return "passed the tests, but timed out when run again with its return values checked"
    return (f"passed the tests, but failed when run again with its return values checked"
            f" ({audit.error_type or audit.status})")
