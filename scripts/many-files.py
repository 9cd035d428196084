#!/usr/bin/env python3
"""Times what a volume of many small files costs to mount, check and empty, per mapping.

For each mapping structure: makes a pool, mounts it, writes FILES files of 8 KiB (in
directories of 1000), unmounts, then times a mount of the clean pool (to the mount being
served), `pmfs fsck`, and `rm -rf` of one directory of 1000 files through the mount. Prints
one line per structure, in seconds.

Usage: scripts/many-files.py [DIR] (as root, with /dev/fuse; default DIR /dev/shm)
  environment: PMFS=path of the pmfs binary (target/release/pmfs), SIZE=pool size (2G),
  FILES=number of files (20000), MAPPINGS=structures (extent,radix,cuckoo,hashfs)
"""

import os
import subprocess
import sys
import tempfile
import time

PMFS = os.environ.get("PMFS", "target/release/pmfs")
SIZE = os.environ.get("SIZE", "2G")
FILES = int(os.environ.get("FILES", "20000"))
MAPPINGS = os.environ.get("MAPPINGS", "extent,radix,cuckoo,hashfs").split(",")
PER_DIR = 1000


def pmfs(*args):
    subprocess.run([PMFS, *args], check=True, stdout=subprocess.DEVNULL)


def timed(*args):
    t = time.perf_counter()
    pmfs(*args)
    return time.perf_counter() - t


def fill(mnt):
    for i in range(FILES):
        d = os.path.join(mnt, f"d{i // PER_DIR}")
        if i % PER_DIR == 0:
            os.mkdir(d)
        with open(os.path.join(d, f"f{i % PER_DIR}"), "wb") as f:
            f.write(os.urandom(8192))


def main():
    where = sys.argv[1] if len(sys.argv) > 1 else "/dev/shm"
    pool = os.path.join(where, f"pmfs-many-files-{os.getpid()}.pool")
    mnt = tempfile.mkdtemp(prefix="pmfs-many-files-")
    try:
        for mapping in MAPPINGS:
            pmfs("mkfs", pool, "--size", SIZE, "--mapping", mapping, "-f")
            pmfs("mount", pool, mnt)
            try:
                fill(mnt)
            finally:
                pmfs("umount", mnt)
            mount = timed("mount", pool, mnt)
            pmfs("umount", mnt)
            fsck = timed("fsck", pool)
            pmfs("mount", pool, mnt)
            try:
                t = time.perf_counter()
                subprocess.run(["rm", "-rf", os.path.join(mnt, "d0")], check=True)
                rm = time.perf_counter() - t
            finally:
                pmfs("umount", mnt)
            print(
                f"{mapping:7} {FILES} files: mount {mount:.3f} s, fsck {fsck:.3f} s, "
                f"rm -rf of {PER_DIR} files {rm:.3f} s",
                flush=True,
            )
    finally:
        if os.path.exists(pool):
            os.remove(pool)
        os.rmdir(mnt)


if __name__ == "__main__":
    main()
