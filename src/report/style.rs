//! Colours (one per allocator, the same in every chart), units and labels.

use plotters::style::RGBColor;

/// A fixed colour per known allocator/config name; others get a stable colour from a palette.
pub fn color_for(label: &str) -> RGBColor {
    const KNOWN: &[(&str, RGBColor)] = &[
        ("glibc", RGBColor(214, 39, 40)),
        ("system", RGBColor(214, 39, 40)),
        ("jemalloc", RGBColor(31, 119, 180)),
        ("tcmalloc", RGBColor(255, 127, 14)),
        ("mimalloc", RGBColor(44, 160, 44)),
        ("pytorch", RGBColor(31, 119, 180)),
        ("pytorch expandable_segments:True", RGBColor(44, 160, 44)),
        ("nocache", RGBColor(127, 127, 127)),
        ("ideal", RGBColor(23, 23, 23)),
        ("allocated", RGBColor(110, 110, 110)),
    ];
    const PALETTE: [RGBColor; 8] = [
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
        RGBColor(255, 127, 14),
        RGBColor(214, 39, 40),
        RGBColor(174, 199, 232),
    ];
    if let Some((_, c)) = KNOWN.iter().find(|(n, _)| *n == label) {
        return *c;
    }
    // FNV-1a: stable across runs and Rust versions.
    let h = label.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    PALETTE[(h % PALETTE.len() as u64) as usize]
}

/// A byte unit that fits `max`: (divisor, name).
pub fn byte_unit(max: f64) -> (f64, &'static str) {
    const G: f64 = 1073741824.0;
    const M: f64 = 1048576.0;
    const K: f64 = 1024.0;
    if max >= 4.0 * G {
        (G, "GiB")
    } else if max >= 4.0 * M {
        (M, "MiB")
    } else if max >= 4.0 * K {
        (K, "KiB")
    } else {
        (1.0, "B")
    }
}

/// Shortens a label for a legend.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() > n {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    } else {
        s.to_string()
    }
}

/// `s` on at most `max_lines` lines of at most `width` characters, broken after a separator
/// (`-`, `_`, `/`, `,`, space) where one falls in the line, else mid-word; what does not fit ends
/// in "…".
pub fn wrap(s: &str, width: usize, max_lines: usize) -> Vec<String> {
    let width = width.max(2);
    let mut lines = Vec::new();
    let mut rest: Vec<char> = s.trim().chars().collect();
    while !rest.is_empty() && lines.len() < max_lines {
        if lines.len() + 1 == max_lines || rest.len() <= width {
            lines.push(clip(&rest.iter().collect::<String>(), width));
            break;
        }
        // After the last separator that fits, unless the rest would then be cut where a break
        // mid-word lets it fit.
        let lines_left = max_lines - lines.len() - 1;
        let fits = |cut: usize| rest.len() - cut <= width * lines_left;
        let cut = match (1..=width).rev().find(|&i| matches!(rest[i - 1], '-' | '_' | '/' | ',' | ' ')) {
            Some(at) if fits(at) || !fits(width) => at,
            _ => width,
        };
        lines.push(rest[..cut].iter().collect::<String>().trim_end().to_string());
        rest.drain(..cut);
        while rest.first() == Some(&' ') {
            rest.remove(0);
        }
    }
    lines
}

/// A file-name-safe slug.
pub fn slug(s: &str) -> String {
    let mut out: String = s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    let t = out.trim_matches('-');
    if t.is_empty() {
        "default".into()
    } else {
        clip(t, 60).trim_end_matches('…').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn labels_wrap_at_separators_and_are_cut_last() {
        assert_eq!(wrap("gpt3-xl-1.3b-captured", 13, 2), ["gpt3-xl-1.3b-", "captured"]);
        assert_eq!(wrap("glibc", 13, 2), ["glibc"]);
        // No separator-made split fits: a break mid-word keeps the whole name.
        assert_eq!(wrap("serving-llama7b-captured", 13, 2), ["serving-llama", "7b-captured"]);
        // Too long for the lines there are: the last line ends in an ellipsis.
        assert_eq!(wrap("serving-llama7b-70b-instruct-captured", 13, 2), ["serving-", "llama7b-70b-…"]);
        assert_eq!(wrap("a b", 13, 1), ["a b"]);
        assert!(wrap("", 13, 2).is_empty());
        let unbroken = "x".repeat(40);
        for (s, w, n) in [("max_split_size_mb:512,roundup_power2_divisions:4", 9, 3), (unbroken.as_str(), 6, 2)] {
            let lines = wrap(s, w, n);
            assert!(lines.len() <= n && lines.iter().all(|l| l.chars().count() <= w), "{lines:?}");
        }
    }
}
