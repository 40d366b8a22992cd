//! Process-wide allocator settings for the `strata` binary (broker and bench alike).
//!
//! Batches are buffers of up to a few MiB, allocated per request and freed when written or
//! answered, often on another thread. With glibc's defaults such a buffer is sometimes
//! `mmap`ed, and freed memory at the top of a heap is handed back to the kernel, so the next
//! buffer faults its pages in again: ~20,000 page faults a second in the broker and up to
//! 40,000 in the bench at ~550 MB/s of 1 KiB records (`perf stat` on the bench machine of
//! docs/performance.md). On a VM whose host backs memory on demand a fault can be a first
//! touch. Keeping freed memory for reuse removed nearly all of them: paired max-rate runs gave
//! 598 / 575 / 667 MB/s against 524 / 567 / 541 MB/s, and the broker used 1–14% less CPU per
//! record. (Page-fault counts
//! depend on thread and arena timing; the test checks the two settings' effects instead.)

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

    // nextest runs every test in a process of its own, so no other test allocates meanwhile.
    #[test]
    fn batch_sized_buffers_come_from_the_heap_and_stay_there_when_freed() {
        assert!(keep_freed_buffers());
        // SAFETY: mallinfo2 only reads allocator statistics.
        let stats = || unsafe { libc::mallinfo2() };
        let mapped_before = stats().hblks;
        let buffer = std::hint::black_box(vec![1u8; 8 << 20]);
        assert_eq!(
            stats().hblks,
            mapped_before,
            "an 8 MiB buffer got an mmap of its own (glibc's default past 128 KiB)"
        );
        drop(buffer);
        assert!(
            stats().fordblks >= 8 << 20,
            "the freed buffer went back to the kernel ({} bytes free in the heaps)",
            stats().fordblks
        );
    }
}
