//! The coordinator with several groups: two full-attention groups, and a
//! full group beside a second kind of attention written here (a sliding
//! window that releases the blocks behind it), both over one pool. The
//! expected block ids and counts are worked out by hand from the rules
//! (one pool; allocation all or nothing over every group; a hit all groups
//! agree on; tables freed group after group, last entry first).

use super::*;
use crate::block_hash::{BlockHash, BlockHasher, HashAlgo};
use crate::block_pool::NULL_BLOCK;
use crate::request::{NewRequest, TokenId};
use crate::sampling_params::SamplingParams;

const B: usize = 4;

/// A sliding window of `window` tokens: a block whose last token is more
/// than `window - 1` tokens behind the computed ones is released (its entry
/// becomes the null block); a hit needs only the blocks the window reads.
#[derive(Debug)]
struct Window {
    group: GroupId,
    window: usize,
    tables: Vec<Vec<BlockId>>,
}

impl SingleTypeKvCacheManager for Window {
    fn group(&self) -> GroupId {
        self.group
    }
    fn block_size(&self) -> usize {
        B
    }
    fn block_ids(&self, slot: usize) -> &[BlockId] {
        self.tables.get(slot).map_or(&[], Vec::as_slice)
    }
    fn num_cached_blocks(&self, _slot: usize) -> usize {
        0
    }
    fn find_longest_cache_hit(
        &self,
        pool: &BlockPool,
        hashes: &[BlockHash],
        max_tokens: usize,
        hit: &mut Vec<BlockId>,
    ) -> usize {
        // Registers nothing (see `cache_blocks`), so it can reuse nothing.
        hit.clear();
        let _ = (pool, hashes, max_tokens);
        0
    }
    fn remove_skipped_blocks(&mut self, pool: &mut BlockPool, slot: usize, computed: usize) {
        let Some(table) = self.tables.get_mut(slot) else {
            return;
        };
        let mut released = Vec::new();
        for (j, b) in table.iter_mut().enumerate() {
            if (j + 1) * B + self.window <= computed + 1 && *b != NULL_BLOCK {
                released.push(*b);
                *b = NULL_BLOCK;
            }
        }
        pool.free_blocks(released.into_iter().rev());
    }
    fn get_num_blocks_to_allocate(
        &self,
        _pool: &BlockPool,
        slot: usize,
        num_tokens: usize,
        _hit: &[BlockId],
    ) -> usize {
        num_tokens
            .div_ceil(B)
            .saturating_sub(self.block_ids(slot).len())
    }
    fn allocate(
        &mut self,
        pool: &mut BlockPool,
        slot: usize,
        num_tokens: usize,
        _hit: &[BlockId],
        _reserve_tokens: usize,
    ) -> usize {
        if slot >= self.tables.len() {
            self.tables.resize_with(slot + 1, Vec::new);
        }
        let want = num_tokens
            .div_ceil(B)
            .saturating_sub(self.tables[slot].len());
        pool.get_new_blocks(want, &mut self.tables[slot]);
        want
    }
    fn cache_blocks(
        &mut self,
        _pool: &mut BlockPool,
        _slot: usize,
        _hashes: &[BlockHash],
        _tokens: &[TokenId],
        _num_tokens: usize,
    ) {
    }
    fn free(&mut self, pool: &mut BlockPool, slot: usize) {
        if let Some(t) = self.tables.get_mut(slot) {
            pool.free_blocks(t.iter().rev().copied());
            t.clear();
        }
    }
    fn tables(&self) -> Box<dyn Iterator<Item = (usize, &[BlockId])> + '_> {
        Box::new(
            self.tables
                .iter()
                .enumerate()
                .map(|(i, t)| (i, t.as_slice())),
        )
    }
}

fn hasher() -> Option<BlockHasher> {
    Some(BlockHasher::new(HashAlgo::Sha256, B, None))
}

fn two_full(num_blocks: usize) -> KvCacheManager {
    let groups = [KvCacheGroupSpec::Full, KvCacheGroupSpec::Full];
    KvCacheManager::with_groups(num_blocks, B, 4096, 0.0, hasher(), &groups).unwrap()
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
    assert_eq!(m.allocate_slots(0, &a, admit(10)), Some(3));
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
        Some(1)
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
    assert_eq!(m.allocate_slots(1, &b, r), Some(1));
    assert_eq!(m.group_block_ids(GroupId(0), 1)[..2], [1, 2]);
    assert_eq!(m.group_block_ids(GroupId(1), 1)[..2], [4, 5]);
}

#[test]
fn the_hit_is_what_every_group_agrees_on() {
    let groups: Vec<Box<dyn SingleTypeKvCacheManager>> = vec![
        Box::new(FullAttentionManager::new(GroupId(0), B)),
        Box::new(Window {
            group: GroupId(1),
            window: 4,
            tables: Vec::new(),
        }),
    ];
    let mut m = KvCacheManager::with_managers(16, B, 4096, 0.0, hasher(), groups).unwrap();
    let a = request(&m, "a", (0..9).collect());
    m.allocate_slots(0, &a, admit(9)).unwrap();
    m.free(0);
    // The full group has two blocks registered; the window group none, so
    // the two agree on no hit at all.
    let b = request(&m, "b", (0..9).collect());
    let mut hit = ComputedBlocks::new(2);
    assert_eq!(m.get_computed_blocks(&b, &mut hit), 0);
    assert!(hit.is_empty());
}

#[test]
fn a_second_kind_releases_blocks_before_counting() {
    let groups: Vec<Box<dyn SingleTypeKvCacheManager>> = vec![
        Box::new(FullAttentionManager::new(GroupId(0), B)),
        Box::new(Window {
            group: GroupId(1),
            window: 4,
            tables: Vec::new(),
        }),
    ];
    let mut m = KvCacheManager::with_managers(9, B, 4096, 0.0, None, groups).unwrap();
    let mut a = request(&m, "a", (0..12).collect());
    m.allocate_slots(0, &a, admit(12)).unwrap();
    assert_eq!(m.num_free_blocks(), 2); // 8 usable, 3 + 3 taken
    a.num_computed_tokens = 12;
    a.status = RequestStatus::Running;
    // One more token needs a fourth block in each group: two blocks, and
    // only two are free. The window (4 tokens at 12 computed) no longer
    // reads blocks 0 and 1 of its table: released first, they make room.
    let decode = SlotRequest {
        num_new_tokens: 1,
        ..SlotRequest::default()
    };
    assert_eq!(m.allocate_slots(0, &a, decode), Some(1));
    let window_table = m.group_block_ids(GroupId(1), 0);
    assert_eq!(&window_table[..2], &[NULL_BLOCK, NULL_BLOCK]);
    assert_eq!(window_table.len(), 4);
    assert_eq!(m.group_block_ids(GroupId(0), 0).len(), 4);
    assert_eq!(m.num_free_blocks(), 2);
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
fn the_scheduler_takes_one_group_until_its_output_carries_more() {
    let one = crate::SchedulerConfig::default();
    assert_eq!(one.kv_cache_groups, vec![KvCacheGroupSpec::Full]);
    assert!(one.validate_basic().is_ok());
    let two = crate::SchedulerConfig {
        kv_cache_groups: vec![KvCacheGroupSpec::Full, KvCacheGroupSpec::Full],
        ..crate::SchedulerConfig::default()
    };
    let e = two.validate_basic().unwrap_err();
    assert!(e.to_string().contains("kv_cache_groups"), "{e}");
    let none = crate::SchedulerConfig {
        kv_cache_groups: Vec::new(),
        ..crate::SchedulerConfig::default()
    };
    assert!(none.validate_basic().is_err());
}
