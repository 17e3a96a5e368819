// fixlab's C++ harness: main() runs the task's tests (their own main, renamed), then writes the run's proof.
// The secret is read only here, after the last assertion held, so no candidate code runs while it is in memory.
#include <stdio.h>
#include <unistd.h>

int fixlab_tests();

int main() {
    int rc = fixlab_tests();
    fflush(stdout);
    fflush(stderr);
    if (rc != 0) _exit(rc & 0xff);
    unsigned char secret[32];
    size_t got = 0;
    while (got < sizeof secret) {
        ssize_t n = read(4, secret + got, sizeof secret - got);
        if (n <= 0) _exit(70);
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    char line[2 + 64 + 1];
    line[0] = 'P';
    line[1] = ':';
    for (size_t i = 0; i < sizeof secret; i++) {
        line[2 + 2 * i] = hex[secret[i] >> 4];
        line[3 + 2 * i] = hex[secret[i] & 15];
    }
    line[66] = '\n';
    if (write(3, line, sizeof line) != (ssize_t)sizeof line) _exit(70);
    _exit(0);
}
