//! `allocbench cpu --exec -- CMD`: runs a real program under each allocator (LD_PRELOAD; glibc =
//! none), samples the RSS of its whole process tree from /proc from start to exit, and proves
//! from the tree's mappings which malloc served it. CPU time and page faults come from `wait4`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::preload::{classify, PRELOAD_LIBRARIES};
use super::rss::process_rss;
use crate::error::InputError;
use crate::results::{CpuExecResult, MachineInfo, SCHEMA_VERSION};

/// The names `--allocator all` expands to, in the order repetitions interleave them.
pub const EXEC_ALLOCATORS: [&str; 4] = ["glibc", "jemalloc", "tcmalloc", "mimalloc"];

/// One allocator a program runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecAllocator {
    pub name: String,
    /// The library preloaded (canonical path); None for glibc.
    pub library: Option<PathBuf>,
}

/// Resolves `--allocator` for `--exec`: `all`, or a comma list of glibc, jemalloc, tcmalloc,
/// mimalloc and `.so` paths. `all` skips a Debian library that is not installed (said in the
/// returned notes); naming one that is missing is an error.
pub fn resolve_allocators(spec: &str) -> Result<(Vec<ExecAllocator>, Vec<String>), InputError> {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let names: Vec<&str> = if spec == "all" { EXEC_ALLOCATORS.to_vec() } else { spec.split(',').map(str::trim).collect() };
    for name in names {
        if name == "glibc" {
            out.push(ExecAllocator { name: "glibc".into(), library: None });
        } else if let Some((_, path, package)) = PRELOAD_LIBRARIES.iter().find(|(n, _, _)| *n == name) {
            match std::fs::canonicalize(path) {
                Ok(p) => out.push(ExecAllocator { name: name.into(), library: Some(p) }),
                Err(_) if spec == "all" => notes.push(format!("skipped {name}: {path} is not installed (apt-get install {package})")),
                Err(_) => return Err(InputError::new("--allocator", format!("{path} not found: install it with `apt-get install {package}`"))),
            }
        } else if name.contains('/') || name.contains(".so") {
            let p = std::fs::canonicalize(name).map_err(|e| InputError::new(name, format!("cannot preload it: {e}")))?;
            out.push(ExecAllocator { name: classify(&p.display().to_string()), library: Some(p) });
        } else {
            return Err(InputError::new(
                "--allocator",
                format!("unknown allocator '{name}' for --exec (known: {}, all, or a path to a .so)", EXEC_ALLOCATORS.join(", ")),
            ));
        }
    }
    if out.is_empty() {
        return Err(InputError::new("--allocator", "no allocator to run under"));
    }
    Ok((out, notes))
}

/// How to run.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    pub sample_interval: Duration,
    /// Send the program's stdout to this process's stderr (when stdout carries the results).
    pub program_stdout_to_stderr: bool,
    /// Set in the program's environment (an allocator's settings, the recorder's spool folder).
    pub env: Vec<(String, String)>,
}

/// `root` and every descendant: children from `/proc/PID/task/*/children`, else (kernels
/// without CONFIG_PROC_CHILDREN) from the parent field of every `/proc/PID/stat`.
pub fn process_tree(root: i32) -> Vec<i32> {
    let mut tree = vec![root];
    let mut i = 0;
    let with_children_files = Path::new(&format!("/proc/{root}/task/{root}/children")).exists();
    let parents = if with_children_files { Vec::new() } else { all_parents() };
    while i < tree.len() {
        let pid = tree[i];
        if with_children_files {
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                for t in tasks.flatten() {
                    let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                    tree.extend(kids.split_whitespace().filter_map(|k| k.parse::<i32>().ok()));
                }
            }
        } else {
            tree.extend(parents.iter().filter(|(_, pp)| *pp == pid).map(|(p, _)| *p));
        }
        i += 1;
    }
    tree.sort_unstable();
    tree.dedup();
    tree
}

/// (pid, parent pid) of every process.
fn all_parents() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The name is in parentheses and may hold spaces: fields after the last ')'.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// What the mappings of a process tree showed: allocator libraries and libc.
#[derive(Debug, Default, Clone)]
pub struct MappedAllocators {
    /// Paths of mapped allocator libraries (jemalloc, tcmalloc, mimalloc, or the preloaded one).
    pub allocators: BTreeSet<String>,
    /// A mapped libc, if any process mapped one.
    pub libc: Option<String>,
}

impl MappedAllocators {
    /// Adds what `/proc/PID/maps` shows; `preloaded` counts as an allocator whatever its name.
    pub fn scan(&mut self, pid: i32, preloaded: Option<&Path>) {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return };
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let kind = classify(path);
            if ["jemalloc", "tcmalloc", "mimalloc"].contains(&kind.as_str()) || preloaded.is_some_and(|p| Path::new(path) == p) {
                self.allocators.insert(path.to_string());
            } else if kind == "glibc" && self.libc.is_none() {
                self.libc = Some(path.to_string());
            }
        }
    }

    /// Which malloc this proves, and by which library: the preloaded library if it was mapped;
    /// for no preload, glibc when libc and no other allocator was mapped.
    pub fn proof(&self, preloaded: Option<&Path>, name: &str) -> (Option<String>, Option<String>) {
        match preloaded {
            Some(lib) => {
                let lib = lib.display().to_string();
                if self.allocators.contains(&lib) {
                    (Some(name.to_string()), Some(lib))
                } else {
                    (None, None)
                }
            }
            None => match (self.allocators.iter().next(), &self.libc) {
                (Some(other), _) => (Some(classify(other)), Some(other.clone())),
                (None, Some(libc)) => (Some("glibc".into()), Some(libc.clone())),
                (None, None) => (None, None),
            },
        }
    }
}

/// The statically linked executable `command` starts, if it does: its `command[0]` found on
/// `PATH`, or for a `#!` script its interpreter (through `env`). The dynamic loader, which
/// honours LD_PRELOAD, never runs for such a program, so no allocator can be put in front of its
/// malloc. None when it is dynamically linked or cannot be read.
pub fn static_executable(command: &[String]) -> Option<PathBuf> {
    let mut path = find_on_path(command.first()?)?;
    // A script's interpreter is the program the loader starts (`#!/usr/bin/env python3` too).
    for _ in 0..4 {
        let head = read_head(&path)?;
        let Some(line) = head.strip_prefix(b"#!") else {
            return elf_without_interpreter(&head).filter(|&is_static| is_static).map(|_| path);
        };
        let line = String::from_utf8_lossy(line.split(|&b| b == b'\n').next().unwrap_or_default()).into_owned();
        let mut words = line.split_whitespace();
        let interpreter = find_on_path(words.next()?)?;
        path = if interpreter.file_name().is_some_and(|n| n == "env") {
            find_on_path(words.find(|w| !w.starts_with('-') && !w.contains('='))?)?
        } else {
            interpreter
        };
    }
    None
}

/// `name` itself when it holds a `/`, else the first executable file of that name on `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The first 64 KiB of a file: an ELF's program headers follow its header.
fn read_head(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(path).ok()?.take(64 << 10).read_to_end(&mut head).ok()?;
    Some(head)
}

/// Whether an ELF executable has no `PT_INTERP` program header (no dynamic loader: static or
/// static-pie); None when `data` is not an ELF executable this can read.
fn elf_without_interpreter(data: &[u8]) -> Option<bool> {
    use object::elf::{FileHeader32, FileHeader64, ET_DYN, ET_EXEC, PT_INTERP};
    use object::read::elf::{FileHeader, ProgramHeader};
    use object::Endianness;
    fn check<H: FileHeader<Endian = Endianness>>(data: &[u8]) -> Option<bool> {
        let header = H::parse(data).ok()?;
        let endian = header.endian().ok()?;
        if ![ET_EXEC, ET_DYN].contains(&header.e_type(endian)) {
            return None;
        }
        let headers = header.program_headers(endian, data).ok()?;
        Some(!headers.iter().any(|ph| ph.p_type(endian) == PT_INTERP))
    }
    match object::FileKind::parse(data).ok()? {
        object::FileKind::Elf64 => check::<FileHeader64<Endianness>>(data),
        object::FileKind::Elf32 => check::<FileHeader32<Endianness>>(data),
        _ => None,
    }
}

/// The program's short name: its first `*.py` argument, else the executable's file name.
pub fn program_name(command: &[String]) -> String {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    command.iter().find(|a| a.ends_with(".py")).or(command.first()).map(|a| base(a)).unwrap_or_default()
}

/// What the sampler thread saw.
#[derive(Default)]
struct Observed {
    rss: Vec<(f64, u64)>,
    mapped: MappedAllocators,
    max_processes: u32,
    interrupted: bool,
}

/// Where `program` is, as execvp finds it: a name with a `/` is a path, else the first file of
/// that name on PATH (`/bin:/usr/bin` when PATH is unset, as glibc's execvp) that this process may
/// execute. The error says why it would not start.
pub fn find_program(program: &str) -> Result<std::path::PathBuf, String> {
    // access(2) with the effective ids: what exec will check (mode bits alone say nothing of
    // whose they are, or of a noexec mount).
    let may_execute = |p: &std::path::Path| {
        let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())) else { return false };
        // SAFETY: `c` is a NUL-terminated path this closure owns and keeps alive across the call;
        // faccessat only reads it, and AT_FDCWD needs no descriptor of ours.
        unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::X_OK, libc::AT_EACCESS) == 0 }
    };
    if program.contains('/') {
        let p = std::path::Path::new(program);
        return match p.metadata() {
            Err(_) => Err("no such program".into()),
            Ok(m) if m.is_dir() => Err("is a directory, not a program".into()),
            Ok(_) if !may_execute(p) => Err("is not executable (chmod +x it, or run it through its interpreter)".into()),
            Ok(_) => Ok(p.to_path_buf()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    let found: Vec<std::path::PathBuf> = std::env::split_paths(&path).map(|dir| dir.join(program)).filter(|p| p.is_file()).collect();
    match found.iter().find(|p| may_execute(p)) {
        Some(p) => Ok(p.clone()),
        None => match found.first() {
            Some(p) => Err(format!("found at {}, which is not executable", p.display())),
            None => Err("no such program on PATH".into()),
        },
    }
}

/// Runs `command` once under `alloc`, sampling its process tree until it exits. A command that
/// cannot start is a result (exit code 127 or 126, `error` says why), never an error.
pub fn run_once(command: &[String], alloc: &ExecAllocator, rep: u32, opts: &ExecOptions) -> CpuExecResult {
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]);
    if opts.program_stdout_to_stderr {
        cmd.stdout(std::io::stderr());
    }
    match &alloc.library {
        Some(lib) => cmd.env("LD_PRELOAD", lib),
        None => cmd.env_remove("LD_PRELOAD"),
    };
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    let mut result = CpuExecResult {
        schema_version: SCHEMA_VERSION,
        allocator: alloc.name.clone(),
        served_by: None,
        served_by_library: None,
        ld_preload: alloc.library.as_ref().map(|p| p.display().to_string()),
        command: command.to_vec(),
        name: program_name(command),
        rep,
        exit_code: 0,
        error: None,
        wall_s: 0.0,
        user_s: 0.0,
        sys_s: 0.0,
        minor_faults: 0,
        major_faults: 0,
        peak_rss_bytes: 0,
        max_processes: 0,
        rss: Vec::new(),
        machine: MachineInfo::current(),
        interrupted: false,
        // What the caller set for the allocator (allocbench's own variables are not settings).
        settings: opts.env.iter().filter(|(k, _)| !k.starts_with("ALLOCBENCH_")).map(|(k, v)| format!("{k}={v}")).collect(),
    };
    // A child's ru_maxrss starts from this process's high-water mark (exec records the forked
    // copy's peak): a figure at or below it may be ours, not the program's, so it is taken only
    // above it, or when no sample caught the program at all (an upper bound then).
    let own_peak = crate::cpu::rss::peak_rss_bytes();
    let start = Instant::now();
    // spawn returns after the exec succeeded (or failed): the sampler sees the program, not a
    // copy of this process.
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            result.exit_code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            result.error = Some(format!("cannot run {}: {e}", command[0]));
            return result;
        }
    };
    let pid = child.id() as i32;
    let done = Arc::new(AtomicBool::new(false));
    let observed = Arc::new(Mutex::new(Observed::default()));
    let sampler = {
        let (done, observed, interval) = (done.clone(), observed.clone(), opts.sample_interval);
        let preloaded = alloc.library.clone();
        let name = alloc.name.clone();
        std::thread::spawn(move || sample_tree(pid, start, interval, preloaded.as_deref(), &name, &done, &observed))
    };
    // wait4 reaps the child and gives its rusage (and that of its waited-for descendants).
    let mut status = 0;
    // SAFETY: rusage is a plain C struct of integers and timevals: all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = loop {
        // SAFETY: `status` and `usage` are live locals of the types wait4(2) writes; `pid` is the
        // child spawned above, which nothing else waits for (std's Child is dropped unwaited).
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == pid || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break rc == pid;
        }
    };
    result.wall_s = start.elapsed().as_secs_f64();
    done.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    drop(child);
    let obs = std::mem::take(&mut *observed.lock().expect("sampler lock"));
    if waited {
        if libc::WIFEXITED(status) {
            result.exit_code = libc::WEXITSTATUS(status);
        } else if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            result.exit_code = 128 + sig;
            result.error = Some(format!("killed by signal {sig}"));
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        result.user_s = secs(usage.ru_utime);
        result.sys_s = secs(usage.ru_stime);
        result.minor_faults = usage.ru_minflt as u64;
        result.major_faults = usage.ru_majflt as u64;
    } else {
        result.exit_code = -1;
        result.error = Some(format!("wait4 failed: {}", std::io::Error::last_os_error()));
    }
    let max_rss = usage.ru_maxrss.max(0) as u64 * 1024;
    let (served_by, library) = obs.mapped.proof(alloc.library.as_deref(), &alloc.name);
    result.served_by = served_by;
    result.served_by_library = library;
    let caught = !obs.rss.is_empty();
    (result.rss, result.peak_rss_bytes) = rss_timeline(obs.rss, result.wall_s, max_rss, own_peak);
    // The point at exit is one process's figure (ru_maxrss is the largest process's).
    result.max_processes = if caught || result.rss.is_empty() { obs.max_processes } else { 1 };
    // Ctrl-C (or `timeout -s INT`) reaches the program's whole process group: it may die of
    // the SIGINT before the sampler sees the flag. Either way the run was stopped, not finished.
    let died_of_sigint = waited && libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT;
    result.interrupted = obs.interrupted || crate::interrupt::interrupted() || died_of_sigint;
    if result.interrupted && result.error.is_none() {
        result.error = Some("stopped by Ctrl-C".into());
    }
    result
}

/// The run's RSS timeline and `peak_rss_bytes`, from the sampler's `samples` and `wait4`'s
/// `max_rss` (ru_maxrss in bytes: the largest process's peak). The peak is the sampled one, or
/// `max_rss` when higher and above `own_peak` (a child's ru_maxrss starts from this process's
/// high-water mark, so a figure at or below it may be ours), or when no sample caught the program.
///
/// A program that exits before the sampler reads its RSS once (within one interval, or before
/// the sampler's first look under load) still gets a timeline: one point at `exit_s` (when wait4
/// returned: the latest the program is known to have lived) of `max_rss`, the most it held by
/// then (a high-water mark, not its RSS at exit, and possibly this process's own figure: the only
/// one there is), so the timeline's maximum is `peak_rss_bytes`. Only a run with no figure at
/// all (wait4 failed) has none.
fn rss_timeline(mut samples: Vec<(f64, u64)>, exit_s: f64, max_rss: u64, own_peak: u64) -> (Vec<(f64, u64)>, u64) {
    let sampled_peak = samples.iter().map(|&(_, b)| b).max().unwrap_or(0);
    let peak = if max_rss > own_peak || sampled_peak == 0 { sampled_peak.max(max_rss) } else { sampled_peak };
    if samples.is_empty() && peak > 0 {
        samples.push((exit_s, peak));
    }
    (samples, peak)
}

/// The sampler: the tree's RSS every `interval`, the mappings until they prove the allocator
/// (every 1 ms until then, so a short program is still caught), and Ctrl-C: SIGTERM to the
/// program, SIGKILL 2 s later.
fn sample_tree(pid: i32, start: Instant, interval: Duration, preloaded: Option<&Path>, name: &str, done: &AtomicBool, observed: &Mutex<Observed>) {
    let mut next_sample = start;
    let mut stopped_at: Option<Instant> = None;
    let mut proven = false;
    while !done.load(Ordering::SeqCst) {
        let now = Instant::now();
        let tree = process_tree(pid);
        let mut obs = observed.lock().expect("sampler lock");
        if !proven || preloaded.is_none() {
            // Without a preload, every process is watched: one that maps another allocator
            // disproves glibc.
            for &p in &tree {
                obs.mapped.scan(p, preloaded);
            }
            proven = preloaded.is_some() && obs.mapped.proof(preloaded, name).0.is_some();
        }
        if now >= next_sample {
            let rss: u64 = tree.iter().map(|&p| process_rss(p)).sum();
            // A live program holds pages: 0 is a tree that has exited (a zombie's statm reads 0)
            // between wait4 and `done`, not a sample of it.
            if rss > 0 {
                obs.rss.push((now.duration_since(start).as_secs_f64(), rss));
                obs.max_processes = obs.max_processes.max(tree.len() as u32);
            }
            next_sample += interval;
            if next_sample < now {
                next_sample = now + interval;
            }
        }
        if crate::interrupt::interrupted() {
            obs.interrupted = true;
            match stopped_at {
                None => {
                    // SAFETY: kill(2) takes two integers and touches no memory of ours, so it is
                    // sound whatever `pid` names; it is the program, reaped only by `run_once`'s wait4,
                    // which sets `done` (ending this loop) right after.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    stopped_at = Some(now);
                }
                Some(t) if now.duration_since(t) > Duration::from_secs(2) => {
                    // SAFETY: as for the SIGTERM above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                _ => {}
            }
        }
        drop(obs);
        let nap = if proven && preloaded.is_some() { next_sample.saturating_duration_since(Instant::now()) } else { Duration::from_millis(1) };
        std::thread::sleep(nap.clamp(Duration::from_micros(200), Duration::from_millis(20)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(program_name(&v(&["python3", "workloads/python/churn.py", "--n", "3"])), "churn.py");
        assert_eq!(program_name(&v(&["/usr/bin/sort", "x"])), "sort");
    }

    #[test]
    fn the_tree_of_a_shell_holds_its_children() {
        let mut child = std::process::Command::new("sh").args(["-c", "sleep 5 & sleep 5 & wait"]).spawn().unwrap();
        let pid = child.id() as i32;
        let mut seen = 0;
        for _ in 0..200 {
            seen = process_tree(pid).len();
            if seen >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let tree = process_tree(pid);
        for p in &tree[..] {
            if *p != pid {
                // SAFETY: kill(2) takes two integers and touches no memory of ours; `p` is one of
                // the shell's sleeps, alive for 5 s yet.
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(seen >= 3, "the shell and its two sleeps: saw {seen}");
    }

    #[test]
    fn static_executables_are_found_through_paths_and_scripts() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(static_executable(&v(&["sh", "-c", "true"])), None, "Debian's sh is dynamic");
        assert_eq!(static_executable(&v(&["/no/such/program"])), None);
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, text: &str| {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p.display().to_string()
        };
        assert_eq!(static_executable(&v(&[&script("env.sh", "#!/usr/bin/env -S sh -e\necho\n")])), None);
        // A tiny static ELF: a header with one PT_LOAD and no PT_INTERP.
        let mut elf = vec![0u8; 64 + 56];
        elf[..4].copy_from_slice(b"\x7fELF");
        (elf[4], elf[5], elf[6]) = (2, 1, 1); // 64-bit, little-endian, version 1
        elf[16] = 2; // ET_EXEC
        elf[18] = 62; // EM_X86_64
        elf[20] = 1;
        elf[32] = 64; // e_phoff
        (elf[52], elf[54], elf[56]) = (64, 56, 1); // e_ehsize, e_phentsize, e_phnum
        elf[64] = 1; // PT_LOAD
        let stat = dir.path().join("static-prog");
        std::fs::write(&stat, &elf).unwrap();
        assert_eq!(elf_without_interpreter(&elf), Some(true));
        assert_eq!(static_executable(&v(&[stat.to_str().unwrap()])), Some(stat.clone()));
        let via_script = script("run.sh", &format!("#!{} --flag\n", stat.display()));
        assert_eq!(static_executable(&v(&[&via_script])), Some(stat.clone()), "a script's interpreter is what the loader starts");
        elf[64] = 3; // PT_INTERP
        assert_eq!(elf_without_interpreter(&elf), Some(false));
        assert_eq!(elf_without_interpreter(b"#!/bin/sh\n"), None);
    }

    /// The RSS timeline holds the program alone: no 0 sample of its exited tree (between its
    /// exit and the sampler's stop), which a chart drew as a drop to nothing, and nothing after
    /// its exit; and every run has one, whether or not the sampler caught the program (`true`
    /// exits before most first looks; a loaded machine once left a 10 ms `sleep` unsampled).
    #[test]
    fn the_rss_timeline_holds_no_sample_of_the_exited_program() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let glibc = ExecAllocator { name: "glibc".into(), library: None };
        for (command, interval_ms) in [(&["true"][..], 1), (&["true"][..], 10_000), (&["sh", "-c", "sleep 0.01"][..], 1)] {
            let opts = ExecOptions { sample_interval: Duration::from_millis(interval_ms), program_stdout_to_stderr: false, env: Vec::new() };
            for rep in 0..10 {
                let r = run_once(&v(command), &glibc, rep, &opts);
                let what = format!("{command:?} every {interval_ms} ms, run {rep}: {:?}", r.rss);
                assert_eq!(r.exit_code, 0, "{what}");
                assert!(!r.rss.is_empty() && r.rss.iter().all(|&(t, b)| b > 0 && (0.0..=r.wall_s).contains(&t)), "{what}");
                assert!(r.rss.windows(2).all(|w| w[0].0 <= w[1].0), "{what}");
                assert!(r.max_processes >= 1, "{what}");
                let timeline_peak = r.rss.iter().map(|&(_, b)| b).max().unwrap();
                assert!(timeline_peak <= r.peak_rss_bytes, "{what}: peak {}", r.peak_rss_bytes);
            }
        }
    }

    /// What the timeline of a run is when the sampler caught the program, and when it did not.
    #[test]
    fn a_program_no_sample_caught_gets_one_point_at_its_exit() {
        const MIB: u64 = 1 << 20;
        // Not caught: one point at the exit, of ru_maxrss, which is the peak (even at or below
        // this process's own peak: the only figure there is).
        assert_eq!(rss_timeline(vec![], 0.004, 3 * MIB, 100 * MIB), (vec![(0.004, 3 * MIB)], 3 * MIB));
        assert_eq!(rss_timeline(vec![], 0.004, 300 * MIB, 100 * MIB), (vec![(0.004, 300 * MIB)], 300 * MIB));
        // Caught: the samples as they are; ru_maxrss raises the peak only above our own.
        let samples = vec![(0.001, 5 * MIB), (0.002, 8 * MIB)];
        assert_eq!(rss_timeline(samples.clone(), 0.003, 9 * MIB, 100 * MIB), (samples.clone(), 8 * MIB));
        assert_eq!(rss_timeline(samples.clone(), 0.003, 200 * MIB, 100 * MIB), (samples, 200 * MIB));
        // No figure at all (wait4 failed): nothing to draw.
        assert_eq!(rss_timeline(vec![], 0.003, 0, 100 * MIB), (vec![], 0));
    }

    #[test]
    fn glibc_is_proven_only_without_another_allocator() {
        let mut m = MappedAllocators { libc: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()), ..Default::default() };
        assert_eq!(m.proof(None, "glibc").0.as_deref(), Some("glibc"));
        m.allocators.insert("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2".into());
        assert_eq!(m.proof(None, "glibc").0.as_deref(), Some("jemalloc"));
        let tc = Path::new("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10");
        assert_eq!(m.proof(Some(tc), "tcmalloc").0, None, "the preloaded library itself must be mapped");
    }
}
