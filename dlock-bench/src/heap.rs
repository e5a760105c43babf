//! Counts the client's heap bytes, for the memory per held lease, and only
//! while a count is open: an allocator that counted always would tax every
//! allocation of every other scenario (a shared atomic, bounced between
//! cores), and the library that allocates more would pay more of that tax
//! than the bare client it is compared with.

// A global allocator is an unsafe trait: there is no other way to count.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

/// The system allocator, counting net bytes while a [`Count`] is open.
pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static NET: AtomicI64 = AtomicI64::new(0);

fn add(bytes: usize, sign: i64) {
    if ON.load(Relaxed) {
        NET.fetch_add(sign * i64::try_from(bytes).unwrap_or(i64::MAX), Relaxed);
    }
}

// SAFETY: every call is passed to `System` unchanged; only counters move.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size(), 1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size(), 1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        add(layout.size(), -1);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(layout.size(), -1);
            add(new_size, 1);
        }
        p
    }
}

/// An open count: the net heap bytes allocated since it opened. One at a
/// time.
pub struct Count(i64);

impl Count {
    /// Starts counting.
    pub fn open() -> Self {
        let start = NET.load(Relaxed);
        ON.store(true, Relaxed);
        Count(start)
    }

    /// The net bytes allocated since the count opened.
    pub fn net(&self) -> i64 {
        NET.load(Relaxed) - self.0
    }
}

impl Drop for Count {
    fn drop(&mut self) {
        ON.store(false, Relaxed);
    }
}
