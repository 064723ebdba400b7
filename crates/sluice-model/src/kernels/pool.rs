//! The kernel thread pool: persistent workers with spin-then-park waiting.
//!
//! Owns: the process-wide worker threads behind `parallel_for`. Promises:
//! - `run(threads, n, f)` calls `f(i)` exactly once for every `i in 0..n`
//!   and returns only after all calls finished (so `f` may borrow the
//!   caller's stack); the calling thread takes part.
//! - Work is handed out one index at a time from a shared counter, so a
//!   core stolen by another process only slows its own share.
//! - Never deadlocks on reentry: a `parallel_for` inside a task, or one from
//!   a second thread while the pool is busy, runs serially on its caller.
//! - A panic in a task is re-raised on the caller after every worker left
//!   the job.
//!
//! Why not rayon: a decode step issues ~170 matmuls; a fork-join costing
//! 5-10 µs each would cost 1-2 ms per token. Here a dispatch is one atomic
//! store plus (when workers are awake) a cache-line transfer, well under a
//! microsecond; workers spin for `SPIN` before parking so back-to-back
//! matmuls of one forward pass never pay a futex wake-up.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(500);

/// Upper bound on threads, a guard against absurd requests.
const MAX_THREADS: usize = 256;

/// A task body with its lifetime erased; see `Job`.
type TaskFn = dyn Fn(usize) + Sync;

/// One `run` call, living on the caller's stack.
struct Job {
    /// SAFETY contract: points to the caller's closure, which outlives every
    /// use because the caller does not return while a worker is inside the
    /// job (`Pool::active`).
    func: *const TaskFn,
    n: usize,
    next: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job {
    /// Claims and runs indices until none are left.
    fn work(&self) {
        // SAFETY: see `func`: the closure is alive while a worker is inside.
        let f = unsafe { &*self.func };
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            f(i);
        }
    }
}

struct Worker {
    sleeping: AtomicBool,
    thread: Thread,
}

struct Pool {
    /// `epoch << 16 | helpers`: a new job bumps the epoch; workers with index
    /// `< helpers` must join it, the others ignore it.
    state: AtomicU64,
    /// The current job. Only dereferenced by a worker that entered it (see
    /// `open`), and the job cannot end nor be replaced before it leaves.
    job: AtomicPtr<Job>,
    /// Whether `job` may be entered. Entering is `active += 1`, then
    /// checking `open`; the submitter closes (`open = false`) once every
    /// index is claimed and then waits for `active == 0`. With SeqCst on
    /// both sides either the worker sees the job closed and backs out, or
    /// the submitter sees it inside and waits: a worker that wakes late
    /// never delays the caller, and never touches a finished job.
    open: AtomicBool,
    /// Workers inside the current job.
    active: AtomicUsize,
    /// Held by the thread submitting a job; a contender runs serially.
    busy: AtomicBool,
    workers: Mutex<Vec<Arc<Worker>>>,
}

static POOL: OnceLock<Pool> = OnceLock::new();
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on pool workers, so a nested `run` goes serial without touching
    /// the `busy` flag.
    static IN_WORKER: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| Pool {
        state: AtomicU64::new(0),
        job: AtomicPtr::new(std::ptr::null_mut()),
        open: AtomicBool::new(false),
        active: AtomicUsize::new(0),
        busy: AtomicBool::new(false),
        workers: Mutex::new(Vec::new()),
    })
}

fn default_threads() -> usize {
    if let Some(n) = std::env::var("SLUICE_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return n.min(MAX_THREADS);
    }
    thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
}

/// Sets the number of kernel threads, the caller included (`0` restores the
/// default: `SLUICE_NUM_THREADS`, else the machine's available cores).
pub fn set_num_threads(n: usize) {
    let n = if n == 0 {
        default_threads()
    } else {
        n.min(MAX_THREADS)
    };
    THREADS.store(n, Ordering::Relaxed);
}

/// The number of kernel threads, the caller included.
pub fn num_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => {
            let n = default_threads();
            // A concurrent `set_num_threads` wins over the default.
            let _ = THREADS.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed);
            THREADS.load(Ordering::Relaxed)
        }
        n => n,
    }
}

/// Runs `f(i)` for `i in 0..n` on up to `threads` threads (the caller is one
/// of them).
pub fn run(threads: usize, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let helpers = threads.clamp(1, MAX_THREADS).min(n).saturating_sub(1);
    if helpers == 0 || IN_WORKER.with(Cell::get) {
        (0..n).for_each(f);
        return;
    }
    let pool = pool();
    if pool
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        // Another thread owns the pool (or this one, from inside a task).
        (0..n).for_each(f);
        return;
    }
    let _busy = BusyGuard(&pool.busy);

    let workers = ensure_workers(pool, helpers);
    // Fewer workers than asked for if spawning failed.
    let helpers = helpers.min(workers.len());
    if helpers == 0 {
        drop(workers);
        (0..n).for_each(f);
        return;
    }
    // SAFETY: only the lifetime is erased; `job` does not outlive this
    // function, which waits until no worker uses it any more.
    let func: *const TaskFn =
        unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static TaskFn>(f) };
    let job = Job {
        func,
        n,
        next: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    pool.job
        .store(&job as *const Job as *mut Job, Ordering::SeqCst);
    pool.open.store(true, Ordering::SeqCst);
    let epoch = (pool.state.load(Ordering::Relaxed) >> 16) + 1;
    pool.state
        .store(epoch << 16 | helpers as u64, Ordering::SeqCst);
    for w in &workers[..helpers] {
        // SeqCst pairs with the worker's `sleeping` store / `state` re-check:
        // either it sees the new state or we see it asleep and wake it.
        if w.sleeping.swap(false, Ordering::SeqCst) {
            w.thread.unpark();
        }
    }
    drop(workers);

    let mine = catch_unwind(AssertUnwindSafe(|| job.work()));
    // Nobody may claim more work once we stopped (only matters after a
    // panic of ours); close the job, then wait for the workers inside it.
    job.next.store(n, Ordering::Relaxed);
    pool.open.store(false, Ordering::SeqCst);
    let start = Instant::now();
    let mut spins = 0u32;
    while pool.active.load(Ordering::SeqCst) != 0 {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && start.elapsed() > SPIN {
            // A helper was descheduled (busy machine): give it the core.
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    pool.job.store(std::ptr::null_mut(), Ordering::Relaxed);
    if let Err(p) = mine {
        resume_unwind(p);
    }
    let worker_panic = job
        .panic
        .lock()
        .map(|mut g| g.take())
        .unwrap_or_else(|e| e.into_inner().take());
    if let Some(p) = worker_panic {
        resume_unwind(p);
    }
}

struct BusyGuard<'a>(&'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Locks the worker list, spawning workers until there are `helpers` (or
/// spawning fails).
fn ensure_workers(pool: &'static Pool, helpers: usize) -> MutexGuard<'static, Vec<Arc<Worker>>> {
    let mut ws = pool.workers.lock().unwrap_or_else(|e| e.into_inner());
    while ws.len() < helpers {
        let index = ws.len();
        // The epoch the new worker starts from must be read here, under the
        // `busy` flag, before the job that needs it is published: read on the
        // new thread it could already include that job, which would then
        // wait for the worker forever.
        let seen = pool.state.load(Ordering::Acquire) >> 16;
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Worker>>();
        let spawned = thread::Builder::new()
            .name(format!("sluice-kernel-{}", index + 1))
            .spawn(move || {
                if let Ok(me) = rx.recv() {
                    worker_loop(pool, index, seen, &me);
                }
            });
        match spawned {
            Ok(handle) => {
                let w = Arc::new(Worker {
                    sleeping: AtomicBool::new(false),
                    thread: handle.thread().clone(),
                });
                // The worker only starts once it has its own record.
                let _ = tx.send(Arc::clone(&w));
                ws.push(w);
            }
            Err(e) => {
                // Cannot grow: run with the workers we have.
                eprintln!("sluice: cannot spawn kernel thread: {e}");
                break;
            }
        }
    }
    ws
}

fn worker_loop(pool: &'static Pool, index: usize, mut seen: u64, me: &Worker) {
    IN_WORKER.with(|c| c.set(true));
    loop {
        let state = wait_for_new_epoch(pool, seen, me);
        seen = state >> 16;
        let helpers = (state & 0xffff) as usize;
        if index >= helpers {
            continue;
        }
        pool.active.fetch_add(1, Ordering::SeqCst);
        if !pool.open.load(Ordering::SeqCst) {
            // Finished without us (or not yet published): back out.
            pool.active.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let job = pool.job.load(Ordering::SeqCst);
        debug_assert!(!job.is_null());
        // SAFETY: this worker entered an open job (see `Pool::open`): its
        // submitter is blocked in `run` until `active` drops to 0, so `job`
        // points to its live `Job`, published before `open` was set.
        let job = unsafe { &*job };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| job.work())) {
            job.next.store(job.n, Ordering::Relaxed);
            if let Ok(mut slot) = job.panic.lock() {
                slot.get_or_insert(p);
            }
        }
        // After this the job may be gone: touch nothing of it.
        pool.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Spins, then parks, until the pool's epoch differs from `seen`; returns the
/// new state.
fn wait_for_new_epoch(pool: &Pool, seen: u64, me: &Worker) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let s = pool.state.load(Ordering::Acquire);
        if s >> 16 != seen {
            return s;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(256) || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        me.sleeping.store(true, Ordering::SeqCst);
        loop {
            let s = pool.state.load(Ordering::SeqCst);
            if s >> 16 != seen {
                me.sleeping.store(false, Ordering::Relaxed);
                return s;
            }
            thread::park();
        }
    }
}
