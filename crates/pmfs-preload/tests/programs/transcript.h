/* Transcript lines shared by the test programs: what was called, its result, and the errno
 * when it failed; a checksum of bytes; a file's size and the checksum of a range of it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static inline long size_of(int fd) {
    struct stat st;
    return fstat(fd, &st) < 0 ? -1 : (long)st.st_size;
}

static inline void sum_at(int fd, const char *what, off_t off, size_t n) {
    unsigned char *b = calloc(1, n);
    ssize_t r = pread(fd, b, n, off);
    printf("%-28s = %zd sum %lx\n", what, r, r > 0 ? fnv(b, (size_t)r) : 0UL);
    fflush(stdout);
    free(b);
}
