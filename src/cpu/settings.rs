//! Allocator settings as configs (`--settings ALLOCATOR:key=value[,key=value...]`): each becomes
//! the environment the allocator reads at start-up, and a name the allocator does not know is
//! refused before anything runs.
//!
//! - glibc: `GLIBC_TUNABLES=glibc.malloc.<key>=<value>:...` (the tunables of glibc's
//!   manual, "Memory Allocation Tunables"); `arena_max` also sets `MALLOC_ARENA_MAX`.
//! - jemalloc: `MALLOC_CONF=<key>:<value>,...` (jemalloc's `opt.*` names).
//! - tcmalloc (gperftools): `TCMALLOC_<KEY>=<value>` per key.
//! - mimalloc: `MIMALLOC_<KEY>=<value>` per key.
//! - python: `PYTHONMALLOC=<value>` (`pythonmalloc=malloc|pymalloc|mimalloc`, and their `_debug`
//!   forms), for `--exec` runs of a Python program: it applies under every allocator.
//!
//! jemalloc, tcmalloc and mimalloc names are checked against the library that will run: the name
//! must be in it (as its option table's string), so a typo, or an option of another version, is
//! refused with the names that version has. mimalloc 2.1 renamed `reset_delay` to `purge_delay`:
//! either name is given to a library under the one it knows.

use std::path::Path;

use crate::error::InputError;

/// glibc's malloc tunables (glibc 2.26+; `mxfast` 2.26, `tcache_*` 2.26, `hugetlb` 2.35).
pub const GLIBC_TUNABLES: &[&str] = &[
    "arena_max",
    "arena_test",
    "hugetlb",
    "mmap_max",
    "mmap_threshold",
    "mxfast",
    "perturb",
    "tcache_count",
    "tcache_max",
    "tcache_unsorted_limit",
    "top_pad",
    "trim_threshold",
];
/// jemalloc's usual `MALLOC_CONF` options, named in the refusal of an unknown one.
const JEMALLOC_USUAL: &[&str] = &[
    "narenas",
    "dirty_decay_ms",
    "muzzy_decay_ms",
    "background_thread",
    "max_background_threads",
    "tcache",
    "tcache_max",
    "percpu_arena",
    "oversize_threshold",
    "retain",
    "thp",
    "metadata_thp",
];
/// gperftools' usual environment settings (lower case, without `TCMALLOC_`).
const TCMALLOC_USUAL: &[&str] = &["release_rate", "max_total_thread_cache_bytes", "aggressive_decommit", "heap_limit_mb", "transfer_num_obj"];
/// mimalloc's usual options (lower case, without `MIMALLOC_`; 2.0 and 2.1+ names).
const MIMALLOC_USUAL: &[&str] = &[
    "purge_delay",
    "reset_delay",
    "arena_eager_commit",
    "eager_commit",
    "eager_commit_delay",
    "allow_decommit",
    "purge_decommits",
    "large_os_pages",
    "reserve_huge_os_pages",
    "arena_reserve",
];
/// The values `PYTHONMALLOC` takes (CPython's "PYTHONMALLOC" docs; mimalloc from 3.13).
const PYTHONMALLOC: &[&str] = &["malloc", "pymalloc", "mimalloc", "debug", "malloc_debug", "pymalloc_debug", "mimalloc_debug"];

/// One `--settings` config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// glibc, jemalloc, tcmalloc, mimalloc or python.
    pub allocator: String,
    pub pairs: Vec<(String, String)>,
}

/// Parses `ALLOCATOR:key=value[,key=value...]`.
pub fn parse(spec: &str) -> Result<Settings, InputError> {
    let bad = |m: String| InputError::new("--settings", m);
    let (allocator, rest) =
        spec.split_once(':').ok_or_else(|| bad(format!("'{spec}': expected ALLOCATOR:key=value[,key=value...], e.g. jemalloc:narenas=4,dirty_decay_ms=0")))?;
    let allocator = allocator.trim();
    if !["glibc", "jemalloc", "tcmalloc", "mimalloc", "python"].contains(&allocator) {
        return Err(bad(format!("'{spec}': settings are for glibc, jemalloc, tcmalloc, mimalloc or python, not '{allocator}'")));
    }
    let mut pairs = Vec::new();
    for pair in rest.split(',') {
        let (k, v) = pair.split_once('=').ok_or_else(|| bad(format!("'{pair}' in '{spec}': expected key=value")))?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(format!("'{k}' in '{spec}': a setting's name is letters, digits and _")));
        }
        if v.is_empty() || v.contains([':', ',', '=', ' ']) {
            return Err(bad(format!("'{v}' for {k} in '{spec}': a value without ':', ',', '=' or spaces")));
        }
        pairs.push((k, v.to_string()));
    }
    Ok(Settings { allocator: allocator.to_string(), pairs })
}

/// Whether `name` is a NUL-terminated string in `library` (alone, or after a '.' as jemalloc's
/// `opt.<name>` strings are merged).
fn library_knows(library: &[u8], name: &str) -> bool {
    let needle = format!("{name}\0");
    memchr::memmem::find_iter(library, needle.as_bytes()).any(|at| at == 0 || matches!(library[at - 1], 0 | b'.'))
}

/// The environment `settings` sets for a run under `library` (the preloaded allocator; None for
/// glibc), every name checked.
pub fn environment(settings: &Settings, library: Option<&Path>) -> Result<Vec<(String, String)>, InputError> {
    let s = settings;
    let unknown = |k: &str, lib: &str, usual: &[&str], bytes: &[u8]| {
        // The usual names this library has (all of them when there is no library to ask).
        let known: Vec<&str> = usual
            .iter()
            .copied()
            .filter(|n| bytes.is_empty() || library_knows(bytes, n) || library_knows(bytes, &format!("TCMALLOC_{}", n.to_ascii_uppercase())))
            .collect();
        InputError::new("--settings", format!("{} does not know the setting '{k}' ({lib}); known: {}", s.allocator, known.join(", ")))
    };
    let bytes = match (s.allocator.as_str(), library) {
        ("jemalloc" | "tcmalloc" | "mimalloc", Some(lib)) => {
            std::fs::read(lib).map_err(|e| InputError::new(lib.display().to_string(), format!("cannot read it to check the settings: {e}")))?
        }
        ("jemalloc" | "tcmalloc" | "mimalloc", None) => {
            return Err(InputError::new("--settings", format!("{} settings need {} to run", s.allocator, s.allocator)))
        }
        _ => Vec::new(),
    };
    let lib = library.map(|l| l.display().to_string()).unwrap_or_default();
    Ok(match s.allocator.as_str() {
        "glibc" => {
            for (k, _) in &s.pairs {
                if !GLIBC_TUNABLES.contains(&k.as_str()) {
                    return Err(unknown(k, "glibc.malloc tunables", GLIBC_TUNABLES, &[]));
                }
            }
            let t: Vec<String> = s.pairs.iter().map(|(k, v)| format!("glibc.malloc.{k}={v}")).collect();
            let mut env = vec![("GLIBC_TUNABLES".to_string(), t.join(":"))];
            // The variable most deployments set for it (glibc reads both; the tunable wins).
            if let Some((_, v)) = s.pairs.iter().find(|(k, _)| k == "arena_max") {
                env.push(("MALLOC_ARENA_MAX".into(), v.clone()));
            }
            env
        }
        "jemalloc" => {
            for (k, _) in &s.pairs {
                if !library_knows(&bytes, k) {
                    return Err(unknown(k, &lib, JEMALLOC_USUAL, &bytes));
                }
            }
            let conf: Vec<String> = s.pairs.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            vec![("MALLOC_CONF".into(), conf.join(","))]
        }
        "tcmalloc" => s
            .pairs
            .iter()
            .map(|(k, v)| {
                let var = format!("TCMALLOC_{}", k.to_ascii_uppercase());
                if library_knows(&bytes, &var) {
                    Ok((var, v.clone()))
                } else {
                    Err(unknown(k, &lib, TCMALLOC_USUAL, &bytes))
                }
            })
            .collect::<Result<_, _>>()?,
        "mimalloc" => s
            .pairs
            .iter()
            .map(|(k, v)| {
                // mimalloc 2.1 renamed reset_delay to purge_delay (the same timer).
                let name = [
                    k.as_str(),
                    if k == "purge_delay" {
                        "reset_delay"
                    } else if k == "reset_delay" {
                        "purge_delay"
                    } else {
                        ""
                    },
                ]
                .into_iter()
                .find(|n| !n.is_empty() && library_knows(&bytes, n))
                .ok_or_else(|| unknown(k, &lib, MIMALLOC_USUAL, &bytes))?;
                Ok((format!("MIMALLOC_{}", name.to_ascii_uppercase()), v.clone()))
            })
            .collect::<Result<_, _>>()?,
        _ => {
            let mut env = Vec::new();
            for (k, v) in &s.pairs {
                if k != "pythonmalloc" {
                    return Err(unknown(k, "Python", &["pythonmalloc"], &[]));
                }
                if !PYTHONMALLOC.contains(&v.as_str()) {
                    return Err(InputError::new("--settings", format!("PYTHONMALLOC={v} is not one of {}", PYTHONMALLOC.join(", "))));
                }
                env.push(("PYTHONMALLOC".to_string(), v.clone()));
            }
            env
        }
    })
}

/// How settings read in a record and a label: `K=V` each.
pub fn describe(env: &[(String, String)]) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_typos_are_refused() {
        let s = parse("glibc:arena_max=4,trim_threshold=131072").unwrap();
        assert_eq!(
            environment(&s, None).unwrap(),
            vec![("GLIBC_TUNABLES".into(), "glibc.malloc.arena_max=4:glibc.malloc.trim_threshold=131072".into()), ("MALLOC_ARENA_MAX".into(), "4".into())]
        );
        let e = environment(&parse("glibc:arena_maxx=4").unwrap(), None).unwrap_err().to_string();
        assert!(e.contains("arena_maxx") && e.contains("arena_max,"), "{e}");
        assert!(parse("jemalloc narenas=4").is_err());
        assert!(parse("hoard:x=1").is_err());
        assert!(parse("jemalloc:narenas").is_err());
        assert!(parse("jemalloc:narenas=4:5").is_err());
        let p = parse("python:pythonmalloc=malloc").unwrap();
        assert_eq!(environment(&p, None).unwrap(), vec![("PYTHONMALLOC".into(), "malloc".into())]);
        assert!(environment(&parse("python:pythonmalloc=hoard").unwrap(), None).is_err());
    }

    #[test]
    fn names_are_checked_against_the_library() {
        let lib = b"\0opt.narenas\0dirty_decay_ms\0TCMALLOC_RELEASE_RATE\0reset_delay\0";
        assert!(library_knows(lib, "narenas"));
        assert!(library_knows(lib, "dirty_decay_ms"));
        assert!(!library_knows(lib, "arenas"), "a name inside another is not it");
        assert!(!library_knows(lib, "narena"));
        let dir = tempfile::tempdir().unwrap();
        let so = dir.path().join("lib.so");
        std::fs::write(&so, lib).unwrap();
        let env = environment(&parse("jemalloc:narenas=2,dirty_decay_ms=0").unwrap(), Some(&so)).unwrap();
        assert_eq!(env, vec![("MALLOC_CONF".into(), "narenas:2,dirty_decay_ms:0".into())]);
        assert!(environment(&parse("jemalloc:narena=2").unwrap(), Some(&so)).is_err());
        let env = environment(&parse("tcmalloc:release_rate=10").unwrap(), Some(&so)).unwrap();
        assert_eq!(env, vec![("TCMALLOC_RELEASE_RATE".into(), "10".into())]);
        // A 2.0 library knows the purge delay as reset_delay.
        let env = environment(&parse("mimalloc:purge_delay=0").unwrap(), Some(&so)).unwrap();
        assert_eq!(env, vec![("MIMALLOC_RESET_DELAY".into(), "0".into())]);
        let e = environment(&parse("mimalloc:arena_eager_commit=1").unwrap(), Some(&so)).unwrap_err().to_string();
        assert!(e.contains("does not know the setting 'arena_eager_commit'") && e.ends_with("known: reset_delay"), "only what this library has: {e}");
    }
}
