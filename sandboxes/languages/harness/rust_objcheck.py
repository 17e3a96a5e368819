"""The Rust program's own object (candidate, tests and the harness's one-line main; rustc --emit=obj) held to its rules
before the linked program runs (runs in the jail, on the object).

The crate forbids `unsafe`, but safe Rust has known soundness holes (a transmute built from lifetime bugs), so the
object is also held at the symbol level, as the C++ candidate's is: no reference to a std path that reaches a file,
socket, raw fd, process or thread, nor to a C library function harness/objcheck.py denies; no symbol of its own with an
unmangled name but `main` (no_mangle, export_name); no constructor or destructor section; no system-call
instruction; and only the crate's `main` may name the harness crate fixlab_proof.
usage: rust_objcheck.py PROG.o CRATE ; exits 1 with one line when the object breaks a rule.
"""
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the harness sources (they key the prepared parts)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from objcheck import DENIED, DENIED_PARTS, base  # noqa: E402 (the C++ check's list of C library functions)

DENIED_PATHS = ("std::fs::", "std::net::", "std::os::", "std::process::Command", "std::process::Child",
                "std::process::Stdio", "std::sys::unix::fd::", "std::sys::unix::fs::", "std::sys::unix::net::",
                "std::sys::unix::pipe::", "std::sys::unix::process::process_inner", "std::thread::spawn",
                "std::thread::Builder::spawn", "std::thread::scope")
CTOR_SECTIONS = (".init_array", ".fini_array", ".preinit_array", ".ctors", ".dtors")
ESCAPES = {"$SP$": "@", "$BP$": "*", "$RF$": "&", "$LT$": "<", "$GT$": ">", "$LP$": "(", "$RP$": ")", "$C$": ","}
HARNESS = "_ZN12fixlab_proof"


def demangle(name):
    """A legacy-mangled Rust symbol (_ZN...E) as a path (`<std::fs::File as std::io::Read>::read`); others as is."""
    m = re.match(r"_ZN(\d.*)E$", name)
    if not m:
        return name
    parts, rest = [], m.group(1)
    while rest:
        n = re.match(r"\d+", rest)
        if not n:
            break
        k = len(n.group(0))
        size = int(n.group(0))
        parts.append(rest[k:k + size])
        rest = rest[k + size:]
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    text = "::".join(p[1:] if p.startswith("_$") else p for p in parts)
    text = re.sub(r"\$u([0-9a-f]+)\$", lambda u: chr(int(u.group(1), 16)), text)
    for k, v in ESCAPES.items():
        text = text.replace(k, v)
    return text.replace("..", "::")


def tool(*args):
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def main(obj, crate):
    main_fn = re.compile(r"_ZN%d%s4main17h[0-9a-f]{16}E$" % (len(crate), re.escape(crate)))
    mains, part, section = [], None, None
    for line in tool("/usr/bin/objdump", "-h", "-t", "-r", obj).splitlines():
        if line in ("Sections:", "SYMBOL TABLE:"):
            part = line
            continue
        rel = re.match(r"RELOCATION RECORDS FOR \[(.*)\]:", line)
        if rel:
            part, section = "relocations", rel.group(1)
            continue
        head = re.match(r"\s*\d+\s+(\S+)\s+[0-9a-f]{8}", line)
        if part == "Sections:" and head and any(c in head.group(1) for c in CTOR_SECTIONS):
            return f"the program has a constructor or destructor section ({head.group(1)})"
        sym = re.match(r"[0-9a-f]+ (.{7}) (\S+)\t[0-9a-f]+ (?:\.hidden )?(\S+)$", line)
        if part == "SYMBOL TABLE:" and sym:
            flags, where, name = sym.groups()
            path = demangle(name)  # defined ones too: std's generic functions the program instantiates
            if any(d in path for d in DENIED_PATHS):
                return f"the program uses {path}, which programs here may not (files, sockets, fds, processes, threads)"
            if where == "*UND*":
                if not name.startswith("_Z") and (base(name) in DENIED or any(p in name for p in DENIED_PARTS)):
                    return f"the program calls the C library's {name}, which programs here may not"
            elif (flags[0] in "gu!" or flags[1] == "w") and not name.startswith(("_ZN", "_R")) \
                    and name not in ("main", "DW.ref.rust_eh_personality"):
                return f"the program defines the unmangled symbol {name} (no_mangle, export_name)"
            elif main_fn.match(name):
                mains.append(name)
        fields = line.split()
        if part == "relocations" and len(fields) >= 3 and fields[2].startswith(HARNESS) \
                and (len(mains) != 1 or section != ".text." + mains[0]):
            callee = demangle(re.split(r"[+-]0x", fields[2])[0])
            return f"only the harness's main may call the harness crate ({callee})"
    if len(mains) != 1:
        return "the program's object has no single main"
    if re.search(r"\s(syscall|sysenter|int\s+\$0x80)\b", tool("/usr/bin/objdump", "-d", "--no-show-raw-insn", obj)):
        return "the program holds a system-call instruction"
    return None


if __name__ == "__main__":
    why = main(*sys.argv[1:])
    if why:
        print("sandbox: " + why)
        sys.exit(1)
