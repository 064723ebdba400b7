//! The response store behind `store: true`, `previous_response_id`,
//! `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: in
//! memory, bounded in entries and in age.
//!
//! Promises: at most `max_entries` responses are kept (a finished one goes
//! first, the oldest first; responses still running are never dropped, the
//! engine bounds how many there are); a finished response is forgotten
//! `max_age` after it finished; `max_entries: 0` keeps nothing (every
//! `previous_response_id` is then a 404). Each entry holds the response
//! object as a client reads it and the conversation it ended (the chat
//! messages a follow-up continues from).

use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The store's bounds (`--responses-store-max-entries`,
/// `--responses-store-max-age`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLimits {
    pub max_entries: usize,
    pub max_age: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_entries: 1024,
            max_age: Duration::from_secs(3600),
        }
    }
}

struct Entry {
    response: Value,
    /// The conversation up to and including this response's output (chat
    /// messages, without `instructions`, which a follow-up does not keep).
    history: Vec<Value>,
    /// While it runs: the cancel signal.
    cancel: Option<watch::Sender<bool>>,
    finished_at: Option<Instant>,
    /// Insertion order, for eviction.
    seq: u64,
}

/// What `get` finds.
pub struct Stored {
    pub response: Value,
    pub history: Vec<Value>,
    pub running: bool,
}

pub struct Store {
    limits: StoreLimits,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    next_seq: u64,
}

/// Why a cancel did nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum CancelError {
    NotFound,
    /// Finished already, with this status.
    NotRunning(String),
}

impl Store {
    pub fn new(limits: StoreLimits) -> Self {
        Store {
            limits,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.limits.max_entries > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere never leaves an entry half-written: recover.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expire(&self, inner: &mut Inner, now: Instant) {
        let max_age = self.limits.max_age;
        inner.entries.retain(|_, e| {
            e.finished_at
                .is_none_or(|t| now.duration_since(t) < max_age)
        });
    }

    /// Makes room for one more: drops finished entries, oldest first.
    fn make_room(&self, inner: &mut Inner) {
        while inner.entries.len() >= self.limits.max_entries {
            let oldest = inner
                .entries
                .iter()
                .filter(|(_, e)| e.finished_at.is_some())
                .min_by_key(|(_, e)| e.seq)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    inner.entries.remove(&k);
                }
                None => break,
            }
        }
    }

    /// Registers a running response (`update_running` gives what it shows
    /// while it runs); returns the signal that tells it it was cancelled.
    pub fn start(&self, id: &str) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        if !self.enabled() {
            return rx;
        }
        let mut inner = self.lock();
        self.expire(&mut inner, Instant::now());
        self.make_room(&mut inner);
        let seq = inner.next_seq;
        inner.next_seq += 1;
        inner.entries.insert(
            id.to_string(),
            Entry {
                response: Value::Null,
                history: Vec::new(),
                cancel: Some(tx),
                finished_at: None,
                seq,
            },
        );
        rx
    }

    /// Records a finished response: kept when `keep` (the request's
    /// `store`), dropped otherwise (it was held only while it ran).
    pub fn finish(&self, id: &str, response: Value, history: Vec<Value>, keep: bool) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.lock();
        if !keep {
            inner.entries.remove(id);
            return;
        }
        let now = Instant::now();
        self.expire(&mut inner, now);
        let seq = match inner.entries.get(id) {
            Some(e) => e.seq,
            None => {
                self.make_room(&mut inner);
                inner.next_seq += 1;
                inner.next_seq - 1
            }
        };
        inner.entries.insert(
            id.to_string(),
            Entry {
                response,
                history,
                cancel: None,
                finished_at: Some(now),
                seq,
            },
        );
    }

    /// Updates what a running response shows (`GET` while it runs).
    pub fn update_running(&self, id: &str, snapshot: Value) {
        if let Some(e) = self.lock().entries.get_mut(id) {
            if e.cancel.is_some() {
                e.response = snapshot;
            }
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut inner = self.lock();
        self.expire(&mut inner, Instant::now());
        inner.entries.get(id).map(|e| Stored {
            response: e.response.clone(),
            history: e.history.clone(),
            running: e.cancel.is_some(),
        })
    }

    pub fn delete(&self, id: &str) -> bool {
        self.lock().entries.remove(id).is_some()
    }

    /// Signals a running response to stop.
    pub fn cancel(&self, id: &str) -> Result<(), CancelError> {
        let mut inner = self.lock();
        self.expire(&mut inner, Instant::now());
        let e = inner.entries.get(id).ok_or(CancelError::NotFound)?;
        match &e.cancel {
            Some(tx) => {
                let _ = tx.send(true);
                Ok(())
            }
            None => Err(CancelError::NotRunning(
                e.response["status"]
                    .as_str()
                    .unwrap_or("completed")
                    .to_string(),
            )),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store(max_entries: usize, max_age: Duration) -> Store {
        Store::new(StoreLimits {
            max_entries,
            max_age,
        })
    }

    #[test]
    fn the_oldest_finished_response_goes_first_and_running_ones_stay() {
        let s = store(2, Duration::from_secs(60));
        let _a = s.start("a");
        s.finish("b", json!({"status": "completed"}), vec![], true);
        s.finish("c", json!({"status": "completed"}), vec![], true);
        // Full: "b" (finished, oldest) made room for "c"; "a" runs on.
        assert!(s.get("a").is_some_and(|e| e.running));
        assert!(s.get("b").is_none());
        assert!(s.get("c").is_some());
        assert_eq!(s.len(), 2);
        // Nothing finished to drop: a running one is kept over the bound.
        let _d = s.start("d");
        assert_eq!(s.len(), 2, "c was dropped for d");
        let _e = s.start("e");
        assert_eq!(s.len(), 3, "running responses are never dropped");
    }

    #[test]
    fn a_finished_response_expires_and_a_running_one_does_not() {
        let s = store(8, Duration::from_millis(30));
        let _run = s.start("run");
        s.finish("done", json!({"status": "completed"}), vec![json!(1)], true);
        assert_eq!(s.get("done").unwrap().history, vec![json!(1)]);
        std::thread::sleep(Duration::from_millis(60));
        assert!(s.get("done").is_none());
        assert!(s.get("run").is_some());
    }

    #[test]
    fn cancel_signals_only_running_responses() {
        let s = store(8, Duration::from_secs(60));
        let rx = s.start("r");
        assert_eq!(s.cancel("r"), Ok(()));
        assert!(*rx.borrow());
        s.finish("r", json!({"status": "cancelled"}), vec![], true);
        assert_eq!(
            s.cancel("r"),
            Err(CancelError::NotRunning("cancelled".into()))
        );
        assert_eq!(s.cancel("x"), Err(CancelError::NotFound));
        // store: false: held while it ran, gone once finished.
        let _rx = s.start("t");
        s.finish("t", json!({}), vec![], false);
        assert!(s.get("t").is_none());
        // A store of size 0 keeps nothing.
        let off = store(0, Duration::from_secs(60));
        let _rx = off.start("a");
        off.finish("a", json!({}), vec![], true);
        assert!(off.get("a").is_none());
    }
}
