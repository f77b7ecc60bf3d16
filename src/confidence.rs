//! Confidence intervals over repetitions: the mean of repeated measurements and the half-width
//! of its 95 % interval (Student's t). Used by the CPU driver's summary and by the reports.

/// Two-sided 97.5 % quantiles of Student's t for 1..=30 degrees of freedom (any statistics
/// table; e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2). A table of 30 numbers, not a dependency:
/// the statistics crates that compute it pull in a linear-algebra stack.
const T_975: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074,
    2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/// t(0.975, df): the table up to 30, then the coarser rows of the same table, then the normal.
pub fn t_975(df: usize) -> f64 {
    match df {
        0 => f64::NAN,
        1..=30 => T_975[df - 1],
        31..=40 => 2.021,
        41..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

/// The mean and the 95 % CI half-width (`None` for a single value; `None` overall when empty).
pub fn mean_ci95(values: &[f64]) -> Option<(f64, Option<f64>)> {
    if values.is_empty() {
        return None;
    }
    let n = values.len();
    let mean = values.iter().sum::<f64>() / n as f64;
    let ci95 = (n > 1).then(|| {
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        t_975(n - 1) * (var / n as f64).sqrt()
    });
    Some((mean, ci95))
}
