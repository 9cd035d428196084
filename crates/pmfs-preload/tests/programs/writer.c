/* "writer FILE": opens FILE read-write, prints "ready", then for each line "OFF TEXT" on
 * standard input pwrites TEXT at OFF and prints "ok" (or the errno): a writer a test steps
 * one write at a time. "punch OFF LEN" punches a hole instead; "store OFF TEXT" stores TEXT
 * at OFF through a shared mapping of the whole file (made at the first store, as long as the
 * file is then) and msyncs it; "again N OFF TEXT" pwrites TEXT at OFF N times. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int fd = open(argv[1], O_RDWR);
    if (fd < 0)
        return 1;
    printf("ready\n");
    fflush(stdout);
    char line[4096];
    char *map = NULL;
    size_t mapped = 0;
    while (fgets(line, sizeof line, stdin)) {
        long off, len, times;
        char text[4096];
        int r;
        if (sscanf(line, "again %ld %ld %4095s", &times, &off, text) == 3) {
            r = 0;
            for (long i = 0; i < times && r == 0; i++)
                r = pwrite(fd, text, strlen(text), off) == (ssize_t)strlen(text) ? 0 : -1;
        }
        else if (sscanf(line, "punch %ld %ld", &off, &len) == 2)
            r = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len);
        else if (sscanf(line, "store %ld %4095s", &off, text) == 2) {
            if (!map) {
                struct stat st;
                if (fstat(fd, &st) != 0 || st.st_size == 0)
                    return 1;
                mapped = st.st_size;
                map = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (map == MAP_FAILED)
                    return 1;
            }
            if (off < 0 || (size_t)off + strlen(text) > mapped)
                return 2;
            memcpy(map + off, text, strlen(text));
            r = msync(map, mapped, MS_SYNC);
        }
        else if (sscanf(line, "%ld %4095s", &off, text) == 2)
            r = pwrite(fd, text, strlen(text), off) == (ssize_t)strlen(text) ? 0 : -1;
        else
            return 2;
        if (r == 0)
            printf("ok\n");
        else
            printf("failed: %s\n", strerror(errno));
        fflush(stdout);
    }
    return close(fd) != 0;
}
