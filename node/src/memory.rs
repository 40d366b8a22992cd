//! Process-wide allocator settings for the `strata` binary (broker and bench alike).
//!
//! Batches are buffers of up to a few MiB, allocated per request and freed when written or
//! answered, often on another thread. With glibc's defaults such a buffer is sometimes
//! `mmap`ed, and freed memory at the top of a heap is handed back to the kernel, so the next
//! buffer faults its pages in again: ~20,000 page faults a second in the broker and up to
//! 40,000 in the bench at ~550 MB/s of 1 KiB records (`perf stat`, 2026-11-29). On a VM whose
//! host backs memory on demand a fault can be a first touch. Keeping freed memory for reuse
//! removed nearly all of them: paired max-rate runs gave 598 / 575 / 667 MB/s against
//! 524 / 567 / 541 MB/s, and the broker used 1–14% less CPU per record.

/// Allocations below this come from the heap, never from their own `mmap`.
const MMAP_THRESHOLD_BYTES: i32 = 32 << 20;
/// Free memory at the top of a heap is handed back to the kernel only past this.
const TRIM_THRESHOLD_BYTES: i32 = 512 << 20;

/// Tells glibc's allocator to keep freed batch-sized buffers for reuse (see the module docs).
/// Returns whether the allocator took the settings (false on other C libraries). Call it
/// first thing in `main`, before threads start allocating.
pub fn keep_freed_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes allocator parameters; both are in their valid ranges
        // (the mmap threshold's maximum is 32 MiB on 64-bit glibc).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the struct it is given.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
            usage.ru_minflt
        }
    }

    /// 200 buffers of 1 MiB, filled on one thread and freed on another, as a connection reads
    /// a request and a log writes and drops it.
    fn churn() {
        let (filled, received) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        let freer = std::thread::spawn(move || {
            for buffer in received {
                std::hint::black_box(&buffer);
            }
        });
        std::thread::spawn(move || {
            for _ in 0..200 {
                filled.send(vec![1u8; (1 << 20) + 4096]).unwrap();
            }
        })
        .join()
        .unwrap();
        freer.join().unwrap();
    }

    // nextest runs each test in its own process, so the settings stay inside this one.
    #[test]
    fn freed_buffers_are_reused_without_faulting_their_pages_in_again() {
        assert!(keep_freed_buffers());
        churn();
        let before = minor_faults();
        churn();
        let faults = minor_faults() - before;
        // 200 buffers touch 51,400 pages; glibc's defaults fault ~1,250 of them back in here.
        assert!(faults < 200, "{faults} page faults reusing freed buffers");
    }
}
