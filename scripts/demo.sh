#!/usr/bin/env bash
# pmfs demo: mount a default volume, run a short real workload on it, show what the volume
# looks like, unmount.
#
#   scripts/demo.sh            # pool /dev/shm/pmfs-demo.pool (created if absent)
#   PMFS_POOL=/path/pool PMFS_SIZE=2G PMFS_MAPPING=cuckoo scripts/demo.sh
#
# Needs root or a user allowed to use FUSE. Installs the Debian packages it uses (fuse3,
# sqlite3) when they are missing, and builds the release binary first unless PMFS_BIN names
# one.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for p in fuse3 sqlite3; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

pool="${PMFS_POOL:-/dev/shm/pmfs-demo.pool}"
size="${PMFS_SIZE:-1G}"
mapping="${PMFS_MAPPING:-hashfs}"
if [ -z "${PMFS_BIN:-}" ]; then
    cargo build --release --quiet -p pmfs-fuse --bin pmfs
    PMFS_BIN="${CARGO_TARGET_DIR:-target}/release/pmfs"
fi
pmfs() { "$PMFS_BIN" "$@"; }

step() { printf '\n== %s\n' "$*"; }

if [ ! -e "$pool" ]; then
    step "pmfs mkfs $pool --size $size --mapping $mapping"
    pmfs mkfs "$pool" --size "$size" --mapping "$mapping"
fi

mnt="$(mktemp -d "${TMPDIR:-/tmp}/pmfs-demo.XXXXXX")"
cleanup() {
    if grep -qs " $mnt fuse.pmfs " /proc/self/mounts; then
        pmfs umount "$mnt" 2>/dev/null || pmfs umount --force "$mnt" || true
    fi
    rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

step "pmfs mount $pool $mnt"
pmfs mount "$pool" "$mnt"
grep " $mnt " /proc/self/mounts

step "copy a tree in (this repository's crates/) and check it byte for byte"
rm -rf "$mnt/demo"
mkdir "$mnt/demo"
time cp -a crates "$mnt/demo/"
diff -r crates "$mnt/demo/crates" && echo "identical: $(find "$mnt/demo/crates" -type f | wc -l) files"

step "sqlite3 on the mount"
db="$mnt/demo/demo.db"
time sqlite3 "$db" <<'SQL'
PRAGMA journal_mode=WAL;
CREATE TABLE files(id INTEGER PRIMARY KEY, name TEXT, bytes INTEGER);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000)
INSERT INTO files(name, bytes) SELECT printf('file-%06d', x), abs(random() % 1000000) FROM c;
CREATE INDEX by_bytes ON files(bytes);
SELECT 'integrity_check: ' || integrity_check FROM pragma_integrity_check;
SELECT 'rows: ' || count(*) || ', largest: ' || max(bytes) FROM files;
SQL

step "df and a directory listing on the mount"
df -h "$mnt"
ls -la "$mnt/demo"

step "pmfs umount $mnt (returns once the volume is closed)"
pmfs umount "$mnt"

step "pmfs info $pool"
pmfs info "$pool"

step "pmfs fsck $pool"
pmfs fsck "$pool"
