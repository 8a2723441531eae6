//! A set of byte ranges: which bytes of a file a writer has written (and not truncated away).

/// Disjoint, sorted, non-adjacent half-open ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extents {
    ranges: Vec<(u64, u64)>,
}

impl Extents {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Adds `[start, end)`.
    pub fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.ranges {
            if b < s {
                out.push((a, b));
            } else if a > e {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !placed {
            out.push((s, e));
        }
        self.ranges = out;
    }

    /// Forgets everything at or past `len`.
    pub fn truncate(&mut self, len: u64) {
        self.ranges.retain(|&(a, _)| a < len);
        if let Some(last) = self.ranges.last_mut() {
            last.1 = last.1.min(len);
        }
    }

    /// Whether `offset` is inside a range.
    pub fn contains(&self, offset: u64) -> bool {
        let i = self.ranges.partition_point(|&(_, b)| b <= offset);
        self.ranges.get(i).is_some_and(|&(a, _)| a <= offset)
    }

    /// The expected content of `[offset, offset + len)` for a file with pattern `seed`:
    /// the pattern inside ranges, zero elsewhere.
    pub fn expected(&self, seed: u64, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let end = offset + len as u64;
        for &(a, b) in &self.ranges {
            let (s, e) = (a.max(offset), b.min(end));
            if s < e {
                crate::pattern::fill(
                    seed,
                    s,
                    &mut out[(s - offset) as usize..(e - offset) as usize],
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_merges_overlapping_and_adjacent_ranges() {
        let mut x = Extents::new();
        x.add(10, 20);
        x.add(30, 40);
        x.add(0, 5);
        assert_eq!(x.ranges(), &[(0, 5), (10, 20), (30, 40)]);
        x.add(20, 30);
        assert_eq!(x.ranges(), &[(0, 5), (10, 40)]);
        x.add(3, 12);
        assert_eq!(x.ranges(), &[(0, 40)]);
        x.add(50, 50);
        assert_eq!(x.ranges(), &[(0, 40)]);
    }

    #[test]
    fn truncate_and_contains() {
        let mut x = Extents::new();
        x.add(0, 10);
        x.add(20, 30);
        assert!(x.contains(0) && x.contains(9) && !x.contains(10) && x.contains(25));
        x.truncate(25);
        assert_eq!(x.ranges(), &[(0, 10), (20, 25)]);
        x.truncate(20);
        assert_eq!(x.ranges(), &[(0, 10)]);
        x.truncate(0);
        assert!(x.ranges().is_empty());
    }

    #[test]
    fn expected_has_pattern_inside_and_zero_outside() {
        let mut x = Extents::new();
        x.add(4, 8);
        let e = x.expected(9, 2, 8);
        assert_eq!(&e[0..2], &[0, 0]);
        assert_eq!(&e[2..6], &crate::pattern::pattern(9, 4, 4)[..]);
        assert_eq!(&e[6..8], &[0, 0]);
    }
}
