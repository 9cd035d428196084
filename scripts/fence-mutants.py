#!/usr/bin/env python3
"""Removes the engine's flushes, fences and persists one at a time and runs the crash tests.

Each mutant is the source with one of them gone: a statement `X.flush(..)?;`,
`X.persist(..)?;` or `X.fence();` deleted, or a `store_u64_persist`, `cas_u64_persist` or
`write_persist` turned into the same store without its flush and fence. A mutant is *killed*
when a crash test fails on it and *survives* when they all pass: then either no crash can
tell the ordering apart (the flush is redundant, or makes only a hint durable) or the tests
miss a crash they should have caught. Each survivor deserves a look; the script only lists
them. Works on a copy of the tree (a `git worktree` at /tmp/pmfs-fence-mutants, reset to this
tree's HEAD at each run and kept for the next, with its build; `git worktree remove --force`
it when done) and leaves this one alone.

Usage: python3 scripts/fence-mutants.py [--list] [--only SUBSTRING] [--tests T1,T2,...]
  --list     print the candidate sites and stop
  --only S   mutate the sites whose `path:line` contains S (S1,S2,...: those of S1 first)
  --tests    the crash tests to run (test targets of any crate of the workspace), default:
             CRASH_TESTS
Environment: PMFS_MUTANT_TIMEOUT (seconds per mutant's test run, default 900).
"""
import argparse, os, re, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKTREE = '/tmp/pmfs-fence-mutants'
SOURCES = ['crates/pmfs/src', 'crates/pmfs-core/src/log', 'crates/pmfs-mapping/src',
           'crates/pmfs-alloc/src']
CRASH_TESTS = [
    'log_appends_are_durable_prefixes_under_crash', 'log_compaction_is_atomic_under_crash',
    'log_digest_never_skips_an_entry_under_crash', 'metadata_ops_are_atomic_under_crash', 'rename_is_atomic_under_crash',
    'xattrs_and_special_files_are_atomic_under_crash', 'data_writes_are_atomic_under_crash',
    'data_size_ops_are_atomic_under_crash', 'data_gc_is_safe_under_crash',
    'recovery_is_idempotent_under_crash', 'operation_sequences_are_atomic_under_crash',
    'format_upgrade_is_atomic_under_crash',
    'failed_operations_roll_back_under_crash', 'mapped_files_are_durable_under_crash',
    # The mappings' and the allocator's own crash tests: seconds, next to the engine's minutes.
    'extent_crash', 'radix_crash', 'cuckoo_ops_are_atomic_under_crash',
    'hashfs_ops_are_atomic_under_crash', 'hashfs_cow_ops_are_atomic_under_crash',
    'hashfs_batched_apply_is_idempotent_under_crash', 'baseline_bitmap_is_crash_atomic',
]
STATEMENT = re.compile(r'^\s*[\w.()&*]+\.(flush|persist)\(.*\)\?;\s*$|^\s*[\w.()&*]+\.fence\(\);\s*$')
PERSISTING = re.compile(r'\b(store_u64|cas_u64|write)_persist\(')


def sites():
    """Every (path, line number, mutated line or None to delete it) outside test modules."""
    out = []
    for top in SOURCES:
        for d, _, files in sorted(os.walk(os.path.join(ROOT, top))):
            for f in sorted(files):
                path = os.path.join(d, f)
                if not f.endswith('.rs') or f == 'tests.rs' or '/tests/' in path:
                    continue
                rel = os.path.relpath(path, ROOT)
                lines = open(path).readlines()
                for n, line in enumerate(lines, 1):
                    # The inline test module ends the file's sites; a test-only module in
                    # a file of its own (`#[cfg(test)] mod races;`) does not.
                    if re.match(r'\s*mod \w+\s*\{', line) and n > 1 and 'test' in lines[n - 2]:
                        break
                    if line.lstrip().startswith('//'):
                        continue
                    if STATEMENT.match(line):
                        out.append((rel, n, None))
                    elif PERSISTING.search(line):
                        out.append((rel, n, PERSISTING.sub(r'\1(', line, count=1)))
    return out


def package(test):
    """The crate whose `tests/` holds the test target `test`."""
    crates = os.path.join(ROOT, 'crates')
    for crate in sorted(os.listdir(crates)):
        if os.path.exists(os.path.join(crates, crate, 'tests', f'{test}.rs')):
            return crate
    sys.exit(f'no crate has a test target named {test}')


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=WORKTREE, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--list', action='store_true')
    ap.add_argument('--only', default='')
    ap.add_argument('--tests', default=','.join(CRASH_TESTS))
    args = ap.parse_args()
    every = sites()
    chosen = []
    for part in args.only.split(','):
        chosen += [s for s in every if part in f'{s[0]}:{s[1]}' and s not in chosen]
    if args.list:
        for path, n, _ in chosen:
            print(f'{path}:{n}: {open(os.path.join(ROOT, path)).readlines()[n - 1].strip()}')
        return
    timeout = int(os.environ.get('PMFS_MUTANT_TIMEOUT', '900'))
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    if not os.path.isdir(WORKTREE):
        subprocess.run(['git', 'worktree', 'add', '--detach', WORKTREE, head], cwd=ROOT,
                       check=True, capture_output=True)
    # This tree's HEAD, and no mutant an interrupted run left behind.
    run(['git', 'reset', '-q', '--hard', head]).check_returncode()
    tests = args.tests.split(',')
    test_args = [a for t in tests for a in ('--test', t)]
    packages = sorted({package(t) for t in tests})
    # Release code without the release profile's fat LTO, which dominates each rebuild.
    fast = [a for c in ('lto=false', 'codegen-units=16', 'debug=0')
            for a in ('--config', f'profile.release.{c}')]
    cargo = ['cargo', 'test', '--release', *fast, '-q',
             *[a for p in packages for a in ('-p', p)], *test_args]
    survivors = []
    for i, (path, n, mutated) in enumerate(chosen, 1):
        file = os.path.join(WORKTREE, path)
        original = open(file).readlines()
        lines = list(original)
        lines[n - 1] = '' if mutated is None else mutated
        open(file, 'w').writelines(lines)
        t = time.time()
        try:
            build = run([*cargo, '--no-run'])
            if build.returncode != 0:
                verdict = 'does not build'
            else:
                try:
                    verdict = 'killed' if run(cargo, timeout=timeout).returncode else 'survived'
                except subprocess.TimeoutExpired:
                    verdict = 'killed (timeout)'
        finally:
            open(file, 'w').writelines(original)
        if verdict == 'survived':
            survivors.append(f'{path}:{n}')
        print(f'[{i}/{len(chosen)}] {path}:{n}: {original[n - 1].strip()} -> {verdict} '
              f'({time.time() - t:.0f} s)', flush=True)
    print(f'{len(chosen) - len(survivors)} of {len(chosen)} killed; survivors: '
          f'{" ".join(survivors) or "none"}')


if __name__ == '__main__':
    sys.exit(main())
