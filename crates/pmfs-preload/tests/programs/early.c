/* A preloaded object whose constructor uses files: listed after libpmfs_preload.so in
 * LD_PRELOAD, it is initialised before the library, so these calls reach the library's
 * interposed functions before its own constructor ran (as Debian's fio does with fopen). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void early(void) {
    const char *path = getenv("EARLY_FILE");
    if (path == NULL)
        return;
    char line[128], msg[300];
    int fd = open(path, O_RDONLY);
    ssize_t n = read(fd, line, sizeof line - 1);
    close(fd);
    FILE *f = fopen(path, "r");
    char *got = f ? fgets(line, sizeof line, f) : NULL;
    if (f)
        fclose(f);
    int m = snprintf(msg, sizeof msg, "early: read %zd, stdio %s", n, got ? got : "failed\n");
    if (write(1, msg, (size_t)m) != m)
        abort();
}
