/* The file size limit (RLIMIT_FSIZE) against writes, appends, truncations and allocations,
 * set by the program itself and inherited across exec: a write starting at the limit fails
 * with EFBIG and raises SIGXFSZ, one reaching past it is cut short there, a truncation or an
 * allocation growing the file past it fails. The transcript counts the signals; it and the
 * file must not depend on whether the library is loaded. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transcript.h"

#define LIMIT 10000

static volatile sig_atomic_t signals;

static void on_xfsz(int sig) {
    (void)sig;
    signals++;
}

static void set_limit(rlim_t soft) {
    struct rlimit r;
    getrlimit(RLIMIT_FSIZE, &r);
    r.rlim_cur = soft;
    show("setrlimit", setrlimit(RLIMIT_FSIZE, &r));
}

static void signals_so_far(void) {
    show("SIGXFSZ so far", signals);
}

/* The exec'd image: the limit came with it. */
static int child(void) {
    static char buf[12000];
    memset(buf, 'c', sizeof buf);
    signal(SIGXFSZ, on_xfsz);
    int fd = open("inherited", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("child write 12000", write(fd, buf, sizeof buf));
    show("child write again", write(fd, buf, 10));
    show("child pwrite below", pwrite(fd, buf, 100, 0));
    signals_so_far();
    close(fd);
    return 0;
}

int main(int argc, char **argv) {
    static char buf[20000];
    if (argc > 1 && strcmp(argv[1], "child") == 0)
        return child();
    memset(buf, 'a', sizeof buf);
    signal(SIGXFSZ, on_xfsz);
    set_limit(LIMIT);

    int fd = open("f", O_RDWR | O_CREAT | O_TRUNC, 0644);
    show("write 8000", write(fd, buf, 8000));
    show("write 8000 more", write(fd, buf, 8000));
    show("offset", lseek(fd, 0, SEEK_CUR));
    show("write at the limit", write(fd, buf, 10));
    show("offset", lseek(fd, 0, SEEK_CUR));
    signals_so_far();
    show("pwrite across", pwrite(fd, buf, 100, LIMIT - 50));
    show("pwrite at the limit", pwrite(fd, buf, 10, LIMIT));
    show("pwrite below", pwrite(fd, buf, 100, 0));
    struct iovec iov[2] = {{buf, 3000}, {buf + 3000, 3000}};
    show("pwritev across", pwritev(fd, iov, 2, LIMIT - 1000));
    signals_so_far();
    show("ftruncate past", ftruncate(fd, LIMIT + 1));
    show("ftruncate to the limit", ftruncate(fd, LIMIT));
    show("ftruncate down", ftruncate(fd, 5000));
    show("fallocate past", fallocate(fd, 0, 0, LIMIT + 4096));
    show("fallocate within", fallocate(fd, 0, 5000, 4000));
    signals_so_far();

    int ap = open("f", O_WRONLY | O_APPEND);
    show("append to 9990", ftruncate(fd, 9990));
    show("append 100", write(ap, buf, 100));
    show("append 1", write(ap, buf, 1));
    signals_so_far();
    close(ap);
    show("size", size_of(fd));
    sum_at(fd, "bytes", 0, 2 * LIMIT);

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "child", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    show("child status", WIFEXITED(status) ? WEXITSTATUS(status) : -1);

    set_limit(RLIM_INFINITY);
    show("write past the old limit", pwrite(fd, buf, 20000, LIMIT));
    signals_so_far();
    show("size", size_of(fd));
    sum_at(fd, "bytes", 0, 3 * LIMIT + 1);
    close(fd);
    return 0;
}
