"""The C++ candidate's object file confined before it is linked with the tests (runs in the jail, on the object).

The candidate is native code in the tests' process, so it is held at the symbol level. Every global symbol it defines
becomes local to it (objcopy), except the functions the tests call from it and the inline or template copies the
tests hold too (theirs are linked first and used): so it can replace nothing the tests, the harness or a library
define (an `__assert_fail`, `abort` or `operator==` of its own serves only itself). It may call no library function
that reaches a file descriptor, a process, a signal or memory maps, and hold no system-call instruction and no IFUNC.
usage: objcheck.py CANDIDATE.o EXPORTS.txt OTHER.o|OTHER.syms... ; rewrites CANDIDATE.o, or exits 1 with one line
(a .syms file: an object's `nm -P -g` listing, made once when that trusted object was built).
"""
import os
import re
import subprocess
import sys

# C library functions that would let the candidate reach the proof channel, the secret, another process, a signal
# handler or executable memory (names compared after stripping glibc's __/__libc_ prefixes and _chk/64 suffixes).
DENIED = frozenset("""
read readv pread preadv preadv2 recv recvfrom recvmsg recvmmsg splice tee vmsplice sendfile copy_file_range
syscall fdopen dup dup2 dup3 fcntl ioctl mmap mprotect mremap pkey_mprotect dlopen dlsym dlvsym dlmopen dladdr
fork vfork clone clone3 execve execv execvp execvpe execl execlp execle fexecve posix_spawn posix_spawnp system
popen ptrace process_vm_readv process_vm_writev pidfd_getfd pidfd_open signal sigaction sysv_signal bsd_signal
sigset ssignal sigvec pthread_create thrd_create prctl seccomp setcontext swapcontext makecontext
""".split())
DENIED_PARTS = ("sys_open", "_M_start_thread", "stdio_filebuf", "stdio_sync_filebuf")


def base(name):
    n = name.split("@")[0].lstrip("_")
    for prefix in ("libc_",):
        if n.startswith(prefix):
            n = n[len(prefix):]
    for suffix in ("_chk", "64"):
        if n.endswith(suffix):
            n = n[: -len(suffix)]
    return n


# Named, GCC's LTO plugin is the one nm loads: left to itself nm loads every plugin in bfd-plugins, and LLVM's there
# (Debian's LLVMgold) makes each nm wait on loading LLVM. A candidate's object is never an LTO object either way.
GCC_PLUGIN = "/usr/lib/bfd-plugins/liblto_plugin.so"
NM = ["/usr/bin/nm", "--plugin", GCC_PLUGIN] if os.path.exists(GCC_PLUGIN) else ["/usr/bin/nm"]


def symbols(path, *flags):
    """(name, type) of an object's symbols (`nm -P`); a `.syms` file is that listing made once beforehand."""
    if path.endswith(".syms"):
        with open(path) as f:
            out = f.read()
    else:
        out = subprocess.run([*NM, "-P", *flags, path], capture_output=True, text=True, check=True).stdout
    return [tuple(line.split()[:2]) for line in out.splitlines() if len(line.split()) >= 2]


def demangle(name):
    r = subprocess.run(["/usr/bin/c++filt", name], capture_output=True, text=True)
    return r.stdout.strip() or name


def main(cand, exports_file, *others):
    # the disassembly runs beside the symbol checks (a second core), and is read only if they pass
    dis_proc = subprocess.Popen(["/usr/bin/objdump", "-d", "--no-show-raw-insn", cand], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    try:
        return _check(cand, exports_file, others, dis_proc)
    finally:
        if dis_proc.poll() is None:
            dis_proc.kill()
        dis_proc.wait()


def _check(cand, exports_file, others, dis_proc):
    exports = set(open(exports_file).read().split())
    listed = symbols(cand, "-g")  # one nm: its global definitions and what it leaves undefined
    defined = [(n, t) for n, t in listed if t not in "Uvw"]
    undefined = [n for n, t in listed if t in "Uw"]
    needed, weak_other = set(), set()  # what the tests and harness take from elsewhere; their own weak copies
    for o in others:
        for n, t in symbols(o, "-g"):
            if t in "Uw" and n not in exports:
                needed.add(n)
            elif t in "WV":
                weak_other.add(n)
    local = []
    for n, t in defined:
        if t == "i":
            return f"the candidate defines an IFUNC resolver ({demangle(n)})"
        if n in needed and n not in exports:
            continue  # a function the tests call: the candidate's to give
        if t in "WV" and n in weak_other:
            continue  # the tests hold the same inline or template code and link first: theirs is the one used
        local.append(n)
    for n in undefined:
        if base(n) in DENIED or any(p in n for p in DENIED_PARTS):
            return (f"the candidate calls {demangle(n)}, which programs here may not use (file descriptors, "
                    "processes, signals or memory maps)")
    dis = dis_proc.communicate()[0]
    if dis_proc.returncode:
        raise subprocess.CalledProcessError(dis_proc.returncode, "objdump")
    if re.search(r"\s(syscall|sysenter|int\s+\$0x80)\b", dis):
        return "the candidate holds a system-call instruction"
    if local:
        with open("localize.txt", "w") as f:
            f.write("\n".join(local) + "\n")
        subprocess.run(["/usr/bin/objcopy", "--localize-symbols=localize.txt", cand], check=True)
    return None


if __name__ == "__main__":
    why = main(*sys.argv[1:])
    if why:
        print("sandbox: " + why)
        sys.exit(1)
