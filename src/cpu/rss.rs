//! Process RSS from /proc (the `psutil` crate cannot be used: see docs/cpu.md), sampled on a
//! background thread into a timeline.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::results::RssSample;

/// What a run publishes while it goes, for the RSS sampler: worker 0's iteration and the live
/// bytes of all workers (updated at every step and after every chunk of ops).
#[derive(Debug, Default)]
pub struct RunProgress {
    pub iteration: AtomicU64,
    pub live_bytes: AtomicI64,
}

impl RunProgress {
    /// Adds to the shared live bytes what one worker's (`allocated − freed`) changed by since
    /// it last published (`published`, updated).
    pub fn publish_live(&self, allocated: u64, freed: u64, published: &mut i64) {
        let live = allocated as i64 - freed as i64;
        self.live_bytes.fetch_add(live - *published, Ordering::Relaxed);
        *published = live;
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf takes an integer, touches no memory of ours and is thread-safe.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// CPU seconds (user + system) this process has used, all threads.
pub fn process_cpu_s() -> f64 {
    // SAFETY: rusage is a plain C struct of integers and timevals (all zeros is valid), a live
    // local that getrusage(2) fills.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF asks for this process.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Resident set size now: `/proc/self/statm` field 2 × page size (exact, ~8 µs).
pub fn rss_bytes() -> u64 {
    statm_rss("/proc/self/statm")
}

/// RSS of another process (`/proc/PID/statm`); 0 once it is gone.
pub fn process_rss(pid: i32) -> u64 {
    statm_rss(&format!("/proc/{pid}/statm"))
}

/// Resident pages (field 2 of a statm file) × page size; 0 when unreadable.
fn statm_rss(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map(|pages| pages * page_size())
        .unwrap_or(0)
}

/// Peak RSS since start or the last [`reset_peak_rss`]: `VmHWM` in `/proc/self/status`.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// Resets VmHWM to the current RSS (writing 5 to /proc/self/clear_refs, Linux ≥ 4.0).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes the kernel says can be allocated without swapping (`MemAvailable`).
pub fn mem_available_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("MemAvailable:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .map(|kib| kib * 1024)
        .unwrap_or(u64::MAX)
}

/// Samples RSS every `interval` until stopped; the driver publishes its iteration count and live
/// bytes in `progress`.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<RssSample>>>,
    handle: Option<std::thread::JoinHandle<()>>,
    pub progress: Arc<RunProgress>,
    /// When sampling started: sample times count from here.
    pub start: Instant,
}

impl RssSampler {
    pub fn start(interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let progress = Arc::new(RunProgress::default());
        let (s2, st2, p2) = (samples.clone(), stop.clone(), progress.clone());
        let start = Instant::now();
        let handle = std::thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || loop {
                let live_bytes = p2.live_bytes.load(Ordering::Relaxed);
                let sample = RssSample { t_s: start.elapsed().as_secs_f64(), iteration: p2.iteration.load(Ordering::Relaxed), rss: rss_bytes(), live_bytes };
                s2.lock().expect("sampler lock").push(sample);
                if st2.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(interval);
            })
            .expect("spawn the RSS sampler");
        RssSampler { stop, samples, handle: Some(handle), progress, start }
    }

    pub fn finish(mut self) -> Vec<RssSample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        std::mem::take(&mut *self.samples.lock().expect("sampler lock"))
    }
}

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

/// The slopes of a run's steady state, in MiB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    /// Raw RSS per 1,000 iterations: includes the workload's own growth of live data.
    pub rss_per_1k: Option<f64>,
    /// RSS per minute.
    pub rss_per_minute: Option<f64>,
    /// RSS minus live bytes per 1,000 iterations: what the allocator adds on top of the
    /// workload (0 for a growth-only workload an allocator serves without waste).
    pub overhead_per_1k: Option<f64>,
}

/// The fewest iterations the steady-state window must span for a drift: over fewer, a slope
/// "per 1,000 iterations" extrapolates what one iteration allocates (a 2-iteration run gave
/// millions of MiB), not a drift.
pub const MIN_DRIFT_ITERATIONS: u64 = 10;

/// The fewest RSS samples the steady-state window must hold for a drift: a slope through three
/// or four samples of a run shorter than a tenth of a second is its warm-up's noise, and "per
/// minute" multiplied it into tens of GiB (a 0.03 s run gave +78,777 MiB per minute).
pub const MIN_DRIFT_SAMPLES: usize = 10;

/// Drift: least-squares slopes over the steady-state part of the run, from a quarter of the way
/// to the last iteration until the last sample before it (the warm-up, the final teardown and
/// the drain are excluded: a sample that already counts the last iteration may have been taken
/// after every block was freed); none when that part spans fewer than [`MIN_DRIFT_ITERATIONS`]
/// or holds fewer than [`MIN_DRIFT_SAMPLES`].
pub fn drift(samples: &[RssSample]) -> Drift {
    const MIB: f64 = 1048576.0;
    let Some(last_iter) = samples.iter().map(|s| s.iteration).max() else {
        return Drift { rss_per_1k: None, rss_per_minute: None, overhead_per_1k: None };
    };
    let t_end = samples.iter().filter(|s| s.iteration < last_iter).map(|s| s.t_s).fold(0.0, f64::max);
    let steady: Vec<&RssSample> = samples.iter().filter(|s| s.t_s >= t_end * 0.25 && s.t_s <= t_end).collect();
    let first_iter = steady.iter().map(|s| s.iteration).min().unwrap_or(last_iter);
    let end_iter = steady.iter().map(|s| s.iteration).max().unwrap_or(first_iter);
    if end_iter - first_iter < MIN_DRIFT_ITERATIONS || steady.len() < MIN_DRIFT_SAMPLES {
        return Drift { rss_per_1k: None, rss_per_minute: None, overhead_per_1k: None };
    }
    let fit = |f: &dyn Fn(&RssSample) -> (f64, f64)| slope(&steady.iter().map(|s| f(s)).collect::<Vec<_>>());
    Drift {
        rss_per_1k: fit(&|s| (s.iteration as f64, s.rss as f64)).map(|b| b * 1000.0 / MIB),
        rss_per_minute: fit(&|s| (s.t_s, s.rss as f64)).map(|b| b * 60.0 / MIB),
        overhead_per_1k: fit(&|s| (s.iteration as f64, s.rss as f64 - s.live_bytes as f64)).map(|b| b * 1000.0 / MIB),
    }
}

pub use crate::confidence::mean_ci95;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_and_grows_when_pages_are_touched() {
        let before = rss_bytes();
        assert!(before > 0);
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        std::hint::black_box(&v);
        assert!(rss_bytes() >= before + (48 << 20), "RSS did not grow by the touched 64 MiB");
        assert!(peak_rss_bytes() >= rss_bytes() - (1 << 20));
    }

    #[test]
    fn ci95_of_known_values() {
        // mean 2, sample sd 1, n 3: half-width t(2) * 1/sqrt(3) = 4.303 / 1.732.
        let (m, h) = mean_ci95(&[1.0, 2.0, 3.0]).unwrap();
        assert!((m - 2.0).abs() < 1e-12);
        assert!((h.unwrap() - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert_eq!(mean_ci95(&[5.0]), Some((5.0, None)));
        assert_eq!(mean_ci95(&[]), None);
    }

    #[test]
    fn overhead_drift_is_net_of_live_bytes() {
        // RSS grows 1 MiB per iteration, all of it live data, over a constant 8 MiB overhead.
        let samples: Vec<RssSample> =
            (0..100).map(|i| RssSample { t_s: i as f64 * 0.01, iteration: i, rss: (8 << 20) + (i << 20), live_bytes: (i << 20) as i64 }).collect();
        let d = drift(&samples);
        assert!((d.rss_per_1k.unwrap() - 1000.0).abs() < 1e-6, "{d:?}");
        assert!(d.overhead_per_1k.unwrap().abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn no_drift_from_a_few_iterations() {
        // Two iterations, the second allocating 4 GiB: a slope "per 1,000 iterations" of that is
        // no drift.
        let samples: Vec<RssSample> =
            (0..100).map(|i| RssSample { t_s: i as f64 * 0.01, iteration: 1 + i / 50, rss: (8 << 20) + ((i / 50) << 32), live_bytes: 0 }).collect();
        assert_eq!(drift(&samples), Drift { rss_per_1k: None, rss_per_minute: None, overhead_per_1k: None });
        let long: Vec<RssSample> = (0..100).map(|i| RssSample { t_s: i as f64 * 0.01, iteration: i, rss: 8 << 20, live_bytes: 0 }).collect();
        assert_eq!(drift(&long).rss_per_1k, Some(0.0));
        // Many iterations, but a run so short that the steady state holds a handful of samples.
        let short: Vec<RssSample> = (0..6).map(|i| RssSample { t_s: i as f64 * 0.01, iteration: i * 4, rss: (8 << 20) + (i << 20), live_bytes: 0 }).collect();
        assert_eq!(drift(&short), Drift { rss_per_1k: None, rss_per_minute: None, overhead_per_1k: None });
    }

    #[test]
    fn the_sample_after_the_teardown_is_not_drift() {
        // Steady 40 MiB over 200 iterations; the last sample counts the last iteration but was
        // taken after everything was freed (RSS 11 MiB, nothing live): no drift either way.
        let mut samples: Vec<RssSample> = (0..200).map(|i| RssSample { t_s: i as f64 * 0.01, iteration: i, rss: 40 << 20, live_bytes: 30 << 20 }).collect();
        samples.push(RssSample { t_s: 2.0, iteration: 200, rss: 11 << 20, live_bytes: 0 });
        let d = drift(&samples);
        assert_eq!((d.rss_per_1k, d.overhead_per_1k), (Some(0.0), Some(0.0)), "{d:?}");
        assert_eq!(d.rss_per_minute, Some(0.0));
    }

    #[test]
    fn slope_of_a_line() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 1.0)).collect();
        assert!((slope(&pts).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&pts[..2]), None);
    }
}
