r"""How much space a file's log holds while several processes write it, and after they close it.

Usage, on a pmfs mount:
    LD_PRELOAD=target/release/libpmfs_preload.so \
        python3 scripts/held-log-blocks.py FILE SECONDS PROCS [map]

Writes a 1 MiB FILE (on a pmfs mount), then forks PROCS processes that each open it and
overwrite random 4 KiB blocks for SECONDS (with `map`, each maps the file meanwhile). Prints
the mount's used space (`df`) before, when the first writer is about to close, and after all
have closed.
"""
import mmap, os, random, subprocess, sys, time

p, secs, procs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
mapped = sys.argv[4:] == ['map']


def used():
    df = subprocess.run(['df', '-k', os.path.dirname(p)], capture_output=True, text=True)
    return int(df.stdout.split('\n')[1].split()[2])


fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 1 << 20); os.pwrite(fd, b'\1' * (1 << 20), 0); os.close(fd)
u0 = used()
pids = []
r, w = os.pipe()
for k in range(procs):
    pid = os.fork()
    if pid == 0:
        fd = os.open(p, os.O_RDWR)
        m = mmap.mmap(fd, 1 << 20) if mapped else None
        buf = bytes([k]) * 4096
        n = 0; end = time.time() + secs
        while time.time() < end:
            for _ in range(1000):
                os.pwrite(fd, buf, random.randrange(256) * 4096)
            n += 1000
        if k == 0:
            os.write(w, str(used()).encode() + b'\n')
        if m:
            m.close()
        os.close(fd)
        os._exit(0 if n else 1)
    pids.append(pid)
during = int(os.read(r, 64))
for pid in pids:
    os.waitpid(pid, 0)
time.sleep(0.2)
print(f"before {u0} KiB, one writer closing {during - u0:+} KiB, all closed {used() - u0:+} KiB")
