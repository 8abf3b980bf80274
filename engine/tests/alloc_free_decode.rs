//! Heap allocations of the decode loop, counted by a global allocator
//! installed in this test binary only: after warm-up a decode step (trace disabled) makes
//! none, in both numerics profiles and both layouts. Recording a trace does allocate (the
//! trace grows per token), and a buffer whose size follows the sequence length reallocates
//! when the length crosses a power of two (`model::pool`); `Session::reserve` pre-sizes the
//! growing caches.
//!
//! Rayon: the steps run inside one `install` on a single-thread pool, so every parallel
//! iterator runs on that worker and rayon's injector (which allocates job blocks when a
//! thread outside the pool submits work) is never used during the measured steps. With more
//! threads, rayon's own bookkeeping may allocate; the engine's code paths are the same.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ds41_engine::checkpoint::Layout as CkptLayout;
use ds41_engine::model::{IndexK, Model, Numerics, Options, Session};
use ds41_engine::trace::Trace;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 509 + 3).collect()
}

/// Allocations of each of `steps` decode steps after a prefill and `warmup` decode steps.
fn count(model: &Model, numerics: Numerics, warmup: usize, steps: usize) -> Vec<usize> {
    let ids = ids(13 + warmup + steps);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let options = Options {
            numerics,
            index_k: IndexK::AsShipped,
            ..Options::default()
        };
        let mut session = Session::new(model, options);
        session.reserve(ids.len());
        let mut trace = Trace::disabled();
        session.prefill(&ids[..13], &mut trace).unwrap();
        for &t in &ids[13..13 + warmup] {
            session.decode(t, &mut trace).unwrap();
        }
        let mut counts = Vec::with_capacity(steps);
        for &t in &ids[13 + warmup..] {
            ALLOCATIONS.store(0, Ordering::SeqCst);
            COUNTING.store(true, Ordering::SeqCst);
            let r = session.decode(t, &mut trace);
            COUNTING.store(false, Ordering::SeqCst);
            r.unwrap();
            counts.push(ALLOCATIONS.load(Ordering::SeqCst));
        }
        counts
    })
}

#[test]
fn decode_steps_do_not_allocate_after_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    for layout in [CkptLayout::Release, CkptLayout::Container] {
        let out = dir.path().join(format!("tiny-{layout:?}"));
        ds41_synthetic::generate("tiny", layout, 3, &out).unwrap();
        let model = Model::open(&out).unwrap();
        for numerics in [Numerics::Upstream, Numerics::Exact] {
            // Warm-up: the prefill and 8 decode steps fill the buffer pools. The measured
            // steps (positions 21..28) stay below the next power of two of every
            // length-dependent buffer.
            let counts = count(&model, numerics, 8, 8);
            eprintln!("{layout:?} {numerics}: allocations per decode step {counts:?}");
            assert!(
                counts.iter().all(|&c| c == 0),
                "{layout:?} {numerics}: decode steps allocated {counts:?}"
            );
        }
    }
}
