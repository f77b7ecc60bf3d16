//! Files read with a bound, and hashed: what every input reader (traces, snapshots, workload
//! definitions, results files, plans) shares, kept below them all so none imports another for it;
//! and where native helpers built at first use are cached and how g++ is run for them.

use std::io::Read;
use std::path::Path;

use crate::error::InputError;

/// Reads `path` whole, gunzipped when it is gzip (by its magic bytes, whatever the name), refusing
/// one over `limit` bytes (read or decompressed) without reading past it: a file of gigabytes, a
/// sparse file of NUL bytes or /dev/zero is named, not loaded. `what` is what the file should be
/// ("a workload definition").
pub fn read_bytes_at_most(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, InputError> {
    let name = path.display().to_string();
    let too_large = || InputError::new(&name, format!("larger than {}: not {what}", crate::units::format_bytes(limit)));
    let mut data = Vec::new();
    let file = std::fs::File::open(path).map_err(|e| InputError::new(&name, format!("cannot read {what}: {e}")))?;
    file.take(limit + 1).read_to_end(&mut data).map_err(|e| InputError::new(&name, format!("cannot read {what}: {e}")))?;
    if data.len() as u64 > limit {
        return Err(too_large());
    }
    if !data.starts_with(&[0x1f, 0x8b]) {
        return Ok(data);
    }
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(&data[..])
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| InputError::new(&name, format!("a gzip file that does not decode: {e}")))?;
    if out.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(out)
}

/// [`read_bytes_at_most`], as UTF-8 text.
pub fn read_text_at_most(path: &Path, limit: u64, what: &str) -> Result<String, InputError> {
    let name = path.display().to_string();
    let bytes = read_bytes_at_most(path, limit, what)?;
    String::from_utf8(bytes).map_err(|e| {
        let line = 1 + e.as_bytes()[..e.utf8_error().valid_up_to()].iter().filter(|&&b| b == b'\n').count();
        InputError::new(format!("{name}:{line}"), "not valid UTF-8 text")
    })
}

/// Whether two paths name one file: the same path, or (for files that exist) the same inode,
/// whatever links or spellings lead there.
pub fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::path::absolute(a).ok() == std::path::absolute(b).ok()
        || std::fs::metadata(a).ok().zip(std::fs::metadata(b).ok()).is_some_and(|(x, y)| x.dev() == y.dev() && x.ino() == y.ino())
}

/// sha256 of a file's bytes, read in 1 MiB pieces (what `WorkloadInfo::sha256` holds for every input file).
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut f = std::fs::File::open(path).map_err(|e| InputError::new(path.display().to_string(), e.to_string()))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| InputError::new(path.display().to_string(), e.to_string()))?;
        if n == 0 {
            break;
        }
        sha2::Digest::update(&mut hasher, &buf[..n]);
    }
    Ok(hex(&sha2::Digest::finalize(hasher)))
}

/// sha256 of bytes in memory, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&<sha2::Sha256 as sha2::Digest>::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// FNV-1a, 64 bits, over `parts` (each ended by 0xff): a stable name for a native helper's build
/// inputs, so a changed source or library builds afresh.
pub fn build_key(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain([0xffu8].iter()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// `$XDG_CACHE_HOME/allocbench/SUB` (else `~/.cache/allocbench/SUB`): where native helpers built
/// at first use are kept.
pub fn cache_dir(sub: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    let base = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        home.join(".cache")
    });
    base.join("allocbench").join(sub)
}

/// Runs `g++ ARGS` to build a native helper; `what` names it in the one line that says why it
/// failed ("g++ could not build WHAT: <its first error>", or that g++ is missing).
pub fn run_gxx<I, S>(args: I, what: &str) -> Result<(), String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = std::process::Command::new("g++").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("g++ not found: {what} is built with g++ at first use (install g++)")
        } else {
            format!("cannot run g++: {e}")
        }
    })?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let first = text.lines().find(|l| l.contains("error")).unwrap_or("").trim().to_string();
    Err(format!("g++ could not build {what}: {first}"))
}
