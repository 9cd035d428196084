/* A fork child (and its own fork child) using descriptors it inherited, which the parent had
 * used before the fork: writes at the shared offset, a duplicate made in the child sharing
 * the description's O_APPEND, a duplicate the parent made, and a file unlinked before the
 * fork; then a fork child whose threads start at once on four duplicates of one description.
 * Prints a transcript that must not depend on whether the library is loaded. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transcript.h"

#define CHILD_WRITES 100
#define GRANDCHILD_WRITES 50
#define THREADS 4
#define THREAD_WRITES 100
/* Where the threads write, past everything else. */
#define THREADS_AT 65536

static unsigned char buf[4096];

static int wait_for(pid_t pid) {
    int status;
    return waitpid(pid, &status, 0) == pid ? status : -1;
}

/* The child: exits with the number of the step that went wrong, 0 if none did. */
static int child(int fd, int parents_dup, int orphan) {
    for (int i = 0; i < CHILD_WRITES; i++)
        if (write(fd, buf + i, 100) != 100)
            return 1;
    /* The flag is the description's: set through the parent's duplicate, a write through a
     * duplicate made here appends. */
    int d = dup(fd);
    if (fcntl(parents_dup, F_SETFL, O_APPEND) != 0)
        return 2;
    if (lseek(fd, 0, SEEK_SET) != 0 || write(d, "APPENDED", 8) != 8)
        return 3;
    if (fcntl(d, F_SETFL, 0) != 0 || close(d) != 0)
        return 4;
    for (int i = 0; i < CHILD_WRITES; i++)
        if (pwrite(orphan, buf + i, 64, 64 * i) != 64)
            return 5;
    pid_t pid = fork();
    if (pid == 0) {
        /* A duplicate made before any call on the inherited descriptor. */
        int g = dup(parents_dup);
        for (int i = 0; i < GRANDCHILD_WRITES; i++)
            if (write(i % 2 ? g : parents_dup, buf + 2 * i, 10) != 10)
                _exit(1);
        _exit(0);
    }
    return wait_for(pid) == 0 ? 0 : 6;
}

struct job {
    int fd, id;
};

static void *thread_writer(void *arg) {
    const struct job *j = arg;
    for (int i = 0; i < THREAD_WRITES; i++) {
        off_t at = THREADS_AT + (off_t)(i * THREADS + j->id) * 64;
        if (pwrite(j->fd, buf + j->id * 100 + i, 64, at) != 64)
            return (void *)1;
    }
    return NULL;
}

/* The threads' child: one thread per duplicate, all making their first call at once. */
static int threads_child(const int *fds) {
    pthread_t th[THREADS];
    struct job jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t] = (struct job){fds[t], t};
        if (pthread_create(&th[t], NULL, thread_writer, &jobs[t]) != 0)
            return 1;
    }
    int bad = 0;
    for (int t = 0; t < THREADS; t++) {
        void *r;
        bad |= pthread_join(th[t], &r) != 0 || r != NULL;
    }
    return bad ? 2 : 0;
}

int main(void) {
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + i / 13);

    int fd = open("f", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("write before fork", write(fd, buf, 1000));
    int parents_dup = dup(fd);
    int orphan = open("orphan", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("orphan write", write(orphan, buf, 4096));
    show("unlink orphan", unlink("orphan"));

    pid_t pid = fork();
    if (pid == 0)
        _exit(child(fd, parents_dup, orphan));
    show("child status", wait_for(pid));

    show("offset", lseek(fd, 0, SEEK_CUR));
    show("offset of the dup", lseek(parents_dup, 0, SEEK_CUR));
    show("size", size_of(fd));
    sum_at(fd, "file", 0, 20000);
    show("still not appending", write(fd, "END", 3));
    show("size", size_of(fd));
    sum_at(orphan, "orphan", 0, 8192);

    int fds[THREADS] = {fd, parents_dup, dup(fd), dup(parents_dup)};
    pid = fork();
    if (pid == 0)
        _exit(threads_child(fds));
    show("threads child status", wait_for(pid));
    sum_at(fd, "threads' records", THREADS_AT, THREADS * THREAD_WRITES * 64);
    show("close", close(fds[2]) | close(fds[3]));
    show("close", close(fd));
    show("close dup", close(parents_dup));
    show("close orphan", close(orphan));
    return 0;
}
