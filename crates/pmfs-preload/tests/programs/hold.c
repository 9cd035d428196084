/* A shim loaded after the library (LD_PRELOAD="libpmfs_preload.so hold.so"): each call that
 * closes or replaces descriptors, as the library forwards it, is made and then held until the
 * test program has looked at the descriptors. With HOLD_NOTIFY and HOLD_RESUME set (pipe
 * descriptors), such a call on a thread other than the main one writes a byte to the first
 * once the real call returned, then waits for a byte from the second. Other calls are only
 * forwarded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void hold(void) {
    const char *n = getenv("HOLD_NOTIFY"), *r = getenv("HOLD_RESUME");
    char c = 1;
    if (!n || !r || gettid() == getpid())
        return;
    if (write(atoi(n), &c, 1) != 1 || read(atoi(r), &c, 1) != 1)
        abort();
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int fclose(FILE *f) {
    int r = NEXT(fclose)(f);
    hold();
    return r;
}

FILE *freopen(const char *path, const char *mode, FILE *f) {
    FILE *r = NEXT(freopen)(path, mode, f);
    hold();
    return r;
}

int close_range(unsigned first, unsigned last, int flags) {
    int r = NEXT(close_range)(first, last, flags);
    hold();
    return r;
}

void closefrom(int low) {
    NEXT(closefrom)(low);
    hold();
}

int dup2(int old, int new) {
    int r = NEXT(dup2)(old, new);
    hold();
    return r;
}

int dup3(int old, int new, int flags) {
    int r = NEXT(dup3)(old, new, flags);
    hold();
    return r;
}
