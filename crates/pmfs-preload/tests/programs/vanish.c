/* Holds a file open across the loss of its mount: writes and reads it, prints "ready", waits
 * for a line on standard input (the test takes the mount away meanwhile), then makes every
 * kind of data call on it again and prints the results. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "transcript.h"

int main(void) {
    static char buf[4096];
    int fd = open("f", O_RDWR);
    memset(buf, 'b', sizeof buf);
    show("pwrite before", pwrite(fd, buf, sizeof buf, 0));
    show("pread before", pread(fd, buf, sizeof buf, 0));
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (read(0, line, sizeof line) <= 0)
        return 1;
    show("pwrite after", pwrite(fd, "AFTER", 5, 0));
    show("write after", write(fd, "AFTER", 5));
    show("pread after", pread(fd, buf, 5, 0));
    show("read after", read(fd, buf, 5));
    show("fsync after", fsync(fd));
    show("ftruncate after", ftruncate(fd, 1));
    show("lseek end after", lseek(fd, 0, SEEK_END));
    return 0;
}
