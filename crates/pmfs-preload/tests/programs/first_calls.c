/* Threads that each open a file of their own and make their first calls on it at once, in a
 * process that has made no call on a pmfs file before: one of them attaches the process to
 * the pool while the others wait for it. Prints each file's size and checksum. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "transcript.h"

#define THREADS 4
#define WRITES 100

static pthread_barrier_t start;
static int fds[THREADS];

static void *writer(void *arg) {
    long id = (long)arg;
    unsigned char rec[64];
    pthread_barrier_wait(&start);
    for (int i = 0; i < WRITES; i++) {
        for (size_t k = 0; k < sizeof rec; k++)
            rec[k] = (unsigned char)(id * 31 + i * 7 + k);
        if (write(fds[id], rec, sizeof rec) != sizeof rec)
            return (void *)1;
    }
    return NULL;
}

int main(void) {
    char name[16];
    for (int t = 0; t < THREADS; t++) {
        snprintf(name, sizeof name, "t%d", t);
        fds[t] = open(name, O_RDWR | O_CREAT | O_TRUNC, 0644);
    }
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, writer, (void *)t);
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        show("thread", (long)r);
    }
    for (int t = 0; t < THREADS; t++) {
        snprintf(name, sizeof name, "t%d", t);
        show(name, size_of(fds[t]));
        sum_at(fds[t], name, 0, WRITES * 64);
        close(fds[t]);
    }
    return 0;
}
