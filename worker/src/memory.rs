//! The worker's heap handed back to the system when it falls idle: glibc's allocator otherwise
//! keeps what a burst freed in its arenas, and the worker's RSS would stay at its peak.

use std::sync::atomic::{AtomicI64, Ordering};

/// Trims the heap, at most once a second: a trim walks the heap, and at low load the worker
/// idles between every two jobs.
pub(crate) fn release_freed_memory() {
    static LAST_TRIM_MS: AtomicI64 = AtomicI64::new(0);
    let now = fleet_platform::now_ms();
    if now - LAST_TRIM_MS.load(Ordering::Relaxed) < 1000 {
        return;
    }
    LAST_TRIM_MS.store(now, Ordering::Relaxed);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns unused heap pages to the kernel; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}
