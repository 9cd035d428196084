/* fchown on open descriptors, run as root: changes that change nothing (same owner and group,
 * or -1) on descriptors open for reading and for writing, real changes of owner and group, and
 * no-op changes of files with set-ID bits (which a change of owner clears). Each line tells
 * the call's result and what it did to the file: ctime raised or not, mtime, mode and owner.
 *
 * With an argument, `chown PATH` only opens PATH for reading and asks for a change that
 * changes nothing (for a read-only mount, where the kernel answers EROFS). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "transcript.h"

static long long ns(struct timespec t) { return t.tv_sec * 1000000000LL + t.tv_nsec; }

/* Past the coarse clock tick of local file systems, so that a new ctime differs. */
static void tick(void) {
    struct timespec t = {0, 20 * 1000 * 1000};
    nanosleep(&t, NULL);
}

/* fchown(fd, uid, gid), then what changed on the file since before. */
static void try_chown(const char *what, int fd, uid_t uid, gid_t gid) {
    struct stat before, after;
    fstat(fd, &before);
    tick();
    int r = fchown(fd, uid, gid);
    show(what, r);
    fstat(fd, &after);
    printf("  ctime %s, mtime %s, mode %o, owner %u:%u\n",
           ns(after.st_ctim) > ns(before.st_ctim) ? "raised" : "kept",
           ns(after.st_mtim) == ns(before.st_mtim) ? "kept" : "changed",
           (unsigned)(after.st_mode & 07777), (unsigned)after.st_uid, (unsigned)after.st_gid);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        int fd = open(argv[1], O_RDONLY);
        struct stat st;
        fstat(fd, &st);
        show("fchown same, read-only mount", fchown(fd, st.st_uid, st.st_gid));
        return 0;
    }
    int w = open("f", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("write", write(w, "data", 4));
    int r = open("f", O_RDONLY);
    try_chown("fchown same, writer", w, 0, 0);
    try_chown("fchown same, reader", r, 0, 0);
    try_chown("fchown -1 -1", r, (uid_t)-1, (gid_t)-1);
    try_chown("fchown same uid only", w, 0, (gid_t)-1);
    try_chown("fchown to 1:2", w, 1, 2);
    try_chown("fchown back to 0:0", r, 0, 0);
    fchmod(w, 04755);
    try_chown("fchown same, set-user-ID", w, 0, 0);
    fchmod(w, 02754);
    try_chown("fchown same, set-group-ID", r, 0, 0);
    fchmod(w, 02644);
    try_chown("fchown same, locking bit", r, 0, 0);
    close(r);
    close(w);
    show("fchown after close", fchown(w, 0, 0));
    return 0;
}
