//! A steady decode step allocates nothing per request beyond its output:
//! the allocations inside `schedule()` + `update_from_output()` do not grow
//! with the number of running requests.

use sluice_core::{ModelRunnerOutput, NewRequest, SamplingParams, Scheduler, SchedulerConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

// Per thread, not global: the test harness's own threads allocate while a
// test runs (libtest's main thread records the test it just spawned and
// registers its channel wait; under CPU load that bookkeeping can land in
// the measured window and made this test flaky). Only the allocations of
// the thread that runs `schedule()` / `update_from_output()` count.
// `const` initialisation without a destructor: reading these never
// allocates, so the allocator can use them.
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count_one() {
    // `try_with`: an allocation during thread teardown must not panic.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

/// Starts or stops counting this thread's allocations.
fn counting(on: bool) {
    COUNTING.with(|c| c.set(on));
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

/// Most allocations of one decode step with `n` running requests, over
/// `steps` steps (after warm-up).
fn max_allocs_per_step(n: usize, steps: usize) -> usize {
    let mut s = Scheduler::new(SchedulerConfig {
        block_size: 16,
        num_gpu_blocks: n * 64 + 8,
        max_num_seqs: n,
        max_num_batched_tokens: 8192,
        max_model_len: 4096,
        enable_prefix_caching: true,
        ..SchedulerConfig::default()
    })
    .expect("config");
    for i in 0..n {
        let prompt = (0..100 + i as u32 % 30).map(|t| t * 7 + i as u32).collect();
        s.add_request(NewRequest::new(
            format!("r{i}"),
            prompt,
            SamplingParams::greedy(1000),
        ))
        .expect("request");
    }
    let mut worst = 0;
    for step in 0..steps + 20 {
        let measured = step >= 20;
        ALLOCS.with(|n| n.set(0));
        counting(measured);
        let out = s.schedule();
        counting(false);
        let mut mro = ModelRunnerOutput::with_capacity(out.num_scheduled_tokens.len());
        for e in &out.num_scheduled_tokens {
            let r = s.request(e.handle).expect("live");
            mro.push(if r.num_computed_tokens() >= r.num_tokens() {
                &[5]
            } else {
                &[]
            });
        }
        counting(measured);
        let outs = s.update_from_output(&out, &mro);
        counting(false);
        drop((out, outs));
        if measured {
            assert_eq!(s.get_request_counts(), (n, 0), "all decoding");
            worst = worst.max(ALLOCS.with(Cell::get));
        }
    }
    worst
}

#[test]
fn decode_steps_allocate_only_their_output() {
    let small = max_allocs_per_step(8, 100);
    let large = max_allocs_per_step(512, 100);
    // A handful of output vectors per step, whatever the batch size (block
    // ids crossing into a new block, hashes of full blocks: all reserved).
    assert!(
        large <= 8,
        "{large} allocations in one step with 512 requests"
    );
    assert_eq!(
        small, large,
        "allocations grow with the batch: {small} vs {large}"
    );
}
