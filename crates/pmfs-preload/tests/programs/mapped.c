/* Shared mappings of files. Without arguments: mappings of files in the current directory
 * against read/write through the same and other descriptions, sparse files, offsets, partial
 * munmap, msync, mremap shrinking, moving and growing, MAP_FIXED over a mapping, a fork child
 * storing through an inherited mapping, mappings past the end of file, MAP_FIXED_NOREPLACE,
 * MAP_PRIVATE, the errors of bad calls, and copies inside the kernel of a file stored to
 * through a mapping;
 * prints a transcript that must not depend on whether the library is loaded.
 * "hold FILE": maps FILE whole (shared, read-write), prints "ready" and then answers lines on
 * standard input: "show OFF LEN" prints those bytes of the mapping, "store OFF TEXT" stores
 * TEXT there and msyncs, "pread OFF LEN" reads those bytes with pread, "where" prints the
 * backing file, file offset and permissions /proc/self/maps gives for the mapping's first
 * page, "fork OFF TEXT" has a fork child store TEXT there and leave with _exit, "grow" tries
 * to double the mapping with mremap (MREMAP_MAYMOVE) and prints the result, "quit" exits
 * at once (the mapping still there); at the end of input it unmaps and exits. "poke FILE OFF TEXT" pwrites TEXT at OFF. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transcript.h"

#define PG 4096

static void text_at(const unsigned char *m, const char *what, size_t n) {
    printf("%-28s = %.*s\n", what, (int)n, (const char *)m);
    fflush(stdout);
}

static long nonzero(const unsigned char *m, size_t n) {
    long k = 0;
    for (size_t i = 0; i < n; i++)
        k += m[i] != 0;
    return k;
}

static unsigned char *map(size_t len, int prot, int flags, int fd, off_t off, const char *what) {
    unsigned char *m = mmap(NULL, len, prot, flags, fd, off);
    show(what, m == MAP_FAILED ? -1 : 0);
    return m;
}

/* Copies `n` bytes of `src` into a new file `name` with sendfile, which the kernel does from
 * its pages of `src`; prints the count and the checksum of the copy. */
static void kernel_copy(int src, const char *name, size_t n) {
    char what[64];
    int to = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
    off_t in = 0;
    snprintf(what, sizeof what, "sendfile to %s", name);
    show(what, sendfile(to, src, &in, n));
    snprintf(what, sizeof what, "%s bytes", name);
    sum_at(to, what, 0, n + 1);
    close(to);
}

/* The backing file and offset of the mapping holding `p`, as /proc/self/maps says. */
static void where(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    unsigned long want = (unsigned long)p;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        char perms[8] = "", path[4000] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %3999[^\n]", &lo, &hi, perms, &off, path) >= 4 &&
            lo <= want && want < hi) {
            printf("backing %s at %lx %s\n", path, off, perms);
            fflush(stdout);
        }
    }
    if (f)
        fclose(f);
}

static int hold(const char *path) {
    int fd = open(path, O_RDWR);
    long n = size_of(fd);
    unsigned char *m = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return 1;
    printf("ready\n");
    fflush(stdout);
    char line[4096], text[4000];
    long off, len;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "show %ld %ld", &off, &len) == 2) {
            printf("%.*s\n", (int)len, (const char *)m + off);
        } else if (sscanf(line, "store %ld %3999s", &off, text) == 2) {
            memcpy(m + off, text, strlen(text));
            printf("stored %d\n", msync(m, (size_t)n, MS_SYNC));
        } else if (sscanf(line, "pread %ld %ld", &off, &len) == 2) {
            long r = (long)pread(fd, text, (size_t)len, off);
            if (r < 0)
                printf("pread -1 errno %s\n", strerror(errno));
            else
                printf("pread %.*s\n", (int)r, text);
        } else if (sscanf(line, "fork %ld %3999s", &off, text) == 2) {
            pid_t pid = fork();
            if (pid == 0) {
                memcpy(m + off, text, strlen(text));
                _exit(0);
            }
            int status;
            printf("child %d\n", waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        } else if (strncmp(line, "grow", 4) == 0) {
            unsigned char *g = mremap(m, (size_t)n, 2 * (size_t)n, MREMAP_MAYMOVE);
            if (g == MAP_FAILED) {
                printf("grow -1 errno %s\n", strerror(errno));
            } else {
                m = g;
                n *= 2;
                printf("grown\n");
            }
        } else if (strncmp(line, "where", 5) == 0) {
            where(m);
        } else if (strncmp(line, "quit", 4) == 0) {
            exit(0);
        }
        fflush(stdout);
    }
    int r = munmap(m, (size_t)n);
    close(fd); /* fails once the mount is gone */
    return r != 0;
}

static int poke(const char *path, long off, const char *text) {
    int fd = open(path, O_RDWR);
    return pwrite(fd, text, strlen(text), off) != (ssize_t)strlen(text) || close(fd) != 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "hold") == 0)
        return hold(argv[2]);
    if (argc == 5 && strcmp(argv[1], "poke") == 0)
        return poke(argv[2], atol(argv[3]), argv[4]);

    /* Stores through a mapping, read back with read; writes read back through the mapping. */
    int fd = open("m", O_RDWR | O_CREAT, 0644);
    size_t len = 3 * PG + 100;
    show("ftruncate", ftruncate(fd, (off_t)len));
    unsigned char *m = map(len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap shared");
    for (size_t i = 0; i < len; i++)
        m[i] = (unsigned char)('a' + i * 7 % 26);
    show("msync", msync(m, len, MS_SYNC));
    sum_at(fd, "read sees the stores", 0, len);
    show("pwrite under the map", pwrite(fd, "WRITTEN", 7, 5000));
    text_at(m + 5000, "map sees the pwrite", 7);
    int other = open("m", O_RDWR);
    show("pwrite via another fd", pwrite(other, "OTHER", 5, 9000));
    text_at(m + 9000, "map sees it", 5);
    show("lseek", lseek(other, 200, SEEK_SET));
    show("write via another fd", write(other, "PLAIN", 5));
    text_at(m + 200, "map sees the write", 5);
    memcpy(m + 3 * PG + 90, "TAIL", 4);
    sum_at(other, "read sees the last page", 3 * PG, 100);
    show("ftruncate shorter", ftruncate(other, 3 * PG + 50));
    text_at(m + 3 * PG, "map after the truncate", 10);
    show("size", size_of(fd));

    /* munmap of the middle page, msync of what is left, then the rest. */
    show("munmap middle page", munmap(m + PG, PG));
    show("msync first page", msync(m, PG, MS_SYNC));
    show("msync unmapped page", msync(m + PG, PG, MS_SYNC));
    show("msync unaligned", msync(m + 1, PG, MS_SYNC));
    memcpy(m + 2 * PG + 1, "AFTER-HOLE", 10);
    show("msync last pages", msync(m + 2 * PG, 2 * PG, MS_ASYNC));
    sum_at(fd, "read after the munmap", 0, 3 * PG + 50);
    show("munmap first page", munmap(m, PG));
    show("munmap the rest", munmap(m + 2 * PG, 2 * PG));

    /* A mapping at an offset. */
    unsigned char *o = map(PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 2 * PG, "mmap at offset");
    text_at(o + 1, "offset map sees", 10);
    memcpy(o + 100, "AT-OFFSET", 9);
    sum_at(fd, "read at the offset", 2 * PG, 200);
    show("munmap offset map", munmap(o, PG));

    /* A sparse file reads zeros through a mapping and keeps them where nothing is stored. */
    int sp = open("sparse", O_RDWR | O_CREAT, 0644);
    show("ftruncate sparse", ftruncate(sp, 1 << 20));
    int ro = open("sparse", O_RDONLY);
    unsigned char *z = map(1 << 20, PROT_READ, MAP_SHARED, ro, 0, "mmap sparse read-only");
    show("nonzero bytes", nonzero(z, 1 << 20));
    unsigned char *w = map(1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, sp, 0, "mmap sparse");
    memcpy(w + (512 << 10) + 3, "MIDDLE", 6);
    show("nonzero bytes after store", nonzero(z, 1 << 20));
    show("mprotect write on read-only", mprotect(z, PG, PROT_READ | PROT_WRITE));
    sum_at(sp, "sparse file", 0, 1 << 20);
    show("munmap sparse", munmap(z, 1 << 20) | munmap(w, 1 << 20));

    /* mremap shrinking in place, then a MAP_FIXED anonymous mapping over a mapped page. */
    unsigned char *r = map(3 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap to shrink");
    unsigned char *r2 = mremap(r, 3 * PG, PG, 0);
    show("mremap shrink in place", r2 == r ? 0 : -1);
    memcpy(r, "SHRUNK", 6);
    show("msync shrunk", msync(r, PG, MS_SYNC));
    show("munmap shrunk", munmap(r, PG));
    unsigned char *mv = map(PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, PG, "mmap to move");
    unsigned char *to = mmap(NULL, PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *moved = mremap(mv, PG, PG, MREMAP_MAYMOVE | MREMAP_FIXED, to);
    show("mremap moved", moved == to ? 0 : -1);
    memcpy(moved + 10, "MOVED", 5);
    show("msync moved", msync(moved, PG, MS_SYNC));
    sum_at(fd, "read after the move", PG, 100);
    show("munmap moved", munmap(moved, PG));

    /* mremap growing a mapping after its file grew: in place where the pages after it are
     * free, refused without MREMAP_MAYMOVE where they are not, moved with it, and moved to a
     * place given with MREMAP_FIXED. */
    int gf = open("grown", O_RDWR | O_CREAT, 0644);
    show("ftruncate to map", ftruncate(gf, 2 * PG));
    unsigned char *room = mmap(NULL, 8 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *g = mmap(room, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, gf, 0);
    show("mmap with room after it", g == room ? 0 : -1);
    show("munmap the room", munmap(room + 2 * PG, 6 * PG));
    memcpy(g + 10, "FIRST", 5);
    show("ftruncate to grow", ftruncate(gf, 5 * PG));
    show("mremap grow in place", mremap(g, 2 * PG, 4 * PG, 0) == g ? 0 : -1);
    memcpy(g + 3 * PG + 7, "GROWN-IN-PLACE", 14);
    show("msync grown", msync(g, 4 * PG, MS_SYNC));
    sum_at(gf, "read the grown map", 0, 5 * PG);
    unsigned char *block =
        mmap(g + 4 * PG, PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    show("block the page after it", block == g + 4 * PG ? 0 : -1);
    show("mremap grow blocked", mremap(g, 4 * PG, 5 * PG, 0) == MAP_FAILED ? -1 : 0);
    unsigned char *g3 = mremap(g, 4 * PG, 5 * PG, MREMAP_MAYMOVE);
    show("mremap grow and move", g3 != MAP_FAILED && g3 != g ? 0 : -1);
    text_at(g3 + 10, "moved map keeps", 5);
    text_at(g3 + 3 * PG + 7, "and its grown part", 14);
    memcpy(g3 + 4 * PG + 1, "LAST-PAGE", 9);
    show("pwrite under the moved map", pwrite(gf, "PWRITTEN", 8, PG));
    text_at(g3 + PG, "moved map sees it", 8);
    show("ftruncate to grow again", ftruncate(gf, 7 * PG));
    unsigned char *target = mmap(NULL, 7 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *g4 = mremap(g3, 5 * PG, 7 * PG, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    show("mremap grow to a place", g4 == target ? 0 : -1);
    text_at(g4 + 4 * PG + 1, "map there keeps", 9);
    memcpy(g4 + 6 * PG, "SEVENTH", 7);
    show("msync there", msync(g4, 7 * PG, MS_SYNC));
    sum_at(gf, "read the map there", 0, 7 * PG);
    show("munmap grown", munmap(g4, 7 * PG) | munmap(block, PG));

    /* mremap moving a mapping of a file whose blocks lie in several places (a mapping each
     * under the library): whole, then a part of it, shrunk. */
    int fr = open("fragments", O_RDWR | O_CREAT, 0644);
    char page[PG];
    for (int i = 0; i < 64; i++) {
        memset(page, 'a' + i % 26, PG);
        if (pwrite(fr, page, PG, (off_t)i * PG) != PG)
            show("pwrite fragments", -1);
    }
    unsigned char *fm = map(64 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fr, 0, "mmap fragments");
    unsigned char *ft = mmap(NULL, 64 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *fm2 = mremap(fm, 64 * PG, 64 * PG, MREMAP_MAYMOVE | MREMAP_FIXED, ft);
    show("mremap move fragments", fm2 == ft ? 0 : -1);
    text_at(fm2 + 63 * PG, "moved fragments end with", 4);
    unsigned char *fp = mmap(NULL, 8 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *fm3 = mremap(fm2 + 4 * PG, 16 * PG, 8 * PG, MREMAP_MAYMOVE | MREMAP_FIXED, fp);
    show("mremap shrink and move part", fm3 == fp ? 0 : -1);
    text_at(fm3 + 7 * PG, "moved part ends with", 4);
    memcpy(fm3 + 7 * PG + 1, "MOVED-PART", 10);
    show("msync moved part", msync(fm3, 8 * PG, MS_SYNC));
    sum_at(fr, "read fragments", 0, 64 * PG);
    show("munmap fragments",
         munmap(fm2, 4 * PG) | munmap(fm2 + 20 * PG, 44 * PG) | munmap(fm3, 8 * PG));
    unsigned char *f = map(2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap to cover");
    unsigned char *a = mmap(f + PG, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    show("anonymous over the map", a == f + PG ? 0 : -1);
    memcpy(f + PG, "ANONYMOUS", 9);
    memcpy(f, "COVERED", 7);
    show("msync covered", msync(f, 2 * PG, MS_SYNC));
    sum_at(fd, "read after the cover", 0, 2 * PG);
    show("munmap covered", munmap(f, 2 * PG));

    /* A fork child stores through the mapping it inherited. */
    unsigned char *c = map(2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0, "mmap for fork");
    pid_t pid = fork();
    if (pid == 0) {
        memcpy(c + 300, "FROM-CHILD", 10);
        msync(c, 2 * PG, MS_SYNC);
        munmap(c, PG);
        memcpy(c + PG + 1, "CHILD-2ND", 9);
        _exit(0);
    }
    int status;
    show("child", waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    text_at(c + 300, "parent map sees child", 10);
    text_at(c + PG + 1, "and its second store", 9);
    sum_at(fd, "read sees the child", 0, 2 * PG);
    show("munmap after fork", munmap(c, 2 * PG));

    /* Past the end of file: the pages of the file are the file, the rest is the kernel's. */
    int e = open("short", O_RDWR | O_CREAT, 0644);
    show("write short", write(e, "short file", 10));
    unsigned char *s = map(4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, e, 0, "mmap past the end");
    text_at(s, "map of short", 10);
    memcpy(s + 6, "FILE!", 5);
    show("msync short", msync(s, PG, MS_SYNC));
    sum_at(e, "read short", 0, 100);
    show("pwrite short", pwrite(e, "GROWN", 5, 100));
    text_at(s + 100, "map sees it", 5);
    show("size short", size_of(e));
    show("munmap short", munmap(s, 4 * PG));

    /* MAP_FIXED_NOREPLACE over a mapping. */
    unsigned char *x = map(PG, PROT_READ, MAP_SHARED, fd, 0, "mmap to keep");
    unsigned char *y = mmap(x, PG, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    show("noreplace over a map", y == MAP_FAILED ? -errno : 0);
    show("munmap unaligned", munmap(x + 1, PG));
    show("munmap kept", munmap(x, PG));

    /* Private mappings keep their stores (another description: this one goes to the kernel). */
    int pv = open("m", O_RDWR);
    unsigned char *p = map(PG, PROT_READ | PROT_WRITE, MAP_PRIVATE, pv, 0, "mmap private");
    memcpy(p, "PRIVATE", 7);
    sum_at(pv, "read ignores private", 0, 100);
    show("munmap private", munmap(p, PG));

    /* A read-only mapping of a sparse file reads zeros in the hole and changes neither the
     * file's allocation nor its times; moved, it reads the same. */
    int sw = open("sparse-ro", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("write past a hole", pwrite(sw, "TAIL", 4, 6 * PG + 10));
    int sr = open("sparse-ro", O_RDONLY);
    struct stat before, after;
    fstat(sr, &before);
    usleep(20000);
    unsigned char *sm = map(7 * PG, PROT_READ, MAP_SHARED, sr, 0, "mmap sparse read-only");
    text_at(sm + 6 * PG + 10, "sparse map tail", 4);
    show("sparse map hole bytes", nonzero(sm, 6 * PG));
    fstat(sr, &after);
    show("allocation and times kept",
         before.st_blocks == after.st_blocks &&
                 before.st_mtim.tv_nsec == after.st_mtim.tv_nsec &&
                 before.st_ctim.tv_nsec == after.st_ctim.tv_nsec
             ? 0
             : -1);
    unsigned char *st = mmap(NULL, 7 * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *sm2 = mremap(sm, 7 * PG, 7 * PG, MREMAP_MAYMOVE | MREMAP_FIXED, st);
    show("mremap move sparse", sm2 == st ? 0 : -1);
    text_at(sm2 + 6 * PG + 10, "moved sparse map tail", 4);
    show("moved sparse hole bytes", nonzero(sm2, 6 * PG));
    show("munmap sparse", munmap(sm2, 7 * PG));
    close(sr);
    close(sw);

    /* Calls the kernel refuses. */
    map(PG, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0, "write map of read-only fd");
    map(PG, PROT_READ, MAP_SHARED, fd, 100, "unaligned offset");
    map(0, PROT_READ, MAP_SHARED, fd, 0, "zero length");
    int wo = open("m", O_WRONLY);
    map(PG, PROT_WRITE, MAP_SHARED, wo, 0, "map of write-only fd");
    map(PG, PROT_READ, MAP_SHARED, 12345, 0, "map of a bad fd");

    /* Copies inside the kernel of a file whose pages it read before stores through a
     * mapping: while mapped, after msync, and after munmap they copy what the mapping holds. */
    int k = open("k", O_RDWR | O_CREAT | O_TRUNC, 0644);
    unsigned char kpages[2 * PG];
    memset(kpages, 'k', sizeof kpages);
    show("write k", write(k, kpages, sizeof kpages));
    kernel_copy(k, "k-before", sizeof kpages);
    unsigned char *km = map(sizeof kpages, PROT_READ | PROT_WRITE, MAP_SHARED, k, 0, "mmap k");
    memcpy(km + 100, "STORED-1", 8);
    kernel_copy(k, "k-mapped", sizeof kpages);
    memcpy(km + PG + 5, "STORED-2", 8);
    show("msync k", msync(km, sizeof kpages, MS_SYNC));
    kernel_copy(k, "k-synced", sizeof kpages);
    memcpy(km + 3000, "STORED-3", 8);
    show("munmap k", munmap(km, sizeof kpages));
    kernel_copy(k, "k-unmapped", sizeof kpages);
    close(k);

    /* A large sparse file mapped whole, read-only: its holes stay holes. */
    int big = open("sparse-big", O_RDWR | O_CREAT | O_TRUNC, 0644);
    size_t big_len = (128 << 20) + PG;
    show("pwrite past the hole", pwrite(big, "TAIL", 4, (off_t)(128 << 20)));
    unsigned char *bm = map(big_len, PROT_READ, MAP_SHARED, big, 0, "mmap sparse whole");
    text_at(bm + (128 << 20), "tail through the map", 4);
    show("a hole through the map", bm[64 << 20]);
    show("munmap sparse", munmap(bm, big_len));
    struct stat bst;
    fstat(big, &bst);
    show("blocks of the sparse file", (long)bst.st_blocks);
    close(big);

    show("size", size_of(fd));
    sum_at(fd, "whole file", 0, (size_t)size_of(fd));
    show("close", close(fd) | close(other) | close(sp) | close(ro) | close(e) | close(wo) |
                      close(pv) | close(gf) | close(fr));
    return 0;
}
