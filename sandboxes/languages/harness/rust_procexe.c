// Preloaded into rustc and cargo in the jail: they find their sysroot through readlink("/proc/self/exe"), and the
// jail mounts no /proc (it would show a run's file descriptors). The link reads as the command's own path instead:
// argv[0] when it holds a slash, else its first match on PATH.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char *program_invocation_name;

static int own_path(char *out) {
    const char *argv0 = program_invocation_name;
    if (strchr(argv0, '/')) return realpath(argv0, out) != NULL;
    const char *path = getenv("PATH");
    char dir[PATH_MAX], cand[PATH_MAX];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        if (n < sizeof dir) {
            memcpy(dir, path, n);
            dir[n] = 0;
            snprintf(cand, sizeof cand, "%s/%s", dir, argv0);
            if (access(cand, X_OK) == 0 && realpath(cand, out)) return 1;
        }
        path += n + (path[n] == ':');
    }
    return 0;
}

ssize_t readlink(const char *restrict path, char *restrict buf, size_t size) {
    static ssize_t (*real)(const char *, char *, size_t);
    char exe[PATH_MAX];
    if (strcmp(path, "/proc/self/exe") == 0 && own_path(exe)) {
        size_t n = strlen(exe);
        if (n > size) n = size;
        memcpy(buf, exe, n);
        return (ssize_t)n;
    }
    if (!real) real = (ssize_t (*)(const char *, char *, size_t))dlsym(RTLD_NEXT, "readlink");
    return real(path, buf, size);
}
