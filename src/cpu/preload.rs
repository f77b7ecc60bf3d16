//! Which malloc really serves this process: `dladdr(dlsym(RTLD_DEFAULT, "malloc"))` names the
//! library that `malloc` resolves to (an LD_PRELOADed allocator wins the symbol lookup), and
//! `/proc/self/maps` shows what is mapped. A run is labelled by what served it, never by what
//! the environment variable asked for.

use std::collections::BTreeMap;
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};

use crate::error::InputError;
use crate::results::LiveMalloc;

/// Checks that a library loads under LD_PRELOAD and serves malloc: `probe` (this binary's
/// `malloc-info`) is run with it preloaded and must name it as malloc's library.
pub fn check_serves_malloc(probe: &Path, library: &Path) -> Result<(), InputError> {
    let loc = library.display().to_string();
    let out = std::process::Command::new(probe)
        .arg("malloc-info")
        .env("LD_PRELOAD", library)
        .output()
        .map_err(|e| InputError::new(&loc, format!("cannot run {} to check it: {e}", probe.display())))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    // ld.so ignores a preload it cannot load and says so on stderr.
    if let Some(line) = stderr.lines().find(|l| l.contains("cannot be preloaded") || l.contains("ld.so")) {
        return Err(InputError::new(&loc, format!("fails to load under LD_PRELOAD: {}", line.trim())));
    }
    let live: LiveMalloc = serde_json::from_slice(&out.stdout)
        .map_err(|_| InputError::new(&loc, format!("fails to load under LD_PRELOAD: {}", stderr.lines().next().unwrap_or("the probe crashed"))))?;
    let serves = std::fs::canonicalize(&live.library).map(|p| p == library).unwrap_or(false);
    if !serves {
        return Err(InputError::new(&loc, format!("is not an allocator: with it preloaded, malloc still comes from {}", live.library)));
    }
    Ok(())
}

pub fn classify(library: &str) -> String {
    let file = library.rsplit('/').next().unwrap_or(library);
    for (needle, name) in [("jemalloc", "jemalloc"), ("tcmalloc", "tcmalloc"), ("mimalloc", "mimalloc"), ("libc.so", "glibc"), ("libc-", "glibc")] {
        if file.contains(needle) {
            return name.to_string();
        }
    }
    file.to_string()
}

pub fn live_malloc() -> LiveMalloc {
    // SAFETY: dlsym and dladdr are thread-safe and get a NUL-terminated literal and a live,
    // zero-initialised Dl_info (all pointers: zero is a valid value) to fill. dli_fname, when
    // set, is the dynamic linker's NUL-terminated name of a loaded object, read at once; the
    // library that serves malloc is never unloaded.
    let library = unsafe {
        let sym = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        if !sym.is_null() && libc::dladdr(sym as *const c_void, &mut info) != 0 && !info.dli_fname.is_null() {
            CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned()
        } else {
            String::from("unknown")
        }
    };
    let mut mapped: Vec<String> = std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| ["jemalloc", "tcmalloc", "mimalloc"].iter().any(|n| p.contains(n)))
        .map(str::to_string)
        .collect();
    mapped.sort();
    mapped.dedup();
    LiveMalloc { name: classify(&library), library, mapped, ld_preload: std::env::var("LD_PRELOAD").ok().filter(|s| !s.is_empty()) }
}

/// Debian's packages for the LD_PRELOAD allocators (DEPENDENCIES.md).
pub const PRELOAD_LIBRARIES: &[(&str, &str, &str)] = &[
    ("jemalloc", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    ("tcmalloc", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    ("mimalloc", "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2", "libmimalloc2.0"),
];

/// Resolves `--preload NAME|PATH` to an existing library, or says how to get it.
pub fn resolve_preload(spec: &str) -> Result<PathBuf, InputError> {
    if let Some((_, path, package)) = PRELOAD_LIBRARIES.iter().find(|(n, _, _)| *n == spec) {
        let p = PathBuf::from(path);
        if p.exists() {
            return Ok(p);
        }
        return Err(InputError::new("--preload", format!("{path} not found: install it with `apt-get install {package}`")));
    }
    let p = PathBuf::from(spec);
    if p.exists() {
        Ok(p)
    } else {
        Err(InputError::new("--preload", format!("{spec} not found (known: jemalloc, tcmalloc, mimalloc, or a path to a .so)")))
    }
}

type MallctlFn = unsafe extern "C" fn(*const libc::c_char, *mut c_void, *mut usize, *mut c_void, usize) -> libc::c_int;
type TcPropertyFn = unsafe extern "C" fn(*const libc::c_char, *mut usize) -> libc::c_int;

/// The address of the global symbol `name`, null when no loaded object defines it.
fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym is thread-safe and only reads `name`, NUL-terminated by CStr.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Set in the child of [`rerun_preloaded`], so it runs instead of re-launching again.
const PRELOAD_CHILD_ENV: &str = "ALLOCBENCH_PRELOAD_CHILD";

/// Re-runs this very command with `LD_PRELOAD` of `spec`, so that the allocator serves every
/// malloc from the start, and returns the child's exit code; `None` in that child.
pub fn rerun_preloaded(spec: &str) -> anyhow::Result<Option<i32>> {
    if std::env::var_os(PRELOAD_CHILD_ENV).is_some() {
        return Ok(None);
    }
    let lib = resolve_preload(spec)?;
    let exe = std::env::current_exe()?;
    // A library that does not load or does not serve malloc is refused before anything runs.
    let canonical = std::fs::canonicalize(&lib).map_err(|e| InputError::new(spec, format!("cannot preload it: {e}")))?;
    check_serves_malloc(&exe, &canonical)?;
    let child = std::process::Command::new(exe).args(std::env::args_os().skip(1)).env("LD_PRELOAD", &lib).env(PRELOAD_CHILD_ENV, "1").spawn()?;
    // The child stops as on Ctrl-C and still writes what it measured.
    let status = crate::interrupt::wait_passing_on(child, libc::SIGINT, std::time::Duration::ZERO)?;
    Ok(Some(status.code().unwrap_or(1)))
}

/// Native stats of the malloc that serves the process (glibc `mallinfo2`, a preloaded jemalloc's
/// `mallctl`, tcmalloc's `MallocExtension_GetNumericProperty`, mimalloc's `mi_process_info`).
pub fn native_stats_of_live_malloc(live: &str) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    match live {
        "glibc" => {
            // SAFETY: mallinfo2 takes nothing and returns a struct by value; glibc locks each
            // arena while it sums it, so other threads may allocate meanwhile.
            let mi = unsafe { libc::mallinfo2() };
            m.insert("glibc.mallinfo2.arena".into(), mi.arena as u64);
            m.insert("glibc.mallinfo2.hblkhd".into(), mi.hblkhd as u64);
            m.insert("glibc.mallinfo2.uordblks".into(), mi.uordblks as u64);
            m.insert("glibc.mallinfo2.fordblks".into(), mi.fordblks as u64);
            m.insert("glibc.mallinfo2.keepcost".into(), mi.keepcost as u64);
        }
        "jemalloc" => {
            let f = symbol(c"mallctl");
            if !f.is_null() {
                // SAFETY: a global `mallctl` is jemalloc's public API (the compiled-in jemalloc's
                // is prefixed), whose prototype MallctlFn copies from jemalloc.h. Each call gets a
                // NUL-terminated name and, as that name's type asks, a live u64 to write (epoch)
                // or a live usize and its length to read into (stats.*: size_t); mallctl is
                // thread-safe.
                unsafe {
                    let mallctl: MallctlFn = std::mem::transmute(f);
                    let mut epoch: u64 = 1;
                    let mut len = std::mem::size_of::<u64>();
                    mallctl(c"epoch".as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), &mut epoch as *mut u64 as *mut c_void, len);
                    for key in ["stats.allocated", "stats.active", "stats.resident", "stats.mapped", "stats.retained", "stats.metadata"] {
                        let mut v: usize = 0;
                        len = std::mem::size_of::<usize>();
                        let ckey = std::ffi::CString::new(key).expect("no NUL");
                        if mallctl(ckey.as_ptr(), &mut v as *mut usize as *mut c_void, &mut len, std::ptr::null_mut(), 0) == 0 {
                            m.insert(format!("jemalloc.{key}"), v as u64);
                        }
                    }
                }
            }
        }
        "tcmalloc" => {
            let f = symbol(c"MallocExtension_GetNumericProperty");
            if !f.is_null() {
                // SAFETY: the symbol is gperftools' C entry point, whose prototype TcPropertyFn
                // copies (malloc_extension_c.h); each call gets a NUL-terminated name and a live
                // size_t to write, and the call is thread-safe.
                unsafe {
                    let get: TcPropertyFn = std::mem::transmute(f);
                    for key in ["generic.current_allocated_bytes", "generic.heap_size", "tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes"] {
                        let mut v: usize = 0;
                        let ckey = std::ffi::CString::new(key).expect("no NUL");
                        if get(ckey.as_ptr(), &mut v) != 0 {
                            m.insert(format!("tcmalloc.{key}"), v as u64);
                        }
                    }
                }
            }
        }
        "mimalloc" => {
            let f = symbol(c"mi_process_info");
            if !f.is_null() {
                type InfoFn = unsafe extern "C" fn(*mut usize, *mut usize, *mut usize, *mut usize, *mut usize, *mut usize, *mut usize, *mut usize);
                let mut v = [0usize; 8];
                // SAFETY: the symbol is mimalloc's mi_process_info, whose prototype InfoFn copies
                // (mimalloc.h: eight size_t*); it writes one size_t through each, here eight
                // distinct, live usize of `v`.
                unsafe {
                    let info: InfoFn = std::mem::transmute(f);
                    let [a, b, c, d, e, f2, g, h] = &mut v;
                    info(a, b, c, d, e, f2, g, h);
                }
                m.insert("mimalloc.current_commit".into(), v[5] as u64);
                m.insert("mimalloc.peak_commit".into(), v[6] as u64);
                m.insert("mimalloc.page_faults".into(), v[7] as u64);
            }
        }
        _ => {}
    }
    m
}

/// Gives cached memory back to the OS through the serving malloc's own call, found with `dlsym`
/// so it works under LD_PRELOAD: glibc `malloc_trim(0)`, jemalloc `mallctl("arena.4096.purge")`
/// (4096 = MALLCTL_ARENAS_ALL), tcmalloc `MallocExtension_ReleaseFreeMemory()`, mimalloc
/// `mi_collect(true)`. Returns what was called, or None when the allocator has no such call.
pub fn trim_live_malloc(live: &str) -> Option<&'static str> {
    match live {
        "glibc" => {
            // SAFETY: malloc_trim takes an integer; glibc locks each arena while it trims it, and
            // gives back only free pages.
            unsafe { libc::malloc_trim(0) };
            Some("malloc_trim(0)")
        }
        "jemalloc" => {
            let f = symbol(c"mallctl");
            if f.is_null() {
                return None;
            }
            // The purge takes no value: newp NULL, newlen 0.
            // SAFETY: a global `mallctl` is jemalloc's, with the prototype MallctlFn copies (see
            // `native_stats_of_live_malloc`); a NUL-terminated name and null old/new pointers with
            // newlen 0 ask it to act and read or write nothing. The purge frees only unused pages.
            let rc = unsafe {
                let mallctl: MallctlFn = std::mem::transmute(f);
                mallctl(c"arena.4096.purge".as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0)
            };
            (rc == 0).then_some("mallctl(arena.<ALL>.purge)")
        }
        "tcmalloc" => {
            let f = symbol(c"MallocExtension_ReleaseFreeMemory");
            if f.is_null() {
                return None;
            }
            // SAFETY: gperftools' `void MallocExtension_ReleaseFreeMemory(void)`
            // (malloc_extension_c.h), thread-safe; it gives back only free pages.
            unsafe {
                let release: unsafe extern "C" fn() = std::mem::transmute(f);
                release();
            }
            Some("MallocExtension_ReleaseFreeMemory()")
        }
        "mimalloc" => {
            let f = symbol(c"mi_collect");
            if f.is_null() {
                return None;
            }
            // SAFETY: mimalloc's `void mi_collect(bool force)` (mimalloc.h; C's bool is Rust's),
            // thread-safe; it frees only what no live block uses.
            unsafe {
                let collect: unsafe extern "C" fn(bool) = std::mem::transmute(f);
                collect(true);
            }
            Some("mi_collect(true)")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_debian_libraries() {
        assert_eq!(classify("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"), "jemalloc");
        assert_eq!(classify("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"), "tcmalloc");
        assert_eq!(classify("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2"), "mimalloc");
        assert_eq!(classify("/lib/x86_64-linux-gnu/libc.so.6"), "glibc");
    }

    #[test]
    fn without_preload_glibc_serves_malloc() {
        if std::env::var("LD_PRELOAD").is_ok() {
            return;
        }
        let live = live_malloc();
        assert_eq!(live.name, "glibc", "{live:?}");
        assert!(live.library.contains("libc.so"));
    }
}
