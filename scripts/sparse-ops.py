#!/usr/bin/env python3
"""Times what a sparse file costs through the system calls, in the directory given.

A file holding one 4 KiB block is grown with ftruncate to 1 GiB and to 1 TiB and truncated
back (200 times each), then, sized 1 TiB, asked for SEEK_DATA past its block (5 times), and
truncated 50 times, each followed by an fstat (whose st_blocks pmfs counts again after a
truncation). Prints the median of each on one line.

Usage: scripts/sparse-ops.py DIR
  e.g. on a pmfs mount, through FUSE and under the preload library:
    python3 scripts/sparse-ops.py /mnt/pmfs
    LD_PRELOAD=target/release/libpmfs_preload.so python3 scripts/sparse-ops.py /mnt/pmfs
"""

import os
import statistics
import sys
import time

BLOCK = 4096
TIB = 1 << 40


def median_us(samples):
    return f"{statistics.median(samples) * 1e6:.1f} us"


def timed(op):
    t = time.perf_counter()
    op()
    return time.perf_counter() - t


def seek_data(fd):
    try:
        os.lseek(fd, BLOCK, os.SEEK_DATA)
    except OSError:
        pass


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = os.path.join(sys.argv[1], "sparse-ops")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"x" * BLOCK)
        out = []
        for size in [1 << 30, TIB]:
            ts = [
                timed(lambda: (os.ftruncate(fd, size), os.ftruncate(fd, BLOCK)))
                for _ in range(200)
            ]
            out.append(f"grow to {size >> 30} GiB and back {median_us(ts)}")
        os.ftruncate(fd, TIB)
        out.append(f"SEEK_DATA {median_us([timed(lambda: seek_data(fd)) for _ in range(5)])}")
        ts = []
        for i in range(50):
            os.ftruncate(fd, TIB - BLOCK * i)
            ts.append(timed(lambda: os.fstat(fd)))
        out.append(f"fstat after a truncation {median_us(ts)}")
        print("; ".join(out))
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
