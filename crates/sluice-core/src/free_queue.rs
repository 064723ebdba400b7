//! The free-block queue: an intrusive doubly linked list over block ids.
//!
//! Owns only the order of free blocks. Removal from the middle is O(1) (a
//! prefix-cache hit takes a cached-but-free block out of the queue), and the
//! head/tail conventions are vLLM's: allocation pops from the head, unhashed
//! freed blocks are pushed at the head (reused first), hashed ones appended at
//! the tail (evicted last). Links are indices into two arrays, with two
//! sentinel slots after the last block, so nothing is allocated after `new`.

use crate::request::BlockId;

const NONE: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub struct FreeBlockQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeBlockQueue {
    /// A queue holding `blocks` in the given order; the other ids up to
    /// `capacity` start unlinked. Fails, instead of aborting, when the two
    /// link arrays cannot be allocated or `capacity` does not fit the `u32`
    /// links (the two sentinels take the ids `capacity` and `capacity + 1`).
    pub fn new(capacity: usize, blocks: impl IntoIterator<Item = BlockId>) -> Result<Self, String> {
        let head = match u32::try_from(capacity) {
            Ok(h) if h < NONE - 1 => h,
            _ => return Err(format!("{capacity} blocks do not fit 32-bit block ids")),
        };
        let tail = head + 1;
        let links = || {
            let mut v = Vec::new();
            v.try_reserve_exact(capacity + 2)
                .map_err(|e| format!("cannot allocate the free queue of {capacity} blocks: {e}"))?;
            v.resize(capacity + 2, NONE);
            Ok::<_, String>(v)
        };
        let mut q = FreeBlockQueue {
            prev: links()?,
            next: links()?,
            head,
            tail,
            len: 0,
        };
        q.next[head as usize] = tail;
        q.prev[tail as usize] = head;
        for b in blocks {
            q.push_back(b);
        }
        Ok(q)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `block` is currently linked into the queue.
    pub fn contains(&self, block: BlockId) -> bool {
        self.next[block as usize] != NONE
    }

    pub fn front(&self) -> Option<BlockId> {
        let first = self.next[self.head as usize];
        (first != self.tail).then_some(first)
    }

    pub fn pop_front(&mut self) -> Option<BlockId> {
        let first = self.front()?;
        self.remove(first);
        Some(first)
    }

    /// Unlinks `block`, which must be in the queue.
    pub fn remove(&mut self, block: BlockId) {
        let b = block as usize;
        let (p, n) = (self.prev[b], self.next[b]);
        debug_assert!(
            p != NONE && n != NONE,
            "block {block} is not in the free queue"
        );
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.prev[b] = NONE;
        self.next[b] = NONE;
        self.len -= 1;
    }

    pub fn push_back(&mut self, block: BlockId) {
        let last = self.prev[self.tail as usize];
        self.link_between(block, last, self.tail);
    }

    /// Puts `blocks` at the head keeping their order: `blocks[0]` becomes the
    /// new head.
    pub fn prepend_n(&mut self, blocks: &[BlockId]) {
        let mut after = self.head;
        for &b in blocks {
            let before = self.next[after as usize];
            self.link_between(b, after, before);
            after = b;
        }
    }

    pub fn append_n(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.push_back(b);
        }
    }

    fn link_between(&mut self, block: BlockId, before: u32, after: u32) {
        let b = block as usize;
        debug_assert!(
            self.next[b] == NONE,
            "block {block} is already in the free queue"
        );
        self.prev[b] = before;
        self.next[b] = after;
        self.next[before as usize] = block;
        self.prev[after as usize] = block;
        self.len += 1;
    }

    /// Blocks from head to tail.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.next[self.head as usize];
        std::iter::from_fn(move || {
            if cur == self.tail {
                None
            } else {
                let b = cur;
                cur = self.next[cur as usize];
                Some(b)
            }
        })
    }

    /// Walks the list both ways and checks the links agree, there are no
    /// duplicates, and the length matches. For tests and debug checks.
    pub fn check_consistency(&self) -> Result<(), String> {
        let forward: Vec<BlockId> = self.iter().collect();
        if forward.len() != self.len {
            return Err(format!(
                "forward walk {} != len {}",
                forward.len(),
                self.len
            ));
        }
        let mut backward = Vec::with_capacity(self.len);
        let mut cur = self.prev[self.tail as usize];
        while cur != self.head {
            if backward.len() > self.len {
                return Err("backward walk does not terminate".into());
            }
            backward.push(cur);
            cur = self.prev[cur as usize];
        }
        backward.reverse();
        if backward != forward {
            return Err("forward and backward links disagree".into());
        }
        let mut seen = vec![false; self.prev.len()];
        for &b in &forward {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("block {b} appears twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepend_keeps_list_order_and_append_goes_to_tail() {
        let mut q = FreeBlockQueue::new(10, 1..4).unwrap();
        q.prepend_n(&[7, 8]);
        q.append_n(&[9, 5]);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![7, 8, 1, 2, 3, 9, 5]);
        q.remove(2);
        assert_eq!(q.pop_front(), Some(7));
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![8, 1, 3, 9, 5]);
        assert_eq!(q.len(), 5);
        assert!(!q.contains(2) && q.contains(3));
        q.check_consistency().unwrap();
    }

    #[test]
    fn empty_queue_pops_nothing() {
        let mut q = FreeBlockQueue::new(3, std::iter::empty()).unwrap();
        assert!(q.is_empty());
        assert_eq!(q.pop_front(), None);
        q.push_back(2);
        assert_eq!(q.pop_front(), Some(2));
        q.check_consistency().unwrap();
    }

    #[test]
    fn capacities_past_the_u32_links_are_refused() {
        assert!(FreeBlockQueue::new(u32::MAX as usize - 1, std::iter::empty()).is_err());
        assert!(FreeBlockQueue::new(usize::MAX, std::iter::empty()).is_err());
    }
}
