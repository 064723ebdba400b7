//! A warm step of the CPU forward pass allocates nothing on the thread that
//! runs it: building the batch, the forward pass, the logits — for fused
//! layers and for linear layers made of parts in different formats.

mod common;

use common::*;
use sluice_model::kv_cache::KvCacheConfig;
use sluice_model::model::ForwardBatch;
use sluice_model::runner::{CpuBackend, ForwardBackend};
use sluice_model::LoadedModel;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

// Per thread (as in sluice-core's allocation test): only the allocations of
// the thread that runs the step count, not the harness's. `const`
// initialisation without a destructor, so reading these never allocates.
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; only
// counts allocations while `COUNTING` is set on the calling thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations of the calling thread during the third of three identical
/// 4-request decode steps (after a prefill).
fn decode_step_allocations(loaded: &LoadedModel) -> usize {
    let bs = 16;
    let mut backend = CpuBackend::new(loaded, KvCacheConfig::new(bs, 64)).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|r| (0..20 + 7 * r).map(|i| (i * 31 + r) % 900).collect())
        .collect();
    let tables: Vec<Vec<u32>> = (0..4u32)
        .map(|r| (1 + 8 * r..9 + 8 * r).collect())
        .collect();
    let mut batch = ForwardBatch::default();
    let mut logits = Vec::new();
    for (p, t) in prompts.iter().zip(&tables) {
        let row = batch.push_seq(p, 0, t, bs).unwrap();
        batch.logits_rows.push(row + p.len() - 1);
    }
    backend.forward(&batch).unwrap();
    backend.logits(0..4, &mut logits).unwrap();
    let mut measured = 0;
    for step in 0..3 {
        COUNTING.with(|c| c.set(step == 2));
        batch.clear();
        for (r, (p, t)) in prompts.iter().zip(&tables).enumerate() {
            // The same position each time: the step is repeated exactly.
            let row = batch.push_seq(&[r as u32 + 5], p.len(), t, bs).unwrap();
            batch.logits_rows.push(row);
        }
        backend.forward(&batch).unwrap();
        backend.logits(0..4, &mut logits).unwrap();
        COUNTING.with(|c| c.set(false));
        measured = ALLOCS.with(|n| n.replace(0));
    }
    assert!(logits[..4 * loaded.config.vocab_size]
        .iter()
        .all(|x| x.is_finite()));
    measured
}

#[test]
fn a_warm_decode_step_allocates_nothing() {
    // The counter counts.
    COUNTING.with(|c| c.set(true));
    drop(std::hint::black_box(vec![1u8; 3]));
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCS.with(|n| n.replace(0)), 1);

    let f = fixture("tiny-qwen3");
    assert_eq!(decode_step_allocations(&f.loaded), 0, "fused layers");
    assert_eq!(
        decode_step_allocations(&mixed_formats(&f)),
        0,
        "layers made of parts"
    );
}
