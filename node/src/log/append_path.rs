//! Whether appends go past the page cache under `direct.writes=auto`: while they are large.
//! A log keeps one choice for its leader's own appends and one for the batches it copies as a
//! follower.
//!
//! Large appends are where the page cache's copy costs more than waiting for the disk, and
//! where a page cache that must reclaim to grow slows the whole shard (`docs/performance.md`:
//! 1 MB appends ran at 1.0–1.2 GB/s with p99 5–7 ms through a
//! full page cache, 1.3–1.7 GB/s with p99 2.1–3.0 ms direct). Small appends are where a direct
//! write's wait for the disk shows in every ack. An append-by-append choice at one size sends
//! a producer whose appends straddle it down both paths in turn, and each switch costs the
//! kernel a write-back and re-read of the shared block: at 150,000 records/s of 150–300 KB
//! appends, per-append choice at 256 KiB had p99 9.0–13.2 ms against 2.8–4.5 ms through the
//! page cache alone. So the choice follows a moving average of the
//! partition's append sizes, with a gap between going direct and going back. Followers'
//! copies straddle the same way (fetch answers of whatever arrived since the last): choosing
//! them per append put RF 3 acks=all at 150,000 records/s at p99 21–27 ms, by the average
//! 9.4–9.9 ms (`docs/performance.md`).

/// A partition's path for one kind of append (its leader's own, or a follower's copies).
#[derive(Debug, Clone, Copy, Default)]
pub struct LargeAppends {
    /// Moving average of append sizes, in bytes, a quarter of the weight on the newest.
    average_bytes: u64,
    direct: bool,
}

impl LargeAppends {
    /// Notes an append of `bytes` and says whether it goes direct. `min_bytes` is the direct
    /// write floor (`LogConfig::direct_write_min_bytes`): appends go direct once the average
    /// reaches one and a half times it, and through the page cache again once it falls below it.
    pub fn choose(&mut self, bytes: u64, min_bytes: u64) -> bool {
        self.average_bytes = if self.average_bytes == 0 {
            bytes
        } else {
            (3 * self.average_bytes + bytes) / 4
        };
        if self.direct {
            self.direct = self.average_bytes >= min_bytes;
        } else {
            self.direct = self.average_bytes >= min_bytes + min_bytes / 2;
        }
        self.direct
    }

    /// The path the last append took.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 256 << 10;

    fn run(sizes: impl IntoIterator<Item = u64>) -> Vec<bool> {
        let mut path = LargeAppends::default();
        sizes
            .into_iter()
            .map(|size| path.choose(size, MIN))
            .collect()
    }

    #[test]
    fn large_appends_go_direct_from_the_first() {
        assert!(run([1 << 20; 10]).iter().all(|&direct| direct));
    }

    #[test]
    fn small_and_middling_appends_stay_in_the_page_cache() {
        assert!(run([40 << 10; 100]).iter().all(|&direct| !direct));
        // Straddling the floor (150,000 records/s of 150 and 300 KB appends): one path throughout.
        let straddling = (0..200).map(|i| if i % 2 == 0 { 150_000 } else { 300_000 });
        assert!(run(straddling).iter().all(|&direct| !direct));
    }

    #[test]
    fn a_change_of_size_changes_the_path_once() {
        let sizes = [1 << 20; 20].into_iter().chain([30 << 10; 20]);
        let paths = run(sizes);
        assert!(paths[..20].iter().all(|&direct| direct));
        let back = paths[20..].iter().position(|&direct| !direct).unwrap();
        assert!(
            back <= 5,
            "back to the page cache after {back} small appends"
        );
        assert!(paths[20 + back..].iter().all(|&direct| !direct));
    }

    #[test]
    fn sizes_between_the_thresholds_keep_the_path_they_have() {
        // 320 KB: above the floor, below one and a half times it.
        let from_small = [30 << 10; 5].into_iter().chain([320 << 10; 30]);
        assert!(run(from_small).iter().all(|&direct| !direct));
        let from_large = [1 << 20; 5].into_iter().chain([320 << 10; 30]);
        assert!(run(from_large).iter().all(|&direct| direct));
    }
}
