/* O_APPEND writes. Without arguments: appends of every size and kind on files in the current
 * directory, mixed with in-place writes and truncation through other descriptions, printing a
 * transcript of results, offsets, sizes and checksums that must not depend on whether the
 * library is loaded. With "hammer ID COUNT": appends COUNT records to "shared", one write
 * each, for a test that runs several of these at once; record i of writer ID is
 * "ID:i:LEN:" padded with the letter 'a' + ID to LEN bytes, the last one a newline. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transcript.h"

static long offset(int fd) { return (long)lseek(fd, 0, SEEK_CUR); }

static void sum_of(int fd, const char *what) {
    long n = size_of(fd);
    unsigned char *b = calloc(1, (size_t)n + 1);
    ssize_t r = pread(fd, b, (size_t)n, 0);
    printf("%-28s = %zd sum %lx\n", what, r, r > 0 ? fnv(b, (size_t)r) : 0UL);
    fflush(stdout);
    free(b);
}

static void filled(char *b, size_t n, int seed) {
    for (size_t i = 0; i < n; i++)
        b[i] = (char)('A' + (i * 7 + (size_t)seed) % 26);
}

static int hammer(int id, int count) {
    int fd = open("shared", O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0)
        return 1;
    char rec[5000];
    for (int i = 0; i < count; i++) {
        size_t len = 20 + (size_t)(i * 997 + id * 131) % 4900;
        int head = snprintf(rec, sizeof rec, "%d:%d:%zu:", id, i, len);
        memset(rec + head, 'a' + id, len - (size_t)head - 1);
        rec[len - 1] = '\n';
        if (write(fd, rec, len) != (ssize_t)len)
            return 1;
    }
    return close(fd) != 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "hammer") == 0)
        return hammer(atoi(argv[2]), atoi(argv[3]));

    static char buf[20000];
    int a = open("log", O_WRONLY | O_APPEND | O_CREAT, 0644);
    show("open append-only", a >= 0);
    size_t sizes[] = {1, 4095, 4096, 5000, 3, 12288, 7};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        filled(buf, sizes[i], (int)i);
        show("append write", write(a, buf, sizes[i]));
        show("  offset after", offset(a));
    }
    struct iovec v[3] = {{buf, 10}, {buf + 100, 4000}, {buf + 50, 1}};
    show("append writev", writev(a, v, 3));
    show("  offset after", offset(a));
    show("seek append-only to 5", lseek(a, 5, SEEK_SET));
    show("append pwrite at 0", pwrite(a, "PWRITE", 6, 0));
    show("  offset unchanged", offset(a));
    show("append pwritev at 1", pwritev(a, v, 2, 1));
    show("  offset unchanged", offset(a));
    show("write appends past seek", write(a, "after-seek", 10));
    show("  offset after", offset(a));

    int b = open("log", O_RDWR | O_APPEND);
    show("seek read-write append", lseek(b, 0, SEEK_SET));
    show("read from start", read(b, buf, 9));
    show("  offset after read", offset(b));
    show("append via read-write", write(b, "RW-APPEND", 9));
    show("  offset after", offset(b));

    int c = open("log", O_RDWR);
    show("in-place write", write(c, "HEAD", 4));
    show("append after it", write(a, "tail", 4));
    show("  offset after", offset(a));
    show("truncate to 100", ftruncate(c, 100));
    show("append after truncate", write(a, "short", 5));
    show("  offset after", offset(a));
    show("F_SETFL append on c", fcntl(c, F_SETFL, O_APPEND));
    show("c appends now", write(c, "via-c", 5));
    show("  offset of c", offset(c));
    show("F_SETFL no append on c", fcntl(c, F_SETFL, 0));
    show("seek c to 2", lseek(c, 2, SEEK_SET));
    show("c writes in place", write(c, "mid", 3));
    show("size", size_of(c));
    sum_of(c, "whole file");

    int d = dup(a);
    show("append via dup", write(d, "dup", 3));
    show("  offset shared", offset(a));
    show("size", size_of(c));
    sum_of(c, "whole file");
    show("close", close(a) | close(b) | close(c) | close(d));
    return 0;
}
