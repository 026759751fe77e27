//! The process's memory allocator settings: the one place this crate uses `unsafe`.
//!
//! glibc's malloc serves an allocation with its own `mmap` (given back to the system when
//! freed) only from a threshold up, and it raises that threshold, up to 32 MiB, each time
//! such an allocation is freed. After the first key-table resizes and handoff batches, their
//! memory (a table part is hundreds of KiB, a handoff batch MiBs) then comes from the heap,
//! where a freed block between live ones stays in the process: RSS keeps the most that was
//! ever held at once (measured in the soak: a node that once took a peer's counters over
//! kept the memory for good). A fixed threshold keeps every large allocation on its own
//! mapping, so RSS follows what is live.

/// Allocations from this size up get their own mapping, unmapped when freed (glibc's
/// initial threshold, fixed).
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Applies the settings; call once, first thing in `main`. Does nothing where the
/// allocator is not glibc's.
pub fn configure() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `mallopt` only sets a malloc parameter (it returns 0 when it refuses one);
    // it takes no pointers, and this early in `main` no other thread is allocating.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
    }
}
