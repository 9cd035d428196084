/* For every path on the command line, asks each path form of stat (stat, lstat, fstatat with
 * and without AT_SYMLINK_NOFOLLOW, stat64, lstat64) and the kernel's newfstatat system call,
 * which no library sees, and prints whether the answers (result, errno, every field) agree;
 * then the same for statx with several masks, against the statx system call. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x4000U /* Linux 6.8; newer than this system's headers */
#endif

static int same(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_mode == b->st_mode &&
           a->st_nlink == b->st_nlink && a->st_uid == b->st_uid && a->st_gid == b->st_gid &&
           a->st_rdev == b->st_rdev && a->st_size == b->st_size &&
           a->st_blksize == b->st_blksize && a->st_blocks == b->st_blocks &&
           a->st_atim.tv_sec == b->st_atim.tv_sec && a->st_atim.tv_nsec == b->st_atim.tv_nsec &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static void compare(const char *path, const char *form, int r, int err, const struct stat *got,
                    int nofollow) {
    struct stat want;
    memset(&want, 0, sizeof want);
    int wr = (int)syscall(SYS_newfstatat, AT_FDCWD, path, &want,
                          nofollow ? AT_SYMLINK_NOFOLLOW : 0);
    int werr = wr < 0 ? errno : 0;
    int ok = r == wr && err == werr && (r < 0 || same(got, &want));
    printf("%-8s %s: %s", form, path, ok ? "same" : "DIFFERENT");
    if (!ok)
        printf(" (%d/%s against %d/%s; size %lld/%lld, mode %o/%o, rdev %lx/%lx)", r,
               strerror(err), wr, strerror(werr), (long long)got->st_size,
               (long long)want.st_size, got->st_mode, want.st_mode,
               (unsigned long)got->st_rdev, (unsigned long)want.st_rdev);
    printf("\n");
}

static int ts_same(struct statx_timestamp a, struct statx_timestamp b) {
    return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

static int statx_same(const struct statx *a, const struct statx *b) {
    return a->stx_mask == b->stx_mask && a->stx_blksize == b->stx_blksize &&
           a->stx_attributes == b->stx_attributes && a->stx_nlink == b->stx_nlink &&
           a->stx_uid == b->stx_uid && a->stx_gid == b->stx_gid && a->stx_mode == b->stx_mode &&
           a->stx_ino == b->stx_ino && a->stx_size == b->stx_size &&
           a->stx_blocks == b->stx_blocks && a->stx_attributes_mask == b->stx_attributes_mask &&
           ts_same(a->stx_atime, b->stx_atime) && ts_same(a->stx_btime, b->stx_btime) &&
           ts_same(a->stx_ctime, b->stx_ctime) && ts_same(a->stx_mtime, b->stx_mtime) &&
           a->stx_rdev_major == b->stx_rdev_major && a->stx_rdev_minor == b->stx_rdev_minor &&
           a->stx_dev_major == b->stx_dev_major && a->stx_dev_minor == b->stx_dev_minor &&
           a->stx_mnt_id == b->stx_mnt_id;
}

static void compare_statx(const char *path, int flags, unsigned mask) {
    struct statx got, want;
    memset(&got, 0, sizeof got);
    memset(&want, 0, sizeof want);
    int r = statx(AT_FDCWD, path, flags, mask, &got);
    int err = r < 0 ? errno : 0;
    int wr = (int)syscall(SYS_statx, AT_FDCWD, path, flags, mask, &want);
    int werr = wr < 0 ? errno : 0;
    int ok = r == wr && err == werr && (r < 0 || statx_same(&got, &want));
    printf("statx %x/%x %s: %s", (unsigned)flags, mask, path, ok ? "same" : "DIFFERENT");
    if (!ok)
        printf(" (%d/%s against %d/%s; mask %x/%x, mnt %llx/%llx)", r, strerror(err), wr,
               strerror(werr), got.stx_mask, want.stx_mask,
               (unsigned long long)got.stx_mnt_id, (unsigned long long)want.stx_mnt_id);
    printf("\n");
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *p = argv[i];
        struct stat s;
        struct stat64 s64;
        int r;
        memset(&s, 0, sizeof s);
        r = stat(p, &s);
        compare(p, "stat", r, r < 0 ? errno : 0, &s, 0);
        memset(&s, 0, sizeof s);
        r = lstat(p, &s);
        compare(p, "lstat", r, r < 0 ? errno : 0, &s, 1);
        memset(&s, 0, sizeof s);
        r = fstatat(AT_FDCWD, p, &s, 0);
        compare(p, "fstatat", r, r < 0 ? errno : 0, &s, 0);
        memset(&s, 0, sizeof s);
        r = fstatat(AT_FDCWD, p, &s, AT_SYMLINK_NOFOLLOW);
        compare(p, "fstatatl", r, r < 0 ? errno : 0, &s, 1);
        memset(&s64, 0, sizeof s64);
        r = stat64(p, &s64);
        memcpy(&s, &s64, sizeof s);
        compare(p, "stat64", r, r < 0 ? errno : 0, &s, 0);
        memset(&s64, 0, sizeof s64);
        r = lstat64(p, &s64);
        memcpy(&s, &s64, sizeof s);
        compare(p, "lstat64", r, r < 0 ? errno : 0, &s, 1);
        const unsigned masks[] = {STATX_BASIC_STATS, STATX_BASIC_STATS | STATX_BTIME, STATX_SIZE,
                                  STATX_TYPE | STATX_MTIME, STATX_BASIC_STATS | STATX_MNT_ID,
                                  STATX_BASIC_STATS | STATX_MNT_ID_UNIQUE};
        for (unsigned m = 0; m < sizeof masks / sizeof masks[0]; m++) {
            compare_statx(p, 0, masks[m]);
            compare_statx(p, AT_SYMLINK_NOFOLLOW, masks[m]);
        }
    }
    return 0;
}
