//! Byte quantities: parsing `80GiB`-style strings and printing them for people.

use serde::{Deserialize, Deserializer};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;
pub const PIB: u64 = 1 << 50;
pub const EIB: u64 = 1 << 60;

/// Largest device (capacity) and workload size an input may name: anything above 1 PiB is a
/// typo, not a device or a workload.
pub const MAX_SANE_BYTES: u64 = PIB;

/// A trace's requests must be below this. NativeCachingAllocator::allocate
/// (c10/cuda/CUDACachingAllocator.cpp) refuses `size >= one_exa_bytes` (1 EiB) with "Tried to
/// allocate more than 1EB memory"; anything smaller goes to the allocator, and a request that no
/// device can hold is an out-of-memory there, not bad input.
pub const MAX_REQUEST_BYTES: u64 = EIB;

/// An alloc's request as a trace or scenario gives it: below [`MAX_REQUEST_BYTES`] (0 bytes is
/// PyTorch's null pointer, accepted).
pub fn check_request_bytes(bytes: u64) -> Result<u64, String> {
    if bytes >= MAX_REQUEST_BYTES {
        return Err(format!("alloc of {bytes} bytes is 1 EiB or more: PyTorch refuses it (\"more than 1EB\")"));
    }
    Ok(bytes)
}

/// A device's memory, as any input names it (`--capacity`, a sweep plan's rows, a
/// torch_replay.py output): more than 0 bytes and at most [`MAX_SANE_BYTES`].
pub fn check_capacity(bytes: u64) -> Result<u64, String> {
    if bytes == 0 {
        return Err("capacity must be > 0".into());
    }
    if bytes > MAX_SANE_BYTES {
        return Err("capacity over 1 PiB is not a device".into());
    }
    Ok(bytes)
}

/// Parses `1048576`, `512B`, `4KiB`, `1.5GiB`, `80GB` (SI), `2MB`… into bytes.
/// Binary units (KiB, MiB, GiB, TiB, or Kubernetes' Ki, Mi, Gi, Ti) are powers of 1024; SI units
/// (kB, MB, GB, TB) powers of 1000. A bare letter (`80G`) is binary, as dd and `free -g` read it.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    if t.starts_with('-') {
        return Err(format!("size '{t}' is negative"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => KIB,
        "m" | "mi" | "mib" => MIB,
        "g" | "gi" | "gib" => GIB,
        "t" | "ti" | "tib" => TIB,
        "p" | "pi" | "pib" => PIB,
        "e" | "ei" | "eib" => EIB,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        "eb" => 1_000_000_000_000_000_000,
        other => return Err(format!("unknown unit '{other}' in size '{t}' (use B, KiB, MiB, GiB, TiB, PiB, EiB, or kB, MB, GB, TB, PB, EB)")),
    };
    if num.is_empty() {
        return Err(format!("size '{t}' has no number"));
    }
    let bytes = if let Some((whole, fraction)) = num.split_once('.') {
        // Exact decimal arithmetic (1.3GB is 1,300,000,000 bytes, which f64 misses by a hair).
        let not_a_size = || format!("'{t}' is not a size");
        if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) || fraction.len() > 18 {
            return Err(not_a_size());
        }
        let digits = |s: &str| if s.is_empty() { Ok(0) } else { s.parse::<u128>().map_err(|_| not_a_size()) };
        let scale = 10u128.pow(fraction.len() as u32);
        let (whole, fraction) = (digits(whole)?, digits(fraction)?);
        let scaled = whole.checked_mul(scale).and_then(|w| w.checked_add(fraction)).ok_or_else(|| format!("size '{t}' is too large"))?;
        let total = scaled.checked_mul(mult as u128).ok_or_else(|| format!("size '{t}' is too large"))?;
        // A device or a request holds whole bytes: `0.5B` is a typo, not 1 byte.
        if total % scale != 0 {
            return Err(format!("size '{t}' is not a whole number of bytes"));
        }
        u64::try_from(total / scale).map_err(|_| format!("size '{t}' is too large"))?
    } else {
        let v: u64 = num.parse().map_err(|_| format!("'{t}' is not a size"))?;
        v.checked_mul(mult).ok_or_else(|| format!("size '{t}' is too large"))?
    };
    Ok(bytes)
}

/// `n` and the noun, plural unless `n` is 1: `1 thread`, `2 threads`, `0 live blocks`.
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Prints bytes with a binary unit and three significant digits: `1.50 GiB`, `512 B`.
pub fn format_bytes(bytes: u64) -> String {
    format_bytes_signed(bytes as i128)
}

/// Seconds for people: `350 ms`, `1.20 s`, `12.0 µs`, `650 ns`.
pub fn format_duration(seconds: f64) -> String {
    let (value, unit) = match seconds.abs() {
        s if s >= 1.0 => (seconds, "s"),
        s if s >= 1e-3 => (seconds * 1e3, "ms"),
        s if s >= 1e-6 => (seconds * 1e6, "µs"),
        _ => (seconds * 1e9, "ns"),
    };
    let digits = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {unit}")
}

/// `bytes` as [`format_bytes`] writes it, in whole MiB when that would read the same as `other`
/// ("14.6 GiB" for both 15,655,239,680 and 15,699,279,872 bytes: "14,972 MiB" then).
pub fn format_bytes_apart(bytes: u64, other: u64) -> String {
    if bytes != other && format_bytes(bytes) == format_bytes(other) {
        return format!("{} MiB", indicatif::HumanCount(bytes.div_ceil(MIB)));
    }
    format_bytes(bytes)
}

pub fn format_bytes_signed(bytes: i128) -> String {
    let neg = bytes < 0;
    let b = bytes.unsigned_abs() as f64;
    let (v, unit) = if b >= PIB as f64 {
        (b / PIB as f64, "PiB")
    } else if b >= TIB as f64 {
        (b / TIB as f64, "TiB")
    } else if b >= GIB as f64 {
        (b / GIB as f64, "GiB")
    } else if b >= MIB as f64 {
        (b / MIB as f64, "MiB")
    } else if b >= KIB as f64 {
        (b / KIB as f64, "KiB")
    } else {
        return format!("{}{} B", if neg { "-" } else { "" }, b as u64);
    };
    let s = if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    format!("{}{s} {unit}", if neg { "-" } else { "" })
}

/// A byte count in a data file: an integer, or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom("expected a size: an integer byte count or a string such as \"512MiB\""))? {
            Raw::Int(v) if v < 0 => Err(serde::de::Error::custom(format!("size must not be negative (got {v})"))),
            Raw::Int(v) => Ok(Bytes(v as u64)),
            Raw::Text(s) => parse_bytes(&s).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("80GiB").unwrap(), 80 * GIB);
        assert_eq!(parse_bytes("81559MiB").unwrap(), 81_559 * MIB);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_bytes("1.3GB").unwrap(), 1_300_000_000);
        assert_eq!(parse_bytes("1EiB").unwrap(), EIB);
        assert_eq!(parse_bytes("2PB").unwrap(), 2_000_000_000_000_000);
        assert!(parse_bytes("16EiB").is_err());
        assert_eq!(parse_bytes("0.1MB").unwrap(), 100_000);
        assert_eq!(parse_bytes(".5KiB").unwrap(), 512);
        assert_eq!(parse_bytes("2.KiB").unwrap(), 2048);
        assert_eq!(parse_bytes("0.5B").unwrap_err(), "size '0.5B' is not a whole number of bytes");
        assert_eq!(parse_bytes("0.1KiB").unwrap_err(), "size '0.1KiB' is not a whole number of bytes");
        assert!(parse_bytes("1.2.3GiB").is_err() && parse_bytes(".GiB").is_err());
        assert!(parse_bytes("16.5EiB").is_err() && parse_bytes("20000000000.5GiB").is_err());
        assert_eq!(parse_bytes("80GB").unwrap(), 80_000_000_000);
        // A bare letter is binary (dd's reading); Kubernetes' `Gi` too.
        assert_eq!(parse_bytes("80G").unwrap(), 80 * GIB);
        assert_eq!(parse_bytes("80Gi").unwrap(), 80 * GIB);
        assert_eq!(parse_bytes("512Mi").unwrap(), 512 * MIB);
        assert_eq!(parse_bytes("512").unwrap(), 512);
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("99999999999999999999GiB").is_err());
        assert_eq!(parse_bytes("-1GiB").unwrap_err(), "size '-1GiB' is negative");
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 * GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes(20 * MIB), "20.0 MiB");
    }
}
