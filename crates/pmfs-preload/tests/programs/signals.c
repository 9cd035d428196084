/* "signals": handlers that call the library while their thread may be inside it. An interval
 * timer's handler appends a line to the file the main thread appends its own lines to, as a
 * program that logs from a signal handler does: every line must arrive whole and the program
 * must not hang. Then what sigaction and signal report of the handlers installed. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include "transcript.h"

static int log_fd;
static volatile long handled, bad_info;
static volatile int usr2_runs;

static void on_alarm(int sig, siginfo_t *info, void *context) {
    int e = errno;
    (void)context;
    if (sig != SIGALRM || info->si_signo != SIGALRM)
        bad_info++;
    if (write(log_fd, "handler line\n", 13) != 13)
        abort();
    handled++;
    errno = e;
}

static void on_usr1(int sig) { (void)sig; }
static void on_usr2(int sig) { (void)sig; usr2_runs++; }

int main(void) {
    log_fd = open("log", O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    struct sigaction sa = {0};
    sa.sa_sigaction = on_alarm;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    show("sigaction SIGALRM", sigaction(SIGALRM, &sa, NULL));
    /* Every 200 us; the loop ends after 200 signals (a write through FUSE, which a signal
     * interrupts and restarts, takes well under that). */
    struct itimerval every = {{0, 200}, {0, 200}}, off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &every, NULL);
    long lines = 0;
    while (handled < 200) {
        char line[64];
        int n = snprintf(line, sizeof line, "main line %ld\n", lines++);
        if (write(log_fd, line, n) != n)
            abort();
    }
    setitimer(ITIMER_REAL, &off, NULL);
    show("handlers ran", handled > 0);
    show("siginfo right", bad_info == 0);
    struct stat st;
    fstat(log_fd, &st);
    long want = 0;
    for (long i = 0; i < lines; i++) {
        char line[64];
        want += snprintf(line, sizeof line, "main line %ld\n", i);
    }
    show("size is every line", st.st_size == want + 13 * handled);

    struct sigaction got;
    sa.sa_sigaction = NULL;
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGTERM);
    show("sigaction SIGUSR1", sigaction(SIGUSR1, &sa, NULL));
    show("query", sigaction(SIGUSR1, NULL, &got));
    show("handler reported", got.sa_handler == on_usr1);
    show("SA_SIGINFO not reported", !(got.sa_flags & SA_SIGINFO));
    show("SA_RESETHAND reported", !!(got.sa_flags & SA_RESETHAND));
    show("mask reported", sigismember(&got.sa_mask, SIGTERM) == 1);
    show("raise SIGUSR1", raise(SIGUSR1));
    sigaction(SIGUSR1, NULL, &got);
    show("reset to default", got.sa_handler == SIG_DFL);
    show("signal first", signal(SIGUSR2, on_usr2) == SIG_DFL);
    show("signal again", signal(SIGUSR2, on_usr2) == on_usr2);
    raise(SIGUSR2);
    raise(SIGUSR2);
    show("usr2 runs", usr2_runs);
    show("ignore", signal(SIGUSR2, SIG_IGN) == on_usr2);
    raise(SIGUSR2);
    show("ignored", usr2_runs);
    show("invalid", sigaction(SIGKILL, &sa, NULL));
    return close(log_fd) != 0;
}
