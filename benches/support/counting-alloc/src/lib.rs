//! A global allocator that forwards to [`System`] and counts live heap bytes.
//!
//! Used by ratekeeper's memory benchmark: install it with
//! `#[global_allocator] static ALLOC: Counting = Counting::new();`, then read
//! [`Counting::live`] before and after building a structure. [`Counting::peak`] is the
//! high-water mark since the last [`Counting::reset_peak`] (hash tables briefly hold both
//! the old and the new table while they grow).
//!
//! [`Counting::allocations`] counts calls that obtained memory (alloc, alloc_zeroed, and
//! reallocs that grow), for allocations-per-request figures.
//!
//! Counting uses relaxed atomics: exact once the threads that allocate have quiesced,
//! which is when the benchmark reads it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Counting {
    live: AtomicUsize,
    peak: AtomicUsize,
    allocations: AtomicUsize,
}

impl Counting {
    pub const fn new() -> Counting {
        Counting {
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            allocations: AtomicUsize::new(0),
        }
    }

    /// Bytes currently allocated and not yet freed (as requested, not as rounded up by
    /// the system allocator).
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The most bytes live at once since the last reset.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Restarts the high-water mark from the current live bytes.
    pub fn reset_peak(&self) {
        self.peak.store(self.live(), Ordering::Relaxed);
    }

    /// Calls that obtained memory so far (alloc, alloc_zeroed, and reallocs that grow).
    pub fn allocations(&self) -> usize {
        self.allocations.load(Ordering::Relaxed)
    }

    fn grew(&self, bytes: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        let now = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrank(&self, bytes: usize) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
}

impl Default for Counting {
    fn default() -> Counting {
        Counting::new()
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`; the counting around it
// touches only atomics and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) };
        self.shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; `ptr` came from this allocator, i.e. from `System`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            let old_size = layout.size();
            if new_size >= old_size {
                self.grew(new_size - old_size);
            } else {
                self.shrank(old_size - new_size);
            }
        }
        new
    }
}
