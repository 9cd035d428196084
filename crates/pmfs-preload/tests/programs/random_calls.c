/* Random sequences of descriptor calls on three files: opens with assorted flags, duplicates,
 * closes, reads and writes (plain, positioned, vectored), seeks (SEEK_DATA and SEEK_HOLE too),
 * truncations, allocations and punched or zeroed ranges, F_SETFL O_APPEND, fsync, fstat and
 * unlinks, and calls the library leaves to the kernel or maps from the pool (by path, copies,
 * RWF_APPEND, shared mappings), at unaligned offsets and lengths up to a few blocks. Every
 * call and its result (and the checksum of what it read) is one transcript line. Lines a local
 * file system may answer differently (where holes start, how many blocks a file holds) start
 * with '~'.
 *
 * PMFS_RANDOM_CALLS (default 9000) calls in all, in sequences of 300, each with a seed of its
 * own and files of its own, which it reads whole at its end and then removes (the last
 * sequence leaves them). The local run's directory is in $TMPDIR (or /tmp): where that file
 * system cannot zero a range (tmpfs), every run punches a hole instead. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/uio.h>

#include "transcript.h"

#define SLOTS 8
#define SPAN 70000
#define MAX_LEN 20000

static unsigned long long state;

static unsigned next(unsigned n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (unsigned)((state >> 11) % n);
}

static unsigned char data[MAX_LEN];
static unsigned char got[MAX_LEN];

/* Bytes for call number k: every write leaves bytes of its own. */
static void fill(unsigned k, size_t n) {
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(k * 31 + i * 7 + (i >> 9));
}

static void result(const char *what, long r, const unsigned char *read) {
    printf("%s = %ld", what, r);
    if (r < 0)
        printf(" errno %s", strerror(errno));
    else if (read != NULL)
        printf(" sum %lx", fnv(read, (size_t)r));
    printf("\n");
}

/* A vectored write (of call k's bytes) or read of len bytes in two pieces, at off or at the
 * descriptor's offset. */
static void vectored(unsigned k, int s, int fd, int writing, size_t len, off_t off) {
    unsigned char *buf = writing ? data : got;
    size_t a = len / 3, b = len - a;
    struct iovec v[2] = {{buf, a}, {buf + a, b}};
    int at = (int)next(2);
    char what[96];
    snprintf(what, sizeof what, "%u %s%s %d %zu+%zu at %ld", k, at ? "p" : "",
             writing ? "writev" : "readv", s, a, b, at ? (long)off : -1L);
    long r;
    if (writing)
        r = at ? pwritev(fd, v, 2, off) : writev(fd, v, 2);
    else
        r = at ? preadv(fd, v, 2, off) : readv(fd, v, 2);
    result(what, r, writing ? NULL : got);
}

/* The calls of a sequence the library leaves to the kernel, or serves from the pool: by path
 * (stat, truncate, rename), copies between descriptors (copy_file_range, sendfile), an append
 * with RWF_APPEND, and shared mappings read, or stored into and synced. */
static void by_path_or_kernel(unsigned k, int s, const int *fds, char (*names)[32], off_t off,
                              size_t len) {
    char what[160];
    int fd = fds[s], t = (int)next(SLOTS);
    const char *name = names[next(3)];
    switch (next(8)) {
    case 0: {
        struct stat st;
        snprintf(what, sizeof what, "%u stat %s", k, name);
        result(what, stat(name, &st) < 0 ? -1 : (long)st.st_size, NULL);
        break;
    }
    case 1:
        snprintf(what, sizeof what, "%u truncate %s %ld", k, name, (long)off);
        result(what, truncate(name, off), NULL);
        break;
    case 2: {
        const char *to = names[next(3)];
        snprintf(what, sizeof what, "%u rename %s %s", k, name, to);
        result(what, rename(name, to), NULL);
        break;
    }
    case 3: {
        loff_t from = off, at = (loff_t)next(SPAN);
        snprintf(what, sizeof what, "%u copy_file_range %d %ld -> %d %ld %zu", k, s, (long)from,
                 t, (long)at, len);
        result(what, copy_file_range(fd, &from, fds[t], &at, len, 0), NULL);
        break;
    }
    case 4: {
        off_t from = off;
        snprintf(what, sizeof what, "%u sendfile %d %ld -> %d %zu", k, s, (long)from, t, len);
        result(what, sendfile(fds[t], fd, &from, len), NULL);
        break;
    }
    case 5: {
        fill(k, len);
        struct iovec v = {data, len};
        snprintf(what, sizeof what, "%u pwritev2 append %d %zu", k, s, len);
        result(what, pwritev2(fd, &v, 1, off, RWF_APPEND), NULL);
        break;
    }
    default: {
        /* A shared mapping: of the whole file through a read-only descriptor of its own, read
         * in a range; or of the pages of a range of the descriptor's file, stored into and
         * synced (only those pages, and none for no bytes: a store allocates the pages it
         * touches, through the kernel, and the library the holes of the range it maps). */
        int store = next(8) == 7;
        int mfd = store ? fd : open(name, O_RDONLY);
        long size = size_of(mfd);
        if (store)
            snprintf(what, sizeof what, "%u mmap store %d", k, s);
        else
            snprintf(what, sizeof what, "%u mmap read %s", k, name);
        if (size <= 0) {
            result(what, size, NULL);
        } else if (store && len == 0) {
            result(what, 0, NULL);
        } else {
            size_t a = (size_t)off % (size_t)size;
            size_t n = len < (size_t)size - a ? len : (size_t)size - a;
            size_t from = store ? a / 4096 * 4096 : 0;
            size_t span = store ? a + n - from : (size_t)size;
            int prot = store ? PROT_READ | PROT_WRITE : PROT_READ;
            unsigned char *m = mmap(NULL, span, prot, MAP_SHARED, mfd, (off_t)from);
            if (m == MAP_FAILED) {
                result(what, -1, NULL);
            } else if (store) {
                fill(k, n);
                memcpy(m + (a - from), data, n);
                result(what, msync(m, span, MS_SYNC) < 0 ? -1 : (long)n, NULL);
                munmap(m, span);
            } else {
                memcpy(got, m + a, n);
                result(what, (long)n, got);
                munmap(m, span);
            }
        }
        if (!store && mfd >= 0)
            close(mfd);
    }
    }
}

/* Whether the temporary directory's file system zeroes ranges (FALLOC_FL_ZERO_RANGE). */
static int zero_range_works(void) {
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/random-calls-%d", dir != NULL && *dir ? dir : "/tmp",
             (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return 1;
    int r = fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, 4096);
    close(fd);
    unlink(path);
    return r == 0;
}

static int zero_range;

static void sequence(unsigned seed, unsigned calls, int last) {
    static const int open_flags[] = {
        O_RDWR | O_CREAT, O_RDWR, O_RDWR | O_APPEND | O_CREAT, O_RDONLY,
        O_WRONLY | O_TRUNC | O_CREAT, O_WRONLY | O_APPEND, O_RDWR | O_CREAT | O_EXCL,
    };
    static const int fallocate_modes[] = {
        0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
    };
    static const int whences[] = {SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA, SEEK_HOLE};
    int fds[SLOTS];
    char names[3][32];
    char what[160];
    for (int i = 0; i < SLOTS; i++)
        fds[i] = -1;
    for (int i = 0; i < 3; i++)
        snprintf(names[i], sizeof names[i], "s%u-%c", seed, 'a' + i);
    state = 0x9e3779b97f4a7c15ULL * (seed + 1);
    printf("sequence %u\n", seed);
    for (unsigned k = 0; k < calls; k++) {
        int s = (int)next(SLOTS);
        int fd = fds[s];
        off_t off = (off_t)next(SPAN);
        size_t len = next(4) == 0 ? next(64) : next(MAX_LEN);
        switch (next(25)) {
        case 0:
        case 1: {
            int f = open_flags[next(sizeof open_flags / sizeof open_flags[0])];
            const char *name = names[next(3)];
            if (fd >= 0)
                close(fd);
            fds[s] = open(name, f, 0644);
            snprintf(what, sizeof what, "%u open %s %#x -> %d", k, name, f, s);
            result(what, fds[s] < 0 ? -1 : 0, NULL);
            break;
        }
        case 2: {
            int t = (int)next(SLOTS);
            if (t == s)
                break;
            if (fds[t] >= 0)
                close(fds[t]);
            fds[t] = dup(fd);
            snprintf(what, sizeof what, "%u dup %d -> %d", k, s, t);
            result(what, fds[t] < 0 ? -1 : 0, NULL);
            break;
        }
        case 3:
            snprintf(what, sizeof what, "%u close %d", k, s);
            result(what, close(fd), NULL);
            fds[s] = -1;
            break;
        case 4:
            fill(k, len);
            snprintf(what, sizeof what, "%u pwrite %d %zu at %ld", k, s, len, (long)off);
            result(what, pwrite(fd, data, len, off), NULL);
            break;
        case 5:
            fill(k, len);
            snprintf(what, sizeof what, "%u write %d %zu", k, s, len);
            result(what, write(fd, data, len), NULL);
            break;
        case 6:
            snprintf(what, sizeof what, "%u pread %d %zu at %ld", k, s, len, (long)off);
            result(what, pread(fd, got, len, off), got);
            break;
        case 7:
            snprintf(what, sizeof what, "%u read %d %zu", k, s, len);
            result(what, read(fd, got, len), got);
            break;
        case 8: {
            int w = whences[next(5)];
            off_t to = w == SEEK_SET || w >= SEEK_DATA ? off : off - SPAN / 2;
            snprintf(what, sizeof what, "%s%u lseek %d %ld whence %d", w >= SEEK_DATA ? "~" : "",
                     k, s, (long)to, w);
            long r = (long)lseek(fd, to, w);
            result(what, r, NULL);
            if (w >= SEEK_DATA) {
                /* Where the offset went depends on the holes; put it somewhere all agree. */
                lseek(fd, off, SEEK_SET);
            }
            break;
        }
        case 9:
            snprintf(what, sizeof what, "%u ftruncate %d %ld", k, s, (long)off);
            result(what, ftruncate(fd, off), NULL);
            break;
        case 10: {
            int mode = fallocate_modes[next(5)];
            if ((mode & FALLOC_FL_ZERO_RANGE) && !zero_range)
                mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
            snprintf(what, sizeof what, "%u fallocate %d mode %#x %ld+%zu", k, s, mode, (long)off,
                     len);
            result(what, fallocate(fd, mode, off, (off_t)len + 1), NULL);
            break;
        }
        case 11: {
            struct stat st;
            snprintf(what, sizeof what, "%u fstat %d", k, s);
            int r = fstat(fd, &st);
            result(what, r < 0 ? -1 : (long)st.st_size, NULL);
            if (r == 0)
                printf("~%u blocks %ld\n", k, (long)st.st_blocks);
            break;
        }
        case 12:
            fill(k, len);
            vectored(k, s, fd, 1, len, off);
            break;
        case 13:
            vectored(k, s, fd, 0, len, off);
            break;
        case 14: {
            int fl = fcntl(fd, F_GETFL);
            snprintf(what, sizeof what, "%u setfl %d append flipped", k, s);
            result(what, fl < 0 ? -1 : fcntl(fd, F_SETFL, fl ^ O_APPEND), NULL);
            break;
        }
        case 15: {
            int data_only = (int)next(2);
            snprintf(what, sizeof what, "%u %s %d", k, data_only ? "fdatasync" : "fsync", s);
            result(what, data_only ? fdatasync(fd) : fsync(fd), NULL);
            break;
        }
        case 16: {
            const char *name = names[next(3)];
            snprintf(what, sizeof what, "%u unlink %s", k, name);
            result(what, unlink(name), NULL);
            break;
        }
        default:
            by_path_or_kernel(k, s, fds, names, off, len);
        }
    }
    for (int i = 0; i < SLOTS; i++) {
        if (fds[i] >= 0) {
            snprintf(what, sizeof what, "end size %d", i);
            show(what, size_of(fds[i]));
            close(fds[i]);
        }
    }
    /* The files as they were left, read whole; then gone, but for the last sequence's. */
    for (int i = 0; i < 3; i++) {
        int fd = open(names[i], O_RDONLY);
        unsigned long h = 1469598103934665603UL;
        long size = 0;
        ssize_t r;
        while (fd >= 0 && (r = read(fd, got, sizeof got)) > 0) {
            for (ssize_t j = 0; j < r; j++)
                h = (h ^ got[j]) * 1099511628211UL;
            size += r;
        }
        printf("end %s = %ld sum %lx\n", names[i], fd < 0 ? -1L : size, h);
        if (fd >= 0)
            close(fd);
        if (!last)
            unlink(names[i]);
    }
    fflush(stdout);
}

int main(void) {
    const char *env = getenv("PMFS_RANDOM_CALLS");
    unsigned calls = env != NULL ? (unsigned)strtoul(env, NULL, 10) : 9000;
    zero_range = zero_range_works();
    for (unsigned seed = 0; seed * 300 < calls; seed++)
        sequence(seed, calls - seed * 300 < 300 ? calls - seed * 300 : 300,
                 (seed + 1) * 300 >= calls);
    return 0;
}
