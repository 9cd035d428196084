//! The primitives must leave exactly the bytes a plain copy leaves, on every dispatch path
//! the machine has, for every size and every source/destination alignment within a line.

use proptest::prelude::*;

use super::*;

/// Two line-aligned buffers with room for any 0..64 misalignment plus guard bytes.
struct Bufs {
    src: Vec<u8>,
    dst: Vec<u8>,
    src_base: usize,
    dst_base: usize,
}

const GUARD: u8 = 0xc3;

impl Bufs {
    fn new(len: usize, seed: u64) -> Self {
        let cap = len + 3 * LINE;
        let mut x = seed | 1;
        let src: Vec<u8> = (0..cap)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let dst = vec![GUARD; cap];
        let src_base = src.as_ptr().align_offset(LINE);
        let dst_base = dst.as_ptr().align_offset(LINE);
        Self {
            src,
            dst,
            src_base,
            dst_base,
        }
    }

    /// Resets the destination to guard bytes.
    fn reset(&mut self) {
        self.dst.fill(GUARD);
    }

    /// The destination holds `expect` at `dst_off` and guard bytes everywhere else.
    fn check(&self, dst_off: usize, expect: &[u8]) {
        let start = self.dst_base + dst_off;
        let end = start + expect.len();
        assert!(
            self.dst[..start].iter().all(|&b| b == GUARD),
            "bytes before {start} changed"
        );
        assert!(
            self.dst[end..].iter().all(|&b| b == GUARD),
            "bytes after {end} changed"
        );
        assert!(
            self.dst[start..end] == *expect,
            "wrong bytes in {start}..{end}"
        );
    }

    fn copy(
        &mut self,
        path: DispatchPath,
        flush: bool,
        len: usize,
        src_off: usize,
        dst_off: usize,
    ) {
        let src = &self.src[self.src_base + src_off..self.src_base + src_off + len];
        let dst = self.dst[self.dst_base + dst_off..].as_mut_ptr();
        // SAFETY: `dst` has at least `len` writable bytes after it (capacity is len + 3 lines)
        // and belongs to another allocation than `src`; the path is available.
        unsafe { copy_nt_on(path, flush, dst, src.as_ptr(), len) };
        fence();
        self.check(dst_off, src);
    }

    /// [`copy_cached`] on `path`.
    fn read_copy(&mut self, path: DispatchPath, len: usize, src_off: usize, dst_off: usize) {
        let src = &self.src[self.src_base + src_off..self.src_base + src_off + len];
        let dst = self.dst[self.dst_base + dst_off..].as_mut_ptr();
        // SAFETY: as in `copy`.
        with_path(path, || unsafe { copy_cached(dst, src.as_ptr(), len) }).unwrap();
        self.check(dst_off, src);
    }

    fn fill(&mut self, path: DispatchPath, flush: bool, len: usize, dst_off: usize, byte: u8) {
        let dst = self.dst[self.dst_base + dst_off..].as_mut_ptr();
        // SAFETY: as in `copy`.
        unsafe { fill_nt_on(path, flush, dst, len, byte) };
        fence();
        self.check(dst_off, &vec![byte; len]);
    }
}

fn copy_case(path: DispatchPath, flush: bool, len: usize, src_off: usize, dst_off: usize) {
    Bufs::new(len, (len * 131 + src_off * 7 + dst_off) as u64)
        .copy(path, flush, len, src_off, dst_off);
}

fn fill_case(path: DispatchPath, flush: bool, len: usize, dst_off: usize, byte: u8) {
    Bufs::new(len, 1).fill(path, flush, len, dst_off, byte);
}

fn flush_case(kind: FlushKind, len: usize, off: usize) {
    let mut b = Bufs::new(len, 9);
    let expect = b.src[..len].to_vec();
    let start = b.dst_base + off;
    b.dst[start..start + len].copy_from_slice(&expect);
    if len != 0 {
        // SAFETY: the range lies inside `b.dst`; `kind` comes from the available list.
        unsafe { flush_lines(kind, b.dst[start..].as_ptr(), len) };
    }
    fence();
    b.check(off, &expect);
}

fn flush_kinds() -> Vec<FlushKind> {
    FlushKind::ALL
        .into_iter()
        .filter(|k| k.is_available())
        .collect()
}

proptest! {
    #[test]
    fn copy_nt_equals_plain_copy(len in 0usize..=8192, src_off in 0usize..64,
                                 dst_off in 0usize..64, flush in any::<bool>()) {
        for path in DispatchPath::available() {
            copy_case(path, flush, len, src_off, dst_off);
        }
    }

    #[test]
    fn copy_cached_equals_plain_copy(len in 0usize..=40_000, src_off in 0usize..64,
                                     dst_off in 0usize..64) {
        for path in DispatchPath::available() {
            Bufs::new(len, len as u64 + 3).read_copy(path, len, src_off, dst_off);
        }
    }

    #[test]
    fn fill_nt_equals_plain_fill(len in 0usize..=8192, dst_off in 0usize..64,
                                 byte in any::<u8>(), flush in any::<bool>()) {
        for path in DispatchPath::available() {
            fill_case(path, flush, len, dst_off, byte);
        }
    }

    #[test]
    fn flush_keeps_bytes(len in 0usize..=8192, off in 0usize..64) {
        for kind in flush_kinds() {
            flush_case(kind, len, off);
        }
    }
}

/// Sizes around every boundary of the copies: empty, inside one line, the threshold, a line
/// more or less than the unrolled block, the vector threshold of reads, and page-sized.
const EDGE_SIZES: [usize; 18] = [
    0, 1, 7, 63, 64, 65, 255, 256, 257, 319, 320, 511, 577, 1023, 1024, 1087, 4096, 4159,
];

#[test]
fn every_alignment_pair_on_every_copy_path() {
    // The flush kind does not change which bytes are written (the proptests cover each one);
    // the copy kind and the alignments decide the head/body/tail split.
    let flush = detected_path().flush;
    let copies = CopyKind::ALL.into_iter().filter(|k| k.is_available());
    for copy in copies {
        let path = DispatchPath { flush, copy };
        for &len in &EDGE_SIZES {
            let mut b = Bufs::new(len, len as u64 + 1);
            for src_off in 0..LINE {
                for dst_off in 0..LINE {
                    b.reset();
                    b.copy(path, true, len, src_off, dst_off);
                    b.reset();
                    b.read_copy(path, len, src_off, dst_off);
                }
                b.reset();
                b.fill(path, true, len, src_off, len as u8);
            }
        }
    }
}

#[test]
fn reads_around_the_string_copy_threshold_equal_plain_copies() {
    for len in [
        CACHED_STRING_MIN - 1,
        CACHED_STRING_MIN,
        CACHED_STRING_MIN + 65,
        1 << 20,
    ] {
        let mut b = Bufs::new(len, len as u64 + 5);
        for path in DispatchPath::available() {
            for (src_off, dst_off) in [(0, 0), (1, 63), (32, 7)] {
                b.reset();
                b.read_copy(path, len, src_off, dst_off);
            }
        }
    }
}

#[test]
fn detection_reports_an_available_path() {
    let best = detected_path();
    assert!(best.is_available());
    assert_eq!(DispatchPath::available()[0], best);
    assert!(DispatchPath::available().iter().all(|p| p.is_available()));
    // Without an override every thread uses the detected path.
    assert_eq!(
        std::thread::spawn(active_path).join().unwrap(),
        detected_path()
    );
    if cfg!(all(target_arch = "x86_64", not(miri))) {
        assert!(FlushKind::Clflush.is_available());
        assert!(CopyKind::Sse2.is_available());
        assert!(!FlushKind::Portable.is_available());
        assert_ne!(best.copy, CopyKind::Portable);
    } else {
        assert_eq!(best.flush, FlushKind::Portable);
        assert_eq!(best.copy, CopyKind::Portable);
    }
}

#[test]
fn with_path_forces_only_the_calling_thread() {
    for path in DispatchPath::available() {
        let seen = with_path(path, || {
            let other = std::thread::spawn(active_path).join().unwrap();
            (active_path(), flush_kind(), copy_kind(), other)
        })
        .unwrap();
        assert_eq!(seen, (path, path.flush, path.copy, detected_path()));
    }
    // Nested overrides restore the outer one, even when the inner closure panics.
    let all = DispatchPath::available();
    let (outer, inner) = (all[all.len() - 1], all[0]);
    with_path(outer, || {
        let r = std::panic::catch_unwind(|| {
            with_path(inner, || {
                assert_eq!(active_path(), inner);
                panic!("inner");
            })
        });
        assert!(r.is_err());
        assert_eq!(active_path(), outer);
    })
    .unwrap();
    assert_eq!(active_path(), detected_path());
}

#[test]
fn unavailable_paths_are_refused() {
    let missing = FlushKind::ALL
        .into_iter()
        .flat_map(|flush| CopyKind::ALL.map(|copy| DispatchPath { flush, copy }))
        .filter(|p| !p.is_available());
    for path in missing {
        assert!(matches!(with_path(path, || ()), Err(Error::Unsupported(_))));
    }
    if cfg!(all(target_arch = "x86_64", not(miri))) {
        let portable_flush = DispatchPath {
            flush: FlushKind::Portable,
            copy: CopyKind::Sse2,
        };
        assert!(with_path(portable_flush, || ()).is_err());
    }
}

#[test]
fn public_entry_points_use_the_forced_path() {
    for path in DispatchPath::available() {
        with_path(path, || {
            let src: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
            let mut dst = vec![0u8; 3100];
            // SAFETY: `dst` has 3100 writable bytes, distinct from `src`.
            unsafe {
                copy_nt(dst[5..].as_mut_ptr(), &src);
                fill_nt(dst[3010..].as_mut_ptr(), 90, 0xee);
                flush(dst.as_ptr(), dst.len());
            }
            fence();
            assert_eq!(&dst[5..3005], &src[..]);
            assert!(dst[3010..].iter().all(|&b| b == 0xee));
        })
        .unwrap();
    }
}

#[test]
fn split_covers_the_range() {
    for addr in [0usize, 1, 63, 64, 65, 4095] {
        for len in [0usize, 1, 62, 63, 64, 65, 128, 200, 1000] {
            let (h, b, t) = split(std::ptr::without_provenance_mut(addr), len);
            assert_eq!(h + b + t, len);
            assert!(h < LINE && t < LINE);
            assert_eq!(b % LINE, 0);
            if b != 0 {
                assert_eq!((addr + h) % LINE, 0);
            }
        }
    }
}
