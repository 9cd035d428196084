/* Transcript lines shared by the test programs: what was called, its result, and the errno
 * when it failed; and a checksum of bytes. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

static inline void show(const char *what, long r) {
    printf("%-28s = %ld", what, r);
    if (r < 0)
        printf(" errno %s", strerror(errno));
    printf("\n");
    fflush(stdout);
}

static inline unsigned long fnv(const unsigned char *p, size_t n) {
    unsigned long h = 1469598103934665603UL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211UL;
    return h;
}
