//! The Wasm filter's allocator: a free list per size class in front of
//! the C library's `malloc` (wasi-libc's dlmalloc).
//!
//! Why: every request allocates the same few blocks and frees them all by
//! its end: its stream context, and the buffers Envoy fills through
//! `proxy_on_memory_allocate` (the request and response header maps, the
//! response body). dlmalloc spends 100 to 200 Wasm instructions on each
//! of those calls, searching its bins and splitting or coalescing
//! neighbours, and how many depends on the heap's layout, which every
//! other allocation moves: across the crate split the same four blocks a
//! request (one of them 16 bytes larger, both sizes in the same bins) went
//! from 1,014 to 1,297 instructions in `malloc` and `free`. A free list per
//! class answers each call in a handful of instructions, the same handful
//! every time (`BENCHMARKS.md`, the per-request cost across the crate
//! split).
//!
//! The rule: a block of at most [`MAX_CLASS`] bytes and alignment at most
//! [`ALIGN`] is rounded up to a power of two (at least 16 bytes); when
//! freed it goes onto its class's list, up to [`KEEP`] blocks a class,
//! and past that back to the system allocator. So what the lists hold
//! back is bounded (`KEEP` times the sum of the class sizes, 256 KiB);
//! a larger or more aligned block goes straight to the system allocator.
//!
//! Only sound single-threaded: the filter's module runs in one Envoy
//! worker's VM, one thread (`wasm32-wasip1` has no threads). It is the
//! global allocator only there; natively it is a plain type, tested over
//! the system allocator in one thread.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::fmt;
use std::ptr;

/// The smallest class: 16 bytes (`1 << MIN_SHIFT`).
const MIN_SHIFT: u32 = 4;
/// Classes 16, 32, ... 4096 bytes.
const CLASSES: usize = 9;
/// The largest block kept on a list.
pub const MAX_CLASS: usize = 1 << (MIN_SHIFT as usize + CLASSES - 1);
/// The alignment every class block has (and the most a kept block may ask).
pub const ALIGN: usize = 16;
/// The most blocks a class's list holds.
pub const KEEP: u16 = 32;

/// One class's free blocks: an intrusive list through their first word.
#[derive(Clone, Copy)]
struct List {
    head: *mut u8,
    len: u16,
}

/// The size-class allocator over `inner` (see the module doc).
pub struct Classes<A> {
    inner: A,
    lists: UnsafeCell<[List; CLASSES]>,
}

// SAFETY: used only where there is one thread (see the module doc): the
// Wasm filter's module; natively, tests use an instance from one thread.
unsafe impl<A: Sync> Sync for Classes<A> {}

impl<A> Classes<A> {
    /// No block kept yet.
    pub const fn new(inner: A) -> Classes<A> {
        Classes {
            inner,
            lists: UnsafeCell::new(
                [List {
                    head: ptr::null_mut(),
                    len: 0,
                }; CLASSES],
            ),
        }
    }

    /// How many blocks class `c` holds (tests).
    pub fn kept(&self, c: usize) -> usize {
        // SAFETY: one thread (see the module doc); no list is borrowed now.
        let lists = unsafe { &*self.lists.get() };
        lists.get(c).map_or(0, |l| usize::from(l.len))
    }
}

impl<A> fmt::Debug for Classes<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept: Vec<usize> = (0..CLASSES).map(|c| self.kept(c)).collect();
        f.debug_struct("Classes").field("kept", &kept).finish()
    }
}

/// The class of `layout`, if a list keeps such blocks.
#[inline]
pub fn class(layout: Layout) -> Option<usize> {
    if layout.size() > MAX_CLASS || layout.align() > ALIGN {
        return None;
    }
    let size = layout.size().max(1 << MIN_SHIFT);
    let bits = usize::BITS - (size - 1).leading_zeros();
    Some((bits - MIN_SHIFT) as usize)
}

/// The layout of class `c`'s blocks.
#[inline]
fn class_layout(c: usize) -> Layout {
    // SAFETY: `16 << c` for c < CLASSES is a non-zero size far below
    // isize::MAX, and ALIGN a power of two.
    unsafe { Layout::from_size_align_unchecked((1 << MIN_SHIFT) << c, ALIGN) }
}

impl<A: GlobalAlloc> Classes<A> {
    /// Class `c`'s list.
    ///
    /// # Safety
    /// One thread, and no other borrow of the lists alive.
    #[inline]
    #[allow(clippy::mut_from_ref)]
    unsafe fn list(&self, c: usize) -> Option<&mut List> {
        // SAFETY: the caller's promise.
        unsafe { (*self.lists.get()).get_mut(c) }
    }
}

// SAFETY: every block handed out is at least `layout.size()` bytes at
// `ALIGN` (class blocks) or comes from `inner` for `layout` itself; a
// block goes back to where it came from, chosen by the same `class` of the
// same layout (GlobalAlloc's callers free with the layout they asked).
unsafe impl<A: GlobalAlloc> GlobalAlloc for Classes<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(c) = class(layout) else {
            // SAFETY: the caller's layout, passed on.
            return unsafe { self.inner.alloc(layout) };
        };
        // SAFETY: one thread; the borrow ends in this block.
        if let Some(l) = unsafe { self.list(c) } {
            if !l.head.is_null() {
                let p = l.head;
                // SAFETY: a kept block holds the next block's address in
                // its first word (written by `dealloc`), aligned to ALIGN.
                l.head = unsafe { p.cast::<*mut u8>().read() };
                l.len -= 1;
                return p;
            }
        }
        // SAFETY: a valid, non-zero class layout.
        unsafe { self.inner.alloc(class_layout(c)) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(c) = class(layout) else {
            // SAFETY: it came from `inner` with this layout.
            return unsafe { self.inner.dealloc(ptr, layout) };
        };
        // SAFETY: one thread; the borrow ends in this block.
        if let Some(l) = unsafe { self.list(c) } {
            if l.len < KEEP {
                // SAFETY: a class block: at least 16 bytes at ALIGN, ours
                // now; its first word links the list.
                unsafe { ptr.cast::<*mut u8>().write(l.head) };
                l.head = ptr;
                l.len += 1;
                return;
            }
        }
        // SAFETY: it came from `inner` with its class's layout.
        unsafe { self.inner.dealloc(ptr, class_layout(c)) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if class(layout).is_none() {
            // SAFETY: the caller's layout, passed on.
            return unsafe { self.inner.alloc_zeroed(layout) };
        }
        // SAFETY: as `alloc`; a recycled block is not zero, so zero it.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc::realloc's contract: `new_size` rounded to
        // the alignment does not overflow isize.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class(layout), class(new)) {
            // The block already has room: a class block is its class's size.
            (Some(a), Some(b)) if a == b => ptr,
            // SAFETY: both from `inner` with these layouts.
            (None, None) => unsafe { self.inner.realloc(ptr, layout, new_size) },
            // SAFETY: a new block, the old one's bytes, the old one freed
            // where it came from.
            _ => unsafe {
                let p = self.alloc(new);
                if !p.is_null() {
                    ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                p
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::alloc::System;
    use std::cell::Cell;

    /// The system allocator, counting what reaches it.
    #[derive(Default)]
    struct Counting {
        allocs: Cell<usize>,
        frees: Cell<usize>,
    }

    // SAFETY: tests use it from one thread.
    unsafe impl Sync for Counting {}

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            self.allocs.set(self.allocs.get() + 1);
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            self.frees.set(self.frees.get() + 1);
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_are_powers_of_two_from_16_to_4096() {
        assert_eq!(class(layout(1, 1)), Some(0));
        assert_eq!(class(layout(16, 8)), Some(0));
        assert_eq!(class(layout(17, 8)), Some(1));
        assert_eq!(class(layout(544, 8)), Some(6)); // 1,024
        assert_eq!(class(layout(4096, 16)), Some(8));
        assert_eq!(class(layout(4097, 1)), None, "too large");
        assert_eq!(class(layout(64, 32)), None, "too aligned");
        for c in 0..CLASSES {
            let l = class_layout(c);
            assert_eq!(class(l), Some(c));
            assert_eq!(l.align(), ALIGN);
        }
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_class() {
        let a = Classes::new(Counting::default());
        unsafe {
            let p = a.alloc(layout(300, 8));
            p.write_bytes(7, 300);
            a.dealloc(p, layout(300, 8));
            assert_eq!(a.kept(5), 1);
            // Another size of the same class (257..=512): the same block.
            let q = a.alloc(layout(500, 4));
            assert_eq!(q, p);
            assert_eq!(a.kept(5), 0);
            a.dealloc(q, layout(500, 4));
        }
        assert_eq!(a.inner.allocs.get(), 1, "one block from the system");
        assert_eq!(a.inner.frees.get(), 0, "kept, not freed");
    }

    #[test]
    fn lists_keep_at_most_keep_blocks() {
        let a = Classes::new(Counting::default());
        let l = layout(64, 8);
        let n = usize::from(KEEP) + 5;
        let blocks: Vec<*mut u8> = (0..n).map(|_| unsafe { a.alloc(l) }).collect();
        for p in &blocks {
            unsafe { a.dealloc(*p, l) };
        }
        assert_eq!(a.kept(2), usize::from(KEEP));
        assert_eq!(a.inner.frees.get(), 5, "the rest went back");
        // Drain them back, then the system again.
        let again: Vec<*mut u8> = (0..n).map(|_| unsafe { a.alloc(l) }).collect();
        assert_eq!(a.inner.allocs.get(), n + 5);
        for p in again {
            unsafe { a.dealloc(p, l) };
        }
    }

    #[test]
    fn large_and_aligned_blocks_go_to_the_system() {
        let a = Classes::new(Counting::default());
        for l in [layout(10_000, 8), layout(64, 64)] {
            unsafe {
                let p = a.alloc(l);
                assert_eq!(p as usize % l.align(), 0);
                a.dealloc(p, l);
            }
        }
        assert_eq!((a.inner.allocs.get(), a.inner.frees.get()), (2, 2));
        assert!((0..CLASSES).all(|c| a.kept(c) == 0));
    }

    #[test]
    fn zeroed_blocks_are_zero_even_when_recycled() {
        let a = Classes::new(System);
        unsafe {
            let l = layout(200, 8);
            let p = a.alloc(l);
            p.write_bytes(0xAB, 200);
            a.dealloc(p, l);
            let q = a.alloc_zeroed(l);
            assert_eq!(q, p);
            assert!(std::slice::from_raw_parts(q, 200).iter().all(|&b| b == 0));
            a.dealloc(q, l);
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_across_classes_and_the_system() {
        let a = Classes::new(System);
        unsafe {
            let mut l = layout(10, 8);
            let mut p = a.alloc(l);
            for i in 0..10 {
                p.add(i).write(i as u8);
            }
            // Within a class: the same block; then up through classes and
            // past the largest; then down again.
            for size in [16, 100, 3_000, 9_000, 20_000, 50, 10] {
                let q = a.realloc(p, l, size);
                if class(l) == class(layout(size, 8)) {
                    assert_eq!(q, p);
                }
                assert!((0..10).all(|i| q.add(i).read() == i as u8), "to {size}");
                p = q;
                l = layout(size, 8);
            }
            a.dealloc(p, l);
        }
    }

    #[test]
    fn it_runs_vecs_and_strings() {
        let a = Classes::new(System);
        // A program's worth of mixed traffic, freed and re-allocated.
        for round in 0..50_usize {
            let mut held = Vec::new();
            for i in 0..40_usize {
                let size = (i * 37 + round * 11) % 6_000 + 1;
                let l = layout(size, 1 << (i % 5));
                unsafe {
                    let p = a.alloc(l);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % l.align(), 0);
                    p.write_bytes(i as u8, size);
                    held.push((p, l, i as u8));
                }
            }
            for (p, l, v) in held {
                unsafe {
                    assert!(std::slice::from_raw_parts(p, l.size())
                        .iter()
                        .all(|&b| b == v));
                    a.dealloc(p, l);
                }
            }
        }
    }
}
