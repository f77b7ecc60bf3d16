//! Spread over repetitions: the mean and its 95 % confidence interval (Student's t), and the
//! folding of repeated runs into one row each.

pub use crate::confidence::t_975;

/// The mean of repeated measurements, the half-width of its 95 % confidence interval (`None`
/// with a single run: no spread is known) and their range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub ci95: Option<f64>,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// The spread of `values` (all zero for none).
    pub fn of(values: &[f64]) -> Spread {
        let Some((mean, ci95)) = crate::confidence::mean_ci95(values) else {
            return Spread { mean: 0.0, ci95: None, min: 0.0, max: 0.0, n: 0 };
        };
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Spread { mean, ci95, min, max, n: values.len() }
    }

    /// The spread of `values`, `None` when there are none.
    pub fn of_some(values: &[f64]) -> Option<Spread> {
        (!values.is_empty()).then(|| Spread::of(values))
    }

    /// The whisker a bar chart draws for the range: min to max, when there is more than one run.
    pub fn whisker(&self) -> Option<(f64, f64)> {
        (self.n > 1).then_some((self.min, self.max))
    }

    /// Whether this mean is below the other's by more than both CIs allow (no CI: never).
    pub fn clearly_below(&self, other: &Spread) -> bool {
        match (self.ci95, other.ci95) {
            (Some(a), Some(b)) => self.mean + a < other.mean - b,
            _ => false,
        }
    }

    /// `mean ± ci (min–max)` with `f` formatting each number (the mean alone for one run).
    pub fn show_range(&self, f: &dyn Fn(f64) -> String) -> String {
        match self.ci95 {
            Some(h) => format!("{} ± {} ({}–{})", f(self.mean), f(h).trim_start_matches('+'), f(self.min), f(self.max)),
            None => f(self.mean),
        }
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
