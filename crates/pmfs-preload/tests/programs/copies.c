/* Calls the library forwards to the kernel that depend on a file's size: copy_file_range,
 * sendfile and splice, which read it, pwritev2 appending to it, and ioctl(FIONREAD). A file is
 * grown with write and ftruncate (served in userspace under the library, so the kernel never
 * saw its new size) and then copied with each of them, then appended to; the transcript
 * (bytes copied, checksums of the copies and of the file) must not depend on whether the
 * library is loaded. Then a read-only description outlives an mmap the kernel refuses. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transcript.h"

#define BIG (3 << 20)

static long copy_all(int from, int to) {
    loff_t in = 0, out = 0;
    long total = 0;
    for (;;) {
        ssize_t n = copy_file_range(from, &in, to, &out, 8 << 20, 0);
        if (n <= 0)
            return n < 0 ? -1 : total;
        total += n;
    }
}

static long send_all(int from, int to) {
    off_t in = 0;
    long total = 0;
    for (;;) {
        ssize_t n = sendfile(to, from, &in, 8 << 20);
        if (n <= 0)
            return n < 0 ? -1 : total;
        total += n;
    }
}

/* Splices what lies from `off` to the end of `from` into a pipe; returns how much came. */
static long splice_tail(int from, loff_t off) {
    int p[2];
    if (pipe(p) != 0)
        return -1;
    ssize_t n = splice(from, &off, p[1], NULL, 65536, 0);
    close(p[0]);
    close(p[1]);
    return n;
}

/* Copies `src` into a new file `name` with `copy` and prints the count and the checksum. */
static void copy_with(int src, long size, const char *stage, const char *name,
                      long (*copy)(int, int)) {
    char what[64];
    int to = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
    snprintf(what, sizeof what, "%s: %s", stage, name);
    show(what, copy(src, to));
    snprintf(what, sizeof what, "%s: %s bytes", stage, name);
    sum_at(to, what, 0, (size_t)size + 1);
    close(to);
}

static void copies(int src, const char *stage) {
    char what[64];
    long size = size_of(src);
    snprintf(what, sizeof what, "%s: size", stage);
    show(what, size);
    copy_with(src, size, stage, "copy_file_range", copy_all);
    copy_with(src, size, stage, "sendfile", send_all);
    snprintf(what, sizeof what, "%s: splice last 100", stage);
    show(what, splice_tail(src, size - 100));
}

int main(void) {
    char *buf = malloc(BIG);
    for (size_t i = 0; i < BIG; i++)
        buf[i] = (char)(i * 13 + i / 4096);
    int src = open("src", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("open", src >= 0);
    show("write 4096", write(src, buf, 4096));
    copies(src, "small");
    show("write 3 MiB", write(src, buf, BIG));
    copies(src, "grown");
    show("ftruncate +5000", ftruncate(src, 4096 + BIG + 5000));
    copies(src, "extended");
    show("ftruncate 10000", ftruncate(src, 10000));
    copies(src, "shrunk");
    /* Appends the kernel places: at the end it knows of. */
    show("write 5000", write(src, buf, 5000));
    struct iovec iov = {buf + 7, 3000};
    show("pwritev2 RWF_APPEND", pwritev2(src, &iov, 1, 0, RWF_APPEND));
    show("size after it", size_of(src));
    sum_at(src, "bytes after it", 0, 20000);
    int app = open("src", O_WRONLY | O_APPEND);
    show("write 4000", write(src, buf, 4000));
    show("pwritev2 on O_APPEND", pwritev2(app, &iov, 1, -1, 0));
    close(app);
    show("size after that", size_of(src));
    sum_at(src, "bytes after that", 0, 30000);
    /* FIONREAD answers the size less the offset. */
    int left = -1;
    show("ftruncate 50000", ftruncate(src, 50000));
    show("lseek 100", lseek(src, 100, SEEK_SET));
    show("ioctl FIONREAD", ioctl(src, FIONREAD, &left));
    show("bytes left", left);
    /* A mapping the kernel refuses (shared and writable, of a read-only description) leaves
     * the description as it was: it reads what served calls made of the file since. */
    int ro = open("src", O_RDONLY);
    sum_at(ro, "read only", 0, 100);
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0);
    show("writable mmap of it refused", m == MAP_FAILED && errno == EACCES);
    show("ftruncate 60000", ftruncate(src, 60000));
    show("pwrite at 70000", pwrite(src, buf, 1000, 70000));
    sum_at(ro, "read only after them", 59000, 13000);
    close(ro);
    free(buf);
    return close(src) != 0;
}
