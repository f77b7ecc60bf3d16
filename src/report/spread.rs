//! Spread over repetitions: the mean and its 95 % confidence interval (Student's t), and the
//! folding of repeated runs into one row each.

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

/// The mean of repeated measurements and the half-width of its 95 % confidence interval
/// (`None` with a single run: no spread is known).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub ci95: Option<f64>,
    pub n: usize,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n.max(1) as f64;
        let ci95 = (n > 1).then(|| {
            let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t_975(n - 1) * (var / n as f64).sqrt()
        });
        Spread { mean, ci95, n }
    }

    /// The interval's ends (the mean twice without spread).
    pub fn bounds(&self) -> (f64, f64) {
        let h = self.ci95.unwrap_or(0.0);
        (self.mean - h, self.mean + h)
    }

    /// Whether the two 95 % intervals overlap (then the difference is not shown by this many
    /// runs).
    pub fn overlaps(&self, other: &Spread) -> bool {
        let (a, b) = (self.bounds(), other.bounds());
        a.0 <= b.1 && b.0 <= a.1
    }

    /// `mean ± half` in the units `fmt` writes (the mean alone for one run).
    pub fn show(&self, fmt: impl Fn(f64) -> String) -> String {
        match self.ci95 {
            Some(h) => format!("{} ± {}", fmt(self.mean), fmt(h)),
            None => fmt(self.mean),
        }
    }
}

/// Groups `items` by `key`, keeping the first-seen order of keys and of items inside a group:
/// repetitions of one configuration fold into one group.
pub fn fold<'a, T, K: PartialEq>(items: impl IntoIterator<Item = &'a T>, key: impl Fn(&T) -> K) -> Vec<(K, Vec<&'a T>)>
where
    T: 'a,
{
    let mut out: Vec<(K, Vec<&T>)> = Vec::new();
    for it in items {
        let k = key(it);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(it),
            None => out.push((k, vec![it])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_uses_students_t() {
        // mean 2, sample sd 1, n 3: half-width = t(0.975, 2) · 1/√3 = 4.303/1.732.
        let s = Spread::of(&[1.0, 2.0, 3.0]);
        assert_eq!(s.mean, 2.0);
        assert!((s.ci95.unwrap() - 4.303 / 3f64.sqrt()).abs() < 1e-9, "{s:?}");
        assert_eq!(Spread::of(&[5.0]).ci95, None);
        assert_eq!(Spread::of(&[4.0, 4.0]).ci95, Some(0.0));
        assert_eq!(t_975(1000), 1.960);
    }

    #[test]
    fn overlap_and_display() {
        let a = Spread::of(&[10.0, 11.0, 12.0]);
        let b = Spread::of(&[20.0, 21.0, 22.0]);
        assert!(!a.overlaps(&b) && a.overlaps(&a));
        assert_eq!(a.show(|v| format!("{v:.1}")), "11.0 ± 2.5");
        assert_eq!(Spread::of(&[3.0]).show(|v| format!("{v:.1}")), "3.0");
    }

    #[test]
    fn fold_keeps_first_seen_order() {
        let v = [("b", 1), ("a", 2), ("b", 3)];
        let f = fold(&v, |x| x.0);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].0, "b");
        assert_eq!(f[0].1.iter().map(|x| x.1).collect::<Vec<_>>(), vec![1, 3]);
    }
}
