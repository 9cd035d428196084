/* Exercises every interposed call on files in the current directory and prints a transcript
 * of results, errnos, sizes and checksums: the transcript must not depend on whether the
 * library is loaded. argv[1] == "exec-child" is the re-executed image of the exec step. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "transcript.h"

static long early_read = -1;

/* Runs before main: file calls from a constructor must be forwarded correctly. */
__attribute__((constructor)) static void early(void) {
    char c;
    int fd = open("/proc/self/stat", O_RDONLY);
    early_read = read(fd, &c, 1);
    close(fd);
}

struct job {
    int fd, id;
};

static int same_stat(const struct stat *a, const struct stat *k) {
    return a->st_dev == k->st_dev && a->st_ino == k->st_ino && a->st_mode == k->st_mode &&
           a->st_nlink == k->st_nlink && a->st_uid == k->st_uid && a->st_gid == k->st_gid &&
           a->st_rdev == k->st_rdev && a->st_size == k->st_size &&
           a->st_blksize == k->st_blksize && a->st_blocks == k->st_blocks &&
           a->st_atim.tv_sec == k->st_atim.tv_sec && a->st_atim.tv_nsec == k->st_atim.tv_nsec &&
           a->st_mtim.tv_sec == k->st_mtim.tv_sec && a->st_mtim.tv_nsec == k->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == k->st_ctim.tv_sec && a->st_ctim.tv_nsec == k->st_ctim.tv_nsec;
}

/* Whether fstat through libc (served in userspace under the library) reports what the
 * kernel does, field by field. */
static int fstat_agrees(int fd) {
    struct stat a, k;
    if (fstat(fd, &a) != 0 || syscall(SYS_fstat, fd, &k) != 0)
        return -1;
    return same_stat(&a, &k);
}

/* The same for stat (lstat with AT_SYMLINK_NOFOLLOW) of `path`: 1 if both agree, -1 if both
 * fail with the same errno, other values if they differ. */
static int stat_agrees(const char *path, int flags) {
    struct stat a, k;
    int ra = flags ? lstat(path, &a) : stat(path, &a);
    int ea = errno;
    int rk = syscall(SYS_newfstatat, AT_FDCWD, path, &k, flags);
    int ek = errno;
    if (ra != rk)
        return -2;
    if (ra != 0)
        return ea == ek ? -1 : -3;
    return same_stat(&a, &k);
}

static int same_ts(struct statx_timestamp a, struct statx_timestamp k) {
    return a.tv_sec == k.tv_sec && a.tv_nsec == k.tv_nsec;
}

/* The same for statx of `path` (from the working directory, or of `fd` with an empty path),
 * over the basic fields, the mask of what was answered and the mount id. */
static int statx_agrees(int fd, const char *path, int flags) {
    struct statx a, k;
    int dirfd = *path ? AT_FDCWD : fd;
    int ra = statx(dirfd, path, flags, STATX_BASIC_STATS, &a);
    int ea = errno;
    int rk = syscall(SYS_statx, dirfd, path, flags, STATX_BASIC_STATS, &k);
    int ek = errno;
    if (ra != rk)
        return -2;
    if (ra != 0)
        return ea == ek ? -1 : -3;
    return a.stx_mask == k.stx_mask && a.stx_mnt_id == k.stx_mnt_id &&
           a.stx_dev_major == k.stx_dev_major && a.stx_dev_minor == k.stx_dev_minor &&
           a.stx_ino == k.stx_ino && a.stx_mode == k.stx_mode && a.stx_nlink == k.stx_nlink &&
           a.stx_uid == k.stx_uid && a.stx_gid == k.stx_gid && a.stx_size == k.stx_size &&
           a.stx_blocks == k.stx_blocks && a.stx_blksize == k.stx_blksize &&
           same_ts(a.stx_atime, k.stx_atime) && same_ts(a.stx_mtime, k.stx_mtime) &&
           same_ts(a.stx_ctime, k.stx_ctime);
}

static void *writer(void *arg) {
    struct job *j = arg;
    unsigned char b[4096];
    for (int round = 0; round < 50; round++) {
        memset(b, 'a' + j->id + round % 3, sizeof b);
        if (pwrite(j->fd, b, sizeof b, (off_t)(j->id * 8 + round % 8) * 4096) != sizeof b)
            abort();
    }
    return NULL;
}

/* Records written and read with write()/read() on one descriptor by several threads at once:
 * the kernel moves the shared offset atomically, so each record lands in a range of its own
 * and each is read back exactly once. */
#define RECORDS 200
#define RECORD 512

static void *record_writer(void *arg) {
    struct job *j = arg;
    unsigned char b[RECORD];
    for (int i = 0; i < RECORDS; i++) {
        memset(b, 0, sizeof b);
        snprintf((char *)b, sizeof b, "record %d.%d", j->id, i);
        if (write(j->fd, b, sizeof b) != sizeof b)
            abort();
    }
    return NULL;
}

static unsigned char seen[4][RECORDS];

static void *record_reader(void *arg) {
    struct job *j = arg;
    unsigned char b[RECORD];
    ssize_t r;
    while ((r = read(j->fd, b, sizeof b)) == sizeof b) {
        int id, i;
        if (sscanf((char *)b, "record %d.%d", &id, &i) != 2 || id < 0 || id > 3 || i < 0 ||
            i >= RECORDS)
            abort();
        __atomic_add_fetch(&seen[id][i], 1, __ATOMIC_RELAXED);
    }
    if (r != 0)
        abort();
    return NULL;
}

/* Runs four threads of `body` on descriptor `fd`. */
static void four_threads(void *(*body)(void *), int fd) {
    pthread_t th[4];
    struct job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct job){fd, i};
        pthread_create(&th[i], NULL, body, &jobs[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
}

int main(int argc, char **argv) {
    unsigned char buf[20000];
    if (argc == 3 && strcmp(argv[1], "exec-child") == 0) {
        int fd = atoi(argv[2]);
        show("exec child read", read(fd, buf, 4));
        show("exec child offset", lseek(fd, 0, SEEK_CUR));
        return 0;
    }
    show("constructor read", early_read);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 31 + i / 251);

    int fd = open("f", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("open", fd >= 0);
    show("write 10000", write(fd, buf, 10000));
    show("offset", lseek(fd, 0, SEEK_CUR));
    show("pwrite past eof", pwrite(fd, buf + 7, 100, 20000));
    show("size", size_of(fd));
    /* A regular file is no terminal: under the library, answered without a FUSE round trip. */
    int ttys = 0, enotty = 0;
    for (int i = 0; i < 1000; i++) {
        errno = 0;
        ttys += isatty(fd);
        enotty += errno == ENOTTY;
    }
    show("isatty, of 1000", ttys);
    show("ENOTTY, of 1000", enotty);
    struct termios tio;
    show("ioctl TCGETS", ioctl(fd, TCGETS, &tio));
    sum_at(fd, "pread across the hole", 9950, 200);
    sum_at(fd, "pread short at eof", 20050, 100);
    sum_at(fd, "pread past eof", 30000, 10);
    /* Ranges that end past the largest offset: EINVAL, before any size limit. */
    const off_t last = 0x7fffffffffffffffLL - 50;
    show("pread past the last offset", pread(fd, buf, 100, last));
    show("pwrite past the last offset", pwrite(fd, buf, 100, last));
    show("offset after preads", lseek(fd, 0, SEEK_CUR));
    show("lseek end", lseek(fd, -5, SEEK_END));
    show("read at end", read(fd, buf + 15000, 100));
    show("read at eof", read(fd, buf + 15000, 100));
    show("lseek64 set", lseek64(fd, 1000, SEEK_SET));

    struct iovec iov[3] = {{buf, 10}, {buf + 100, 0}, {buf + 200, 4000}};
    show("writev", writev(fd, iov, 3));
    show("offset", lseek(fd, 0, SEEK_CUR));
    show("pwritev", pwritev(fd, iov, 3, 15000));
    unsigned char r1[100], r2[5000];
    struct iovec riov[2] = {{r1, sizeof r1}, {r2, sizeof r2}};
    show("preadv", preadv(fd, riov, 2, 998));
    printf("preadv sums %lx %lx\n", fnv(r1, sizeof r1), fnv(r2, sizeof r2));
    show("preadv past the last offset", preadv(fd, riov, 2, last));
    show("pwritev past the last offset", pwritev(fd, iov, 3, last));
    show("lseek", lseek(fd, 20090, SEEK_SET));
    show("readv short", readv(fd, riov, 2));
    show("offset", lseek(fd, 0, SEEK_CUR));

    /* The lowest free number: the library keeps its own descriptors out of the way. */
    int d = dup(fd);
    show("dup", d);
    show("lseek on fd", lseek(fd, 123, SEEK_SET));
    show("offset seen by dup", lseek(d, 0, SEEK_CUR));
    show("read via dup", read(d, r1, 10));
    show("offset of fd", lseek(fd, 0, SEEK_CUR));
    show("dup2", dup2(fd, 50));
    show("dup2 same", dup2(50, 50));
    show("dup3 cloexec", dup3(fd, 51, O_CLOEXEC));
    show("dup3 same", dup3(51, 51, 0));
    show("F_GETFD 51", fcntl(51, F_GETFD));
    int f60 = fcntl(fd, F_DUPFD, 60);
    show("F_DUPFD >= 60", f60 >= 60);
    int f70 = fcntl(fd, F_DUPFD_CLOEXEC, 70);
    show("F_DUPFD_CLOEXEC >= 70", f70 >= 70);
    show("F_GETFD", fcntl(f70, F_GETFD));
    show("F_GETFL accmode", fcntl(f60, F_GETFL) & O_ACCMODE);
    show("write via 50", write(50, "fifty", 5));
    show("offset via 60", lseek(f60, 0, SEEK_CUR));

    int a = open("f", O_WRONLY | O_APPEND);
    show("append write", write(a, "APPEND", 6));
    show("size", size_of(fd));
    show("append pwrite (appends)", pwrite(a, "PW", 2, 0));
    show("size", size_of(fd));
    show("F_SETFL no append", fcntl(a, F_SETFL, 0));
    show("lseek on a", lseek(a, 3, SEEK_SET));
    show("write in place", write(a, "xyz", 3));
    show("size", size_of(fd));
    sum_at(fd, "whole file", 0, 30000);
    show("close a", close(a));

    /* Duplicated before its first call: the library opens the two numbers on their own, and
     * they must still agree on the description's O_APPEND. */
    int b = open("f", O_WRONLY);
    int b2 = dup(b);
    show("write b", write(b, "bb", 2));
    show("write b2", write(b2, "b2", 2));
    show("F_SETFL append on b", fcntl(b, F_SETFL, O_APPEND));
    show("lseek b2", lseek(b2, 0, SEEK_SET));
    show("write b2 appends", write(b2, "APP2", 4));
    show("size", size_of(fd));
    show("F_SETFL no append on b2", fcntl(b2, F_SETFL, 0));
    show("lseek b", lseek(b, 5, SEEK_SET));
    show("write b in place", write(b, "in", 2));
    show("size", size_of(fd));
    sum_at(fd, "whole file", 0, 30000);
    show("close b", close(b));
    show("close b2", close(b2));

    show("ftruncate shrink", ftruncate(fd, 4097));
    show("size", size_of(fd));
    sum_at(fd, "after shrink", 4000, 200);
    show("ftruncate grow", ftruncate(fd, 9000));
    sum_at(fd, "grown part", 4000, 5000);
    show("fallocate", fallocate(fd, 0, 0, 65536));
    show("size", size_of(fd));
    show("fallocate keep size", fallocate(fd, FALLOC_FL_KEEP_SIZE, 65536, 65536));
    show("size", size_of(fd));
    show("punch hole", fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2048, 8192));
    sum_at(fd, "after punch", 0, 65536);
    struct statx sx;
    show("statx", statx(fd, "", AT_EMPTY_PATH, STATX_SIZE, &sx));
    show("statx size", (long)sx.stx_size);
    show("fstat agrees with the kernel", fstat_agrees(fd));
    show("fchmod", fchmod(fd, 0640));
    show("fstat agrees after fchmod", fstat_agrees(fd));
    show("stat agrees with the kernel", stat_agrees("f", 0));
    show("lstat agrees with the kernel", stat_agrees("f", AT_SYMLINK_NOFOLLOW));
    show("stat of a missing file", stat_agrees("missing", 0));
    show("statx agrees with the kernel", statx_agrees(fd, "f", 0));
    show("statx of the descriptor agrees", statx_agrees(fd, "", AT_EMPTY_PATH));
    show("statx of a missing file", statx_agrees(fd, "missing", 0));
    show("symlink", symlink("f", "link"));
    show("statx through a symlink", statx_agrees(fd, "link", 0));
    show("statx of a symlink", statx_agrees(fd, "link", AT_SYMLINK_NOFOLLOW));
    show("stat through a symlink", stat_agrees("link", 0));
    show("lstat of a symlink", stat_agrees("link", AT_SYMLINK_NOFOLLOW));
    show("unlink symlink", unlink("link"));
    show("fsync", fsync(fd));
    show("fdatasync", fdatasync(fd));

    show("close dup", close(d));
    show("read closed", read(d, r1, 1));
    show("close 50", close(50));
    show("write closed", write(50, "x", 1));
    show("close closed", close(50));

    show("lseek", lseek(fd, 100, SEEK_SET));
    pid_t pid = fork();
    if (pid == 0) {
        if (write(fd, "child!", 6) != 6)
            _exit(1);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    show("fork child status", status);
    show("offset after child", lseek(fd, 0, SEEK_CUR));
    sum_at(fd, "child's bytes", 100, 6);

    pid = fork();
    if (pid == 0) {
        char num[16];
        snprintf(num, sizeof num, "%d", fd);
        execl("/proc/self/exe", argv[0], "exec-child", num, (char *)NULL);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    show("exec child status", status);
    show("offset after exec child", lseek(fd, 0, SEEK_CUR));

    /* A vfork child shares the parent's memory, the library's table included, but not its
     * descriptors: what it closes stays open in the parent. */
    pid = vfork();
    if (pid == 0) {
        close(fd);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    show("vfork child status", status);
    show("offset after vfork child", lseek(fd, 0, SEEK_CUR));
    sum_at(fd, "read after vfork child", 100, 10);

    int t = open("threads", O_RDWR | O_CREAT | O_TRUNC, 0644);
    four_threads(writer, t);
    show("threads size", size_of(t));
    sum_at(t, "threads file", 0, 4 * 8 * 4096);

    int rec = open("records", O_RDWR | O_CREAT | O_TRUNC, 0644);
    four_threads(record_writer, rec);
    show("records offset", lseek(rec, 0, SEEK_CUR));
    show("records size", size_of(rec));
    show("records rewind", lseek(rec, 0, SEEK_SET));
    four_threads(record_reader, rec);
    int once = 1;
    for (int id = 0; id < 4; id++)
        for (int i = 0; i < RECORDS; i++)
            once &= seen[id][i] == 1;
    show("records each read once", once);
    show("records offset after reads", lseek(rec, 0, SEEK_CUR));
    show("close records", close(rec));
    /* The order of the records differs from run to run. */
    show("unlink records", unlink("records"));

    unsigned char *map = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, t, 0);
    show("mmap", map != MAP_FAILED);
    memcpy(map + 10, "mapped store", 12);
    show("msync", msync(map, 8192, MS_SYNC));
    sum_at(t, "read sees the store", 0, 100);
    show("pwrite under the map", pwrite(t, "written", 7, 4096));
    printf("map sees the write: %.7s\n", map + 4096);
    show("munmap", munmap(map, 8192));
    show("close threads", close(t));

    FILE *s = fopen("stream", "w+");
    fprintf(s, "through stdio %d\n", 42);
    show("fclose", fclose(s));
    int g = open("stream", O_RDONLY);
    memset(r1, 0, sizeof r1);
    show("read stream file", read(g, r1, sizeof r1));
    printf("%s", r1);
    show("close", close(g));

    /* Buffers at bad addresses: the kernel answers EFAULT, or copies up to the bad one. */
    int bad = open("bad", O_RDWR | O_CREAT | O_TRUNC, 0644);
    char *volatile nowhere = (char *)8; /* volatile: the compiler may not see it is bogus */
    show("write from address 8", write(bad, nowhere, 10));
    show("pwrite from address 0", pwrite(bad, nowhere - 8, 10, 0));
    show("write", write(bad, "0123456789", 10));
    show("pread into address 8", pread(bad, nowhere, 10, 0));
    show("lseek to 0", lseek(bad, 0, SEEK_SET));
    show("read into address 0", read(bad, nowhere - 8, 10));
    show("offset after it", lseek(bad, 0, SEEK_CUR));
    struct iovec badv[2] = {{"ab", 2}, {nowhere + 4088, 5}};
    show("pwritev, second bad", pwritev(bad, badv, 2, 0));
    char rb[4] = "";
    struct iovec readv_bad[2] = {{rb, 3}, {nowhere + 4088, 5}};
    show("preadv, second bad", preadv(bad, readv_bad, 2, 0));
    printf("preadv got: %.3s\n", rb);
    sum_at(bad, "after bad buffers", 0, 20);
    show("close bad", close(bad));

    show("dup2 to 100", dup2(fd, 100));
    show("dup2 to 101", dup2(fd, 101));
    show("close_range", close_range(100, 101, 0));
    show("F_GETFD closed", fcntl(100, F_GETFD));

    int p[2];
    show("pipe", pipe(p));
    show("pipe write", write(p[1], "pipe", 4));
    show("pipe read", read(p[0], r1, 10));
    close(p[0]);
    close(p[1]);
    show("close fd", close(fd));
    /* Every number the run used is free again, the library's included. */
    int last_fd = open("f", O_RDONLY);
    show("open after all", last_fd);
    show("close it", close(last_fd));
    return 0;
}
