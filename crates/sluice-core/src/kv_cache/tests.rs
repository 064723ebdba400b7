//! The manager's promises on one full-attention group, example by example.

use super::*;
use crate::block_hash::BlockHasher;
use crate::block_hash::HashAlgo;
use crate::request::NewRequest;
use crate::sampling_params::SamplingParams;

fn manager(num_blocks: usize, block_size: usize, caching: bool) -> KvCacheManager {
    let hasher = caching.then(|| BlockHasher::new(HashAlgo::Sha256, block_size, None));
    KvCacheManager::new(num_blocks, block_size, 4096, 0.0, hasher).unwrap()
}

fn request(m: &KvCacheManager, prompt: Vec<u32>) -> Request {
    Request::from_new(
        NewRequest::new("r", prompt, SamplingParams::greedy(8)),
        m.hasher(),
    )
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut m = manager(16, 16, true);
    let a = request(&m, (0..32).collect());
    assert_eq!(
        m.allocate_slots(0, &a, slot_request(32, 0, None, true)),
        Some(smallvec::smallvec![2])
    );
    let b = request(&m, (0..32).collect());
    let mut hit = ComputedBlocks::new(1);
    // max_len = 31: only the first block can hit.
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 16);
    assert_eq!(hit.group(GroupId(0)), &[1]);
    // A 33-token prompt with the same start hits both blocks.
    let c = request(&m, (0..33).collect());
    assert_eq!(m.get_computed_blocks(&c, &mut hit), 32);
    assert_eq!(hit.group(GroupId(0)), &[1, 2]);
    // Lookups have no side effects.
    assert_eq!(m.pool().ref_cnt(1), 1);
}

#[test]
fn prompt_logprobs_requests_never_read_the_cache() {
    let mut m = manager(16, 4, true);
    let a = request(&m, (0..9).collect());
    m.allocate_slots(0, &a, slot_request(9, 0, None, true))
        .unwrap();
    let params = SamplingParams {
        prompt_logprobs: Some(1),
        ..SamplingParams::greedy(4)
    };
    let b = Request::from_new(NewRequest::new("b", (0..9).collect(), params), m.hasher());
    let mut hit = ComputedBlocks::new(1);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 0);
}

/// `docs/scheduler-semantics.md` §Worked examples, E1 (B = 4, N = 10, a
/// 10-token prompt).
#[test]
fn hits_revive_freed_blocks_and_the_gate_counts_them() {
    let mut m = manager(10, 4, true);
    let a = request(&m, (0..10).collect());
    assert_eq!(
        m.allocate_slots(0, &a, slot_request(10, 0, None, true)),
        Some(smallvec::smallvec![3])
    );
    assert_eq!(m.block_ids(0), &[1, 2, 3]);
    m.free(0);
    let queue: Vec<u32> = m.pool().free_queue().iter().collect();
    assert_eq!(queue, vec![3, 4, 5, 6, 7, 8, 9, 2, 1]);

    let b = request(&m, (0..10).collect());
    let mut hit = ComputedBlocks::new(1);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 8);
    // Gate: 3 - 2 held/hit + 2 evictable hit blocks = 3 <= 9.
    assert_eq!(
        m.allocate_slots(1, &b, slot_request(2, 8, Some(&hit), true)),
        Some(smallvec::smallvec![1])
    );
    assert_eq!(m.block_ids(1), &[1, 2, 3]);
    assert_eq!(m.num_free_blocks(), 6);
}

#[test]
fn without_caching_freed_blocks_are_reused_last_first() {
    let mut m = manager(10, 4, false);
    let a = request(&m, (0..10).collect());
    m.allocate_slots(0, &a, slot_request(10, 0, None, true))
        .unwrap();
    m.free(0);
    let b = request(&m, (0..10).collect());
    let mut hit = ComputedBlocks::new(1);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 0);
    m.allocate_slots(1, &b, slot_request(10, 0, None, true))
        .unwrap();
    assert_eq!(m.block_ids(1), &[3, 2, 1]);
}

#[test]
fn full_sequence_gate_needs_room_for_every_known_token() {
    let mut m = manager(5, 4, false); // 4 usable blocks
    let a = request(&m, (0..17).collect()); // needs 5 blocks in all
    assert_eq!(
        m.allocate_slots(0, &a, slot_request(4, 0, None, true)),
        None
    );
    // A failed call changes nothing.
    assert_eq!(m.num_free_blocks(), 4);
    assert!(m.block_ids(0).is_empty());
    // Without the gate, the first chunk fits.
    assert_eq!(
        m.allocate_slots(0, &a, slot_request(4, 0, None, false)),
        Some(smallvec::smallvec![1])
    );
}

#[test]
fn usage_and_prefix_stats() {
    let mut m = manager(5, 4, true);
    assert_eq!(m.usage(), 0.0);
    let a = request(&m, (0..8).collect());
    m.allocate_slots(0, &a, slot_request(8, 0, None, true))
        .unwrap();
    assert_eq!(m.usage(), 0.5);
    m.record_prefix_cache_stats(&a, 4);
    let s = m.take_prefix_cache_stats();
    assert_eq!((s.requests, s.queries, s.hits), (1, 8, 4));
    assert_eq!(m.prefix_cache_stats().requests, 0);
    assert!(!m.reset_prefix_cache());
    m.free(0);
    assert!(m.reset_prefix_cache());
    assert!(m.prefix_cache_stats().reset);
}

fn slot_request(
    num_new_tokens: usize,
    num_new_computed_tokens: usize,
    new_computed_blocks: Option<&ComputedBlocks>,
    full_sequence_must_fit: bool,
) -> SlotRequest<'_> {
    SlotRequest {
        num_new_tokens,
        num_new_computed_tokens,
        new_computed_blocks,
        full_sequence_must_fit,
        ..SlotRequest::default()
    }
}
