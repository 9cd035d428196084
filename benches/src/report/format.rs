//! Numbers for humans: times with units, throughputs, table cells.

use super::criterion::Throughput;

/// A time unit: name and nanoseconds per unit.
pub type Unit = (&'static str, f64);

const UNITS: [Unit; 4] = [("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9)];

/// The largest unit in which `ns` is at least 1 (nanoseconds for small or odd values).
pub fn time_unit(ns: f64) -> Unit {
    UNITS
        .iter()
        .rev()
        .find(|(_, per)| ns >= *per)
        .copied()
        .unwrap_or(UNITS[0])
}

/// `x` with `sig` significant digits, without exponent (`1230`, `12.3`, `0.0123`).
pub fn sig(x: f64, sig: usize) -> String {
    if !x.is_finite() {
        return "n/a".to_string();
    }
    if x == 0.0 {
        return "0".to_string();
    }
    let magnitude = x.abs().log10().floor() as i64;
    let decimals = (sig as i64 - 1 - magnitude).max(0) as usize;
    format!("{x:.decimals$}")
}

/// A time in nanoseconds with a unit: `12.3 ns`, `4.56 µs`.
pub fn time(ns: f64) -> String {
    if !ns.is_finite() {
        return "n/a".to_string();
    }
    let (name, per) = time_unit(ns);
    format!("{} {name}", sig(ns / per, 3))
}

/// The rate an iteration of `median_ns` achieves: `812 Kelem/s`, `1.50 GiB/s`.
pub fn throughput(t: Throughput, median_ns: f64) -> String {
    let per_sec = |n: u64| n as f64 * 1e9 / median_ns;
    let (rate, base, prefixes, suffix): (f64, f64, [&str; 5], &str) = match t {
        Throughput::Elements(n) => (per_sec(n), 1e3, ["", "K", "M", "G", "T"], "elem/s"),
        Throughput::Bytes(n) => (per_sec(n), 1024.0, ["", "Ki", "Mi", "Gi", "Ti"], "B/s"),
        Throughput::BytesDecimal(n) => (per_sec(n), 1e3, ["", "K", "M", "G", "T"], "B/s"),
    };
    if !rate.is_finite() {
        return "n/a".to_string();
    }
    let mut scaled = rate;
    let mut i = 0;
    while scaled >= base && i + 1 < prefixes.len() {
        scaled /= base;
        i += 1;
    }
    format!("{} {}{suffix}", sig(scaled, 3), prefixes[i])
}

/// A table number: integers as integers, others with up to 4 significant digits and no
/// trailing zeros.
pub fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        let s = sig(n, 4);
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_get_units_and_three_digits() {
        assert_eq!(time(12.345), "12.3 ns");
        assert_eq!(time(999.0), "999 ns");
        assert_eq!(time(4560.0), "4.56 µs");
        assert_eq!(time(1.5e6), "1.50 ms");
        assert_eq!(time(2.0e9), "2.00 s");
        assert_eq!(time(0.5), "0.500 ns");
        assert_eq!(time(f64::NAN), "n/a");
    }

    #[test]
    fn throughputs_scale_with_the_right_base() {
        assert_eq!(throughput(Throughput::Elements(16), 1000.0), "16.0 Melem/s");
        assert_eq!(throughput(Throughput::Bytes(4096), 1000.0), "3.81 GiB/s");
        assert_eq!(
            throughput(Throughput::BytesDecimal(4096), 1000.0),
            "4.10 GB/s"
        );
        assert_eq!(throughput(Throughput::Elements(1), 2e9), "0.500 elem/s");
        assert_eq!(throughput(Throughput::Elements(1), 0.0), "n/a");
    }

    #[test]
    fn numbers_keep_integers_whole() {
        assert_eq!(number(262144.0), "262144");
        assert_eq!(number(0.84873), "0.8487");
        assert_eq!(number(0.85), "0.85");
        assert_eq!(number(0.0156), "0.0156");
        assert_eq!(number(7.63), "7.63");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(sig(0.0, 3), "0");
    }
}
