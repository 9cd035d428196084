/* "reuse": descriptor numbers that another thread's call closes or replaces, read before that
 * call has returned. Run with hold.c loaded after the library, which keeps each such call
 * from returning until the main thread has read the descriptor: by then the kernel has given
 * the number to another file (a memfd holding "S", or /dev/zero), and a read must return
 * that file's bytes, not the pmfs file's the number named before. Prints one line per call:
 * what the read returned ('S' from the memfd, '0' for a zero byte). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include "transcript.h"

enum how { FCLOSE, FREOPEN, CLOSE_RANGE, CLOSEFROM, DUP2, DUP3 };
static const char *const names[] = {"fclose", "freopen", "close_range", "closefrom", "dup2", "dup3"};

struct job {
    enum how how;
    FILE *f;
    int fd, other;
};

/* A regular file outside pmfs holding "S". */
static int other_file(void) {
    int fd = memfd_create("other", 0);
    return fd >= 0 && pwrite(fd, "S", 1, 0) == 1 ? fd : -1;
}

static void *closer(void *arg) {
    struct job *j = arg;
    switch (j->how) {
    case FCLOSE: fclose(j->f); break;
    case FREOPEN: freopen("/dev/zero", "r", j->f); break;
    case CLOSE_RANGE: close_range(j->fd, j->fd, 0); break;
    case CLOSEFROM: closefrom(j->fd); break;
    case DUP2: dup2(j->other, j->fd); break;
    case DUP3: dup3(j->other, j->fd, 0); break;
    }
    return NULL;
}

int main(void) {
    int notify[2], resume[2];
    char num[16];
    if (pipe(notify) || pipe(resume))
        return 1;
    snprintf(num, sizeof num, "%d", notify[1]);
    setenv("HOLD_NOTIFY", num, 1);
    snprintf(num, sizeof num, "%d", resume[0]);
    setenv("HOLD_RESUME", num, 1);
    int fd = open("p", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "PPPP", 4) != 4 || close(fd))
        return 1;
    for (enum how how = FCLOSE; how <= DUP3; how++) {
        struct job j = {.how = how, .other = -1};
        if (how >= DUP2 && (j.other = other_file()) < 0)
            return 1;
        j.f = fopen("p", "r");
        j.fd = fileno(j.f);
        char c = 0;
        /* The library classifies the descriptor as a pmfs file on this read. */
        if (pread(j.fd, &c, 1, 0) != 1 || c != 'P')
            return 1;
        pthread_t t;
        pthread_create(&t, NULL, closer, &j);
        if (read(notify[0], &c, 1) != 1)
            return 1;
        /* The call has closed or replaced j.fd and not returned yet. */
        if ((how == FCLOSE || how == CLOSE_RANGE || how == CLOSEFROM) &&
            (j.other = other_file()) != j.fd)
            return 1;
        c = 'x';
        long r = pread(j.fd, &c, 1, 0);
        printf("%-12s read %ld byte '%c'\n", names[how], r, c ? c : '0');
        if (write(resume[1], &c, 1) != 1)
            return 1;
        pthread_join(t, NULL);
        if (how == FREOPEN)
            fclose(j.f);
        else
            close(j.fd);
        if (how >= DUP2)
            close(j.other);
        fflush(stdout);
    }
    return 0;
}
