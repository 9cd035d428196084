/* Ends by exec'ing /bin/sh through the function named by argv[1] (execl, execlp, execle or
 * fexecve) while it has a file open in the current directory, written and then unlinked:
 * the new image prints its arguments (more than fit in registers) and $FOO. The file must be
 * freed once nothing has it open, so the old image must have released it before the exec.
 * With "exit" it prints the same line and exits instead (its counters are reported then). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "transcript.h"

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    static char buf[1 << 20];
    memset(buf, 'x', sizeof buf);
    int fd = open("doomed", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    for (int i = 0; i < 4; i++)
        if (pwrite(fd, buf, sizeof buf, (off_t)i * (off_t)sizeof buf) != (ssize_t)sizeof buf)
            return 3;
    if (unlink("doomed") != 0)
        return 4;
    const char *say = "echo \"$0\" \"$@\" \"${FOO-unset}\"";
    char *const env[] = {"FOO=from-execle", NULL};
    char *const args[] = {"sh", "-c", (char *)say, "a0", "a1", "a2", "a3", "a4", "a5", NULL};
    if (strcmp(argv[1], "execl") == 0)
        execl("/bin/sh", "sh", "-c", say, "a0", "a1", "a2", "a3", "a4", "a5", (char *)NULL);
    else if (strcmp(argv[1], "execlp") == 0)
        execlp("sh", "sh", "-c", say, "a0", "a1", "a2", "a3", "a4", "a5", (char *)NULL);
    else if (strcmp(argv[1], "execle") == 0)
        execle("/bin/sh", "sh", "-c", say, "a0", "a1", "a2", "a3", "a4", "a5", (char *)NULL,
               env);
    else if (strcmp(argv[1], "fexecve") == 0)
        fexecve(open("/bin/sh", O_RDONLY | O_CLOEXEC), args, env);
    else if (strcmp(argv[1], "exit") == 0) {
        printf("a0 a1 a2 a3 a4 a5 exit\n");
        exit(0);
    }
    show("exec failed", -1);
    return 1;
}
