//! The coordinator with several groups: two full-attention groups, and a
//! full group beside a sliding window and a chunked-local group, over one
//! pool. The expected block ids and counts are worked out by hand from the
//! rules (one pool; allocation all or nothing over every group; a hit all
//! groups agree on; out-of-window blocks released before counting; tables
//! freed group after group, last entry first).

use super::*;
use crate::block_hash::{BlockHasher, HashAlgo};
use crate::block_pool::NULL_BLOCK;
use crate::request::NewRequest;
use crate::sampling_params::SamplingParams;

const B: usize = 4;

fn hasher() -> Option<BlockHasher> {
    Some(BlockHasher::new(HashAlgo::Sha256, B, None))
}

fn two_full(num_blocks: usize) -> KvCacheManager {
    let groups = [KvCacheGroupSpec::FULL, KvCacheGroupSpec::FULL];
    KvCacheManager::with_groups(num_blocks, B, 4096, 4096, 0.0, hasher(), &groups).unwrap()
}

fn request(m: &KvCacheManager, id: &str, prompt: Vec<u32>) -> Request {
    Request::from_new(
        NewRequest::new(id, prompt, SamplingParams::greedy(8)),
        m.hasher(),
    )
}

fn admit(n: usize) -> SlotRequest<'static> {
    SlotRequest {
        num_new_tokens: n,
        full_sequence_must_fit: true,
        ..SlotRequest::default()
    }
}

#[test]
fn groups_draw_from_one_pool_all_or_nothing() {
    let mut m = two_full(10); // 9 usable blocks
    assert_eq!(m.num_groups(), 2);
    let a = request(&m, "a", (0..10).collect());
    // Three blocks in each group, group 0 first from the queue's head.
    assert_eq!(
        m.allocate_slots(0, &a, admit(10)),
        Some(smallvec::smallvec![3, 3])
    );
    assert_eq!(m.group_block_ids(GroupId(0), 0), &[1, 2, 3]);
    assert_eq!(m.group_block_ids(GroupId(1), 0), &[4, 5, 6]);
    assert_eq!(m.num_free_blocks(), 3);
    // Six more would be needed: nothing is taken, in any group.
    let b = request(&m, "b", (100..110).collect());
    assert_eq!(m.allocate_slots(1, &b, admit(10)), None);
    assert_eq!(m.num_free_blocks(), 3);
    assert!(m.group_block_ids(GroupId(0), 1).is_empty());
    assert!(m.group_block_ids(GroupId(1), 1).is_empty());
    // Four tokens (one block per group) fit.
    assert_eq!(
        m.allocate_slots(
            1,
            &b,
            SlotRequest {
                full_sequence_must_fit: false,
                ..admit(4)
            }
        ),
        Some(smallvec::smallvec![1, 1])
    );
    assert_eq!(m.num_free_blocks(), 1);
}

#[test]
fn a_hit_is_found_in_every_group_and_freed_group_after_group() {
    let mut m = two_full(16);
    let a = request(&m, "a", (0..9).collect());
    m.allocate_slots(0, &a, admit(9)).unwrap();
    // Blocks 1, 2 (group 0) and 4, 5 (group 1) are full and registered,
    // each under its own group: the same hash, two keys.
    let h0 = a.block_hashes[0];
    assert_eq!(m.pool().get_cached_block(&h0, GroupId(0)), Some(1));
    assert_eq!(m.pool().get_cached_block(&h0, GroupId(1)), Some(4));
    m.free(0);
    // Group 0's table freed first (3, 2, 1: the unhashed 3 to the head,
    // hashed ones to the tail, reversed), then group 1's (6 to the head).
    let queue: Vec<BlockId> = m.pool().free_queue().iter().collect();
    assert_eq!(&queue[..2], &[6, 3]);
    assert_eq!(&queue[queue.len() - 4..], &[2, 1, 5, 4]);

    let b = request(&m, "b", (0..9).collect());
    let mut hit = ComputedBlocks::new(2);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 8);
    assert_eq!(hit.group(GroupId(0)), &[1, 2]);
    assert_eq!(hit.group(GroupId(1)), &[4, 5]);
    let r = SlotRequest {
        num_new_tokens: 1,
        num_new_computed_tokens: 8,
        new_computed_blocks: Some(&hit),
        full_sequence_must_fit: true,
        ..SlotRequest::default()
    };
    assert_eq!(m.allocate_slots(1, &b, r), Some(smallvec::smallvec![1, 1]));
    assert_eq!(m.group_block_ids(GroupId(0), 1)[..2], [1, 2]);
    assert_eq!(m.group_block_ids(GroupId(1), 1)[..2], [4, 5]);
}

fn full_and_window(num_blocks: usize, hasher: Option<BlockHasher>) -> KvCacheManager {
    let groups = [KvCacheGroupSpec::FULL, KvCacheGroupSpec::sliding_window(4)];
    KvCacheManager::with_groups(num_blocks, B, 4096, 4096, 0.0, hasher, &groups).unwrap()
}

#[test]
fn a_window_keeps_only_the_blocks_a_hit_can_use() {
    let mut m = full_and_window(16, hasher());
    let a = request(&m, "a", (0..13).collect());
    m.allocate_slots(0, &a, admit(13)).unwrap();
    // Full: blocks 1..=4 (three full ones registered); window: 5..=8. A
    // window of 4 needs ceil(3/4) = 1 block before a hit's end; the only
    // reachable end is floor(12/4)*4 = 12 (prompt − 1, aligned), so only
    // entry 2 (block 7) is registered.
    let hs = &a.block_hashes;
    assert_eq!(m.pool().get_cached_block(&hs[0], GroupId(0)), Some(1));
    assert_eq!(m.pool().get_cached_block(&hs[2], GroupId(0)), Some(3));
    assert_eq!(m.pool().get_cached_block(&hs[0], GroupId(1)), None);
    assert_eq!(m.pool().get_cached_block(&hs[1], GroupId(1)), None);
    assert_eq!(m.pool().get_cached_block(&hs[2], GroupId(1)), Some(7));
    m.free(0);
    // The same prompt again: full attention offers 12 tokens, the window
    // agrees (its block before 12 is there); entries it does not read are
    // the null block.
    let b = request(&m, "b", (0..13).collect());
    let mut hit = ComputedBlocks::new(2);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 12);
    assert_eq!(hit.group(GroupId(0)), &[1, 2, 3]);
    assert_eq!(hit.group(GroupId(1)), &[NULL_BLOCK, NULL_BLOCK, 7]);
    // A prompt sharing only 8 tokens: the full hit is 8, but the window has
    // nothing registered before 8, nor at 4, so the hit is 0.
    let mut p: Vec<u32> = (0..8).collect();
    p.extend(100..105);
    let c = request(&m, "c", p);
    assert_eq!(m.get_computed_blocks(&c, &mut hit), 0);
    assert_eq!(hit.shared_prefix_boundary, 8);
}

#[test]
fn a_second_kind_releases_blocks_before_counting() {
    let mut m = full_and_window(9, None);
    let mut a = request(&m, "a", (0..12).collect());
    m.allocate_slots(0, &a, admit(12)).unwrap();
    assert_eq!(m.num_free_blocks(), 2); // 8 usable, 3 + 3 taken
    a.num_computed_tokens = 12;
    a.status = RequestStatus::Running;
    // One more token needs a fourth block in each group: two blocks, and
    // only two are free. The window (4 tokens at 12 computed) no longer
    // reads entries 0 and 1 of its table: released first (entry 1 then 0,
    // both to the head), they make room and are taken again at once.
    let decode = SlotRequest {
        num_new_tokens: 1,
        ..SlotRequest::default()
    };
    assert_eq!(
        m.allocate_slots(0, &a, decode),
        Some(smallvec::smallvec![1, 1])
    );
    let window_table = m.group_block_ids(GroupId(1), 0);
    assert_eq!(&window_table[..2], &[NULL_BLOCK, NULL_BLOCK]);
    assert_eq!(window_table.len(), 4);
    assert_eq!(m.group_block_ids(GroupId(0), 0), &[1, 2, 3, 5]);
    assert_eq!(window_table[3], 4);
    assert_eq!(m.num_free_blocks(), 2);
}

#[test]
fn admission_reserves_at_most_what_a_window_holds() {
    // Window 4, budget 4, block 4: a window group holds at most
    // ceil(min(3 + 4, 4096)/4) + 1 = 3 blocks at once.
    let groups = [KvCacheGroupSpec::sliding_window(4), KvCacheGroupSpec::FULL];
    let mut m = KvCacheManager::with_groups(12, B, 4096, 4, 0.0, None, &groups).unwrap();
    // 32 tokens: full needs 8, the window 3 (capped): 11 = every usable
    // block, so the gate lets it in.
    let a = request(&m, "a", (0..32).collect());
    assert_eq!(
        m.allocate_slots(0, &a, admit(4)),
        Some(smallvec::smallvec![1, 1])
    );
}

#[test]
fn chunked_local_releases_whole_chunks() {
    let groups = [KvCacheGroupSpec::chunked_local(8), KvCacheGroupSpec::FULL];
    let mut m = KvCacheManager::with_groups(32, B, 4096, 4096, 0.0, None, &groups).unwrap();
    let mut a = request(&m, "a", (0..20).collect());
    m.allocate_slots(0, &a, admit(20)).unwrap();
    a.num_computed_tokens = 20;
    a.status = RequestStatus::Running;
    let decode = SlotRequest {
        num_new_tokens: 1,
        ..SlotRequest::default()
    };
    m.allocate_slots(0, &a, decode).unwrap();
    // At 20 computed the chunk [16, 24) is current: entries 0..4 (tokens
    // 0..16) are released.
    let t = m.group_block_ids(GroupId(0), 0);
    assert_eq!(&t[..4], &[NULL_BLOCK; 4]);
    assert_eq!(t.len(), 6);
}

#[test]
fn block_sizes_combine_by_lcm_and_gcd() {
    let groups = [
        KvCacheGroupSpec::sliding_window(64).with_block_size(32),
        KvCacheGroupSpec::FULL,
    ];
    assert_eq!(block_layout(&groups, 16, true), (32, 16));
    assert_eq!(block_layout(&groups, 16, false), (32, 32));
    assert_eq!(block_layout(&[KvCacheGroupSpec::FULL], 16, true), (16, 16));
}

#[test]
fn managers_must_match_their_group_and_block_size() {
    let wrong_group: Vec<Box<dyn SingleTypeKvCacheManager>> =
        vec![Box::new(FullAttentionManager::new(GroupId(1), B))];
    let e = KvCacheManager::with_managers(8, B, 4096, 0.0, None, wrong_group).unwrap_err();
    assert_eq!(e.field, "kv_cache_groups");
    let wrong_size: Vec<Box<dyn SingleTypeKvCacheManager>> =
        vec![Box::new(FullAttentionManager::new(GroupId(0), 2 * B))];
    let e = KvCacheManager::with_managers(8, B, 4096, 0.0, None, wrong_size).unwrap_err();
    assert!(e.message.contains("8 tokens"), "{}", e.message);
    let e = KvCacheManager::with_managers(8, B, 4096, 0.0, None, Vec::new()).unwrap_err();
    assert_eq!(e.field, "kv_cache_groups");
}

#[test]
fn the_scheduler_takes_several_groups() {
    let one = crate::SchedulerConfig::default();
    assert_eq!(one.kv_cache_groups, vec![KvCacheGroupSpec::FULL]);
    assert!(one.validate_basic().is_ok());
    let two = crate::SchedulerConfig {
        kv_cache_groups: vec![
            KvCacheGroupSpec::sliding_window(128),
            KvCacheGroupSpec::FULL,
        ],
        ..crate::SchedulerConfig::default()
    };
    assert!(two.validate_basic().is_ok());
    let none = crate::SchedulerConfig {
        kv_cache_groups: Vec::new(),
        ..crate::SchedulerConfig::default()
    };
    assert!(none.validate_basic().is_err());
    let zero = crate::SchedulerConfig {
        kv_cache_groups: vec![KvCacheGroupSpec::sliding_window(0)],
        ..crate::SchedulerConfig::default()
    };
    assert!(zero.validate_basic().is_err());
}

#[test]
fn a_full_block_larger_than_the_hash_block_gets_the_prompt_tail_as_a_second_key() {
    // Hashes every 2 tokens (the GCD), full-attention blocks of 4: an
    // 8-token prompt's resend reaches 7 tokens, rounded to the hash block 6,
    // inside the full group's block 1 (tokens 4..8).
    use crate::kv_events::KvCacheEvent;
    let groups = [
        KvCacheGroupSpec::sliding_window(4).with_block_size(2),
        KvCacheGroupSpec::FULL,
    ];
    let hasher = Some(BlockHasher::new(HashAlgo::Sha256, 2, None));
    let mut m = KvCacheManager::with_groups(16, B, 4096, 4096, 0.0, hasher, &groups).unwrap();
    m.set_kv_cache_events(true);
    let a = request(&m, "a", (0..8).collect());
    m.allocate_slots(0, &a, admit(8)).unwrap();
    let full = m.group_block_ids(GroupId(1), 0).to_vec();
    let hs = &a.block_hashes;
    assert_eq!(m.pool().get_cached_block(&hs[1], GroupId(1)), Some(full[0]));
    assert_eq!(m.pool().get_cached_block(&hs[3], GroupId(1)), Some(full[1]));
    assert_eq!(m.pool().get_cached_block(&hs[2], GroupId(1)), Some(full[1]));
    let events = m.take_events();
    let Some(KvCacheEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        group,
        ..
    }) = events.last()
    else {
        panic!("no store: {events:?}");
    };
    assert_eq!(block_hashes, &[hs[2].external()]);
    assert_eq!(*parent_block_hash, Some(hs[1].external()));
    assert_eq!(token_ids, &[4, 5]);
    assert_eq!(*block_size, 2);
    assert_eq!(group.map(|g| g.group_idx), Some(1));
    // Caching again adds nothing.
    m.cache_blocks(0, &a, 8);
    assert!(m.take_events().is_empty());
    // Evicted, the block loses both keys, each with its removal.
    m.free(0);
    let b = request(&m, "b", (100..120).collect());
    m.allocate_slots(1, &b, admit(20)).unwrap();
    let removed: Vec<u64> = m
        .take_events()
        .iter()
        .filter_map(|e| match e {
            KvCacheEvent::BlockRemoved {
                block_hashes,
                group_idx: Some(1),
                ..
            } => Some(block_hashes[0]),
            _ => None,
        })
        .collect();
    assert!(removed.contains(&hs[3].external()), "{removed:?}");
    assert!(removed.contains(&hs[2].external()), "{removed:?}");
    m.pool().check_invariants().unwrap();
}
