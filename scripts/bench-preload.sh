#!/usr/bin/env bash
# Benchmarks the preload library in one run (issue 9, "Evidence"): fio with the psync engine
# (4 KiB random read, 4 KiB random write, 1 MiB sequential write and read), RocksDB's
# db_bench (fillrandom, readrandom, fillsync) and sqlite3 (one-row transactions in every
# journal mode, then PRAGMA integrity_check) on
#   FUSE     a HashFS pool in /dev/shm mounted by `pmfs mount`, without the library,
#   library  the same mount with libpmfs_preload.so preloaded,
#   tmpfs    a directory on the same tmpfs as the pool,
# and prints a markdown table with the ratios library/FUSE and library/tmpfs.
#
# The pool and the tmpfs directory live on a tmpfs of their own, mounted with huge=advise
# under /dev/shm: the pool then gets 2 MiB pages, as persistent memory mapped from a DAX file
# system does, and the kernel reads the tmpfs files through its own direct map (huge pages)
# either way. HUGE=0 leaves them in /dev/shm itself (4 KiB pages on a default mount).
#
# Usage: scripts/bench-preload.sh          (root: it mounts; uses $CARGO_TARGET_DIR/release)
# Knobs: FIO_SECONDS (3), FIO_SIZE (256M), DB_NUM (200000), DB_SYNC_NUM (50000),
#        SQLITE_TXS (10000), POOL_SIZE (4G), HUGE (1), POLL (0: the mount's `-o poll` window
#        in microseconds). Every job is short: the whole run takes a few minutes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
pmfs=$target/release/pmfs
lib=$target/release/libpmfs_preload.so
fio_seconds=${FIO_SECONDS:-3}
fio_size=${FIO_SIZE:-256M}
db_num=${DB_NUM:-200000}
db_sync_num=${DB_SYNC_NUM:-50000}
sqlite_txs=${SQLITE_TXS:-10000}
journal_modes=(delete truncate persist memory wal off)
pool_size=${POOL_SIZE:-4G}
huge=${HUGE:-1}
poll=${POLL:-0}

if [ ! -x "$pmfs" ] || [ ! -f "$lib" ]; then
    (cd "$root" && cargo build --release -p pmfs-preload -p pmfs-fuse)
fi
if ! command -v db_bench > /dev/null; then
    apt-get install -y rocksdb-tools > /dev/null
fi
for tool in fio db_bench sqlite3 fusermount3 python3; do
    command -v "$tool" > /dev/null || { echo "bench-preload: $tool is missing" >&2; exit 1; }
done

work=$(mktemp -d /dev/shm/pmfs-bench.XXXXXX)
pool=$work/pool
mnt=$work/mnt
daemon=
mounted_huge=
cleanup() {
    if [ -n "$daemon" ]; then
        fusermount3 -u "$mnt" 2> /dev/null || fusermount3 -uz "$mnt" 2> /dev/null || true
        wait "$daemon" 2> /dev/null || true
    fi
    if [ -n "$mounted_huge" ]; then
        umount "$work" 2> /dev/null || umount -l "$work" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

if [ "$huge" = 1 ]; then
    # Room for the pool and for the tmpfs side's files (fio's and RocksDB's).
    room=$(numfmt --from=iec "$pool_size" | awk '{ printf "%.0f", $1 + 4 * 2^30 }')
    if mount -t tmpfs -o "huge=advise,size=$room" pmfs-bench "$work" 2> /dev/null; then
        mounted_huge=1
    else
        echo "bench-preload: cannot mount a huge=advise tmpfs; using 4 KiB pages in /dev/shm" >&2
    fi
fi
pages="4 KiB pages"
[ -n "$mounted_huge" ] && pages="a huge=advise tmpfs (2 MiB pages)"

mkdir -p "$mnt" "$work/tmpfs"
"$pmfs" mkfs "$pool" --size "$pool_size" --mapping hashfs > /dev/null
"$pmfs" mount "$pool" "$mnt" --foreground -o "poll=$poll" < /dev/null &
daemon=$!
for _ in $(seq 300); do
    grep -q " $mnt .* - fuse.pmfs " /proc/self/mountinfo && break
    sleep 0.1
done
grep -q " $mnt .* - fuse.pmfs " /proc/self/mountinfo || { echo "bench-preload: mount failed" >&2; exit 1; }

declare -A dir=([FUSE]=$mnt/fuse [library]=$mnt/library [tmpfs]=$work/tmpfs/data)
declare -A result
setups=(FUSE library tmpfs)

# Runs "$@" for setup $1 (with the library preloaded for "library").
under() {
    local setup=$1
    shift
    if [ "$setup" = library ]; then
        LD_PRELOAD=$lib "$@"
    else
        "$@"
    fi
}

# fio in setup $1 on file $2 (rw mode $3, block size $4): IOPS and MiB/s from its report.
run_fio() {
    local setup=$1 file=$2 rw=$3 bs=$4
    local out=$work/fio.json
    under "$setup" fio --name="$rw" --directory="${dir[$setup]}" --filename="$file" \
        --ioengine=psync --thread --rw="$rw" --bs="$bs" --size="$fio_size" \
        --runtime="$fio_seconds" --time_based --output-format=json --output="$out" > /dev/null
    python3 - "$out" "$rw" << 'EOF'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
side = job["read"] if "read" in sys.argv[2] else job["write"]
print(f'{side["iops"]:.0f} {side["bw_bytes"] / 2**20:.1f}')
EOF
}

# db_bench benchmarks $2 in setup $1 with $3 operations: "name ops/sec" lines.
run_db() {
    local setup=$1 benchmarks=$2 num=$3
    under "$setup" db_bench --db="${dir[$setup]}/db-${benchmarks//,/-}" \
        --benchmarks="$benchmarks" --num="$num" --value_size=100 --compression_type=none \
        --threads=1 2> /dev/null |
        awk '/ micros\/op / { print $1, $5 }'
}

# The sqlite3 script for journal mode $1: a table, $sqlite_txs transactions of one row each
# (every commit syncs: synchronous=FULL), a scan, and the integrity check.
sqlite_script() {
    echo "PRAGMA journal_mode=$1; PRAGMA synchronous=FULL;"
    echo "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT NOT NULL);"
    awk -v n="$sqlite_txs" -v q="'" 'BEGIN {
        for (i = 1; i <= n; i++)
            printf "BEGIN; INSERT INTO t VALUES (%d, printf(%s%%0200d%s, %d)); COMMIT;\n", i, q, q, i * 7919
    }'
    echo "SELECT count(*), sum(length(v)) FROM t;"
    echo "PRAGMA integrity_check;"
}

# sqlite3 in setup $1 with journal mode $2: committed transactions per second (the whole
# script's wall time); fails unless the rows are all there and the check says ok.
run_sqlite() {
    local setup=$1 mode=$2
    local db=${dir[$setup]}/sqlite-$mode.db script=$work/sqlite-$mode.sql out=$work/sqlite.out
    rm -f "$db" "$db"-*
    [ -f "$script" ] || sqlite_script "$mode" > "$script"
    local start=$EPOCHREALTIME
    under "$setup" sqlite3 "$db" < "$script" > "$out"
    local end=$EPOCHREALTIME
    if [ "$(tail -2 "$out" | tr '\n' ' ')" != "$sqlite_txs|$((sqlite_txs * 200)) ok " ]; then
        echo "bench-preload: sqlite3 ($setup, $mode) went wrong:" >&2
        tail -5 "$out" >&2
        exit 1
    fi
    awk -v n="$sqlite_txs" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", n / (e - s) }'
}

for setup in "${setups[@]}"; do
    mkdir -p "${dir[$setup]}"
    echo "bench-preload: $setup" >&2
    read -r iops _ < <(run_fio "$setup" rand4k randread 4k)
    result[$setup,fio 4 KiB random read (IOPS)]=$iops
    read -r iops _ < <(run_fio "$setup" rand4k randwrite 4k)
    result[$setup,fio 4 KiB random write (IOPS)]=$iops
    read -r _ bw < <(run_fio "$setup" seq1m write 1M)
    result[$setup,fio 1 MiB sequential write (MiB/s)]=$bw
    read -r _ bw < <(run_fio "$setup" seq1m read 1M)
    result[$setup,fio 1 MiB sequential read (MiB/s)]=$bw
    while read -r name ops; do
        result[$setup,db_bench $name (ops/s)]=$ops
    done < <(run_db "$setup" fillrandom,readrandom "$db_num"; run_db "$setup" fillsync "$db_sync_num")
    for mode in "${journal_modes[@]}"; do
        result[$setup,sqlite3 journal_mode=$mode (tx/s)]=$(run_sqlite "$setup" "$mode")
    done
done

rows=(
    "fio 4 KiB random read (IOPS)"
    "fio 4 KiB random write (IOPS)"
    "fio 1 MiB sequential write (MiB/s)"
    "fio 1 MiB sequential read (MiB/s)"
    "db_bench fillrandom (ops/s)"
    "db_bench readrandom (ops/s)"
    "db_bench fillsync (ops/s)"
)
for mode in "${journal_modes[@]}"; do
    rows+=("sqlite3 journal_mode=$mode (tx/s)")
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "") printf "%.2f", a / b; else printf "-" }'; }
echo
echo "fio psync ${fio_seconds} s per job on a ${fio_size} file; db_bench ${db_num} ops" \
    "(fillsync ${db_sync_num}), 100-byte values; pool and tmpfs on ${pages}; poll window" \
    "${poll} µs"
echo
echo "| workload | FUSE | library | tmpfs | library/FUSE | library/tmpfs |"
echo "|---|---:|---:|---:|---:|---:|"
for row in "${rows[@]}"; do
    f=${result[FUSE,$row]:-} l=${result[library,$row]:-} t=${result[tmpfs,$row]:-}
    echo "| $row | ${f:--} | ${l:--} | ${t:--} | $(ratio "$l" "$f") | $(ratio "$l" "$t") |"
done
