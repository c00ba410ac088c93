//! The I/O pool: a bounded set of threads that run procedures (the file system calls of
//! an NFS server) for every transport, fairly between clients.
//!
//! The transports' own threads (the TCP reactor, the RPC-over-RDMA Responder's workers)
//! only move messages: they hand each decoded Call to [`IoPool::submit`] under a client
//! key (one per connection) and send the Reply when the job reports back. A procedure
//! that blocks in the kernel (an `fsync` on a stalled disk, a `pwrite` to a frozen file
//! system) then holds one pool thread, never a transport thread and so never the other
//! connections.
//!
//! # Resource model
//!
//! * **Threads**: [`PoolConfig::threads`], fixed, started at once; no thread per
//!   connection or per call.
//! * **Fairness**: every client has its own FIFO queue; free threads take the next job
//!   from the clients in round-robin order, so a client with 32 Calls queued and a client
//!   with one are served alternately. A client runs at most
//!   [`PoolConfig::per_client`] jobs at once (default: half the threads), so a client whose
//!   every call blocks holds at most that many threads and the others keep the rest.
//! * **Groups**: every job also names a group, the thing its calls may block on together:
//!   the transports use their [`Registry`](crate::server::Registry), which for the NFS
//!   server is one export, and an export never crosses into another file system. A group
//!   runs at most [`PoolConfig::per_group`] jobs at once (default: three quarters of the
//!   threads), so when a disk stalls, all the clients of the export on it together hold at
//!   most that many threads, and the other exports sharing the pool keep the rest.
//! * **Wake-ups**: an idle thread parks on its own condition variable, and a submitted job
//!   wakes the thread that went idle last (a stack, not a queue): a caller making one call
//!   at a time is served by one warm thread (its stack, its malloc arena, the cache of the
//!   CPU it last ran on) instead of each of the threads in turn; the others stay asleep.
//! * **Queue**: the pool does not bound its queues itself; the submitters do, before
//!   they submit: the Responder by its credits (a Requester has at most `credits` Calls
//!   outstanding per connection, and their receive buffers are not posted again until the
//!   Call is taken), the TCP server by `max_calls_in_flight` per connection (the connection
//!   is not read while at the limit). Both charge the bytes of the Calls queued here to
//!   their memory budgets.

use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The pool group of the calls of `registry` (the transports' choice: one group per
/// registry, which for the NFS server is one export on one file system).
pub fn group_of(registry: &Arc<crate::server::Registry>) -> u64 {
    Arc::as_ptr(registry) as usize as u64
}

/// A client key no other caller of this function gets (the RPC-over-RDMA Responder's,
/// one per connection, whatever server it belongs to); they do not meet the TCP
/// server's keys, which stay below 2^63.
pub fn fresh_client_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    (1 << 63) | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A job: runs once on a pool thread and reports its result itself.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The size of an [`IoPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Threads (at least 1).
    pub threads: usize,
    /// Jobs of one client running at once (at least 1).
    pub per_client: usize,
    /// Jobs of one group running at once (at least 1).
    pub per_group: usize,
}

impl PoolConfig {
    /// `threads` threads, a client using at most half of them and a group three quarters
    /// (at least one each).
    pub fn with_threads(threads: usize) -> Self {
        let threads = threads.max(1);
        PoolConfig {
            threads,
            per_client: (threads / 2).max(1),
            per_group: (threads * 3 / 4).max(1),
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self::with_threads(8)
    }
}

/// Emptied client queues a pool keeps for reuse ([`State::spare`]).
const SPARE_QUEUES: usize = 16;
/// The largest emptied queue kept (a client that queued many jobs at once gives its
/// memory back).
const SPARE_CAPACITY: usize = 64;

#[derive(Default)]
struct State {
    /// Each client's queued jobs, with their groups.
    queues: HashMap<u64, VecDeque<(u64, Job)>>,
    /// Emptied queues kept for the next client that queues a job (at most [`SPARE_QUEUES`]):
    /// a client with one call at a time empties its queue with every job, and a fresh
    /// `VecDeque` allocated on its next submit (issue 18, session 16).
    spare: Vec<VecDeque<(u64, Job)>>,
    /// Clients with queued jobs, in the order they are served.
    ring: VecDeque<u64>,
    /// Jobs running per client.
    running: HashMap<u64, usize>,
    /// Jobs running per group.
    group_running: HashMap<u64, usize>,
    queued: usize,
    stop: bool,
    /// Parked threads, the one that parked last on top.
    idle: Vec<usize>,
    /// Per thread: on `idle` (cleared by whoever wakes it).
    parked: Vec<bool>,
    /// Per thread: jobs run (the wake-up order's counter).
    ran: Vec<u64>,
}

impl State {
    /// Wake the thread that parked last, if any (call with the lock held; the thread
    /// checks for work once it has the lock).
    fn wake_one(&mut self, inner: &Inner) {
        if let Some(t) = self.idle.pop() {
            self.parked[t] = false;
            inner.wake[t].notify_one();
        }
    }
}

struct Inner {
    state: Mutex<State>,
    /// One condition variable per thread (see [`State::idle`]).
    wake: Vec<Condvar>,
    cfg: PoolConfig,
}

/// A counter snapshot of an [`IoPool`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolLoad {
    /// Jobs waiting for a thread.
    pub queued: usize,
    /// Jobs running.
    pub running: usize,
}

/// A fair, bounded pool of I/O threads (see the module's resource model). Dropping it
/// stops the threads once their current jobs return; queued jobs are dropped unrun.
pub struct IoPool {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for IoPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoPool")
            .field("cfg", &self.inner.cfg)
            .field("load", &self.load())
            .finish()
    }
}

impl IoPool {
    /// Start the pool's threads (named `{name}-{i}`).
    pub fn new(name: &str, cfg: PoolConfig) -> std::io::Result<Arc<IoPool>> {
        let cfg = PoolConfig {
            threads: cfg.threads.max(1),
            per_client: cfg.per_client.max(1),
            per_group: cfg.per_group.max(1),
        };
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                parked: vec![false; cfg.threads],
                ran: vec![0; cfg.threads],
                ..State::default()
            }),
            wake: (0..cfg.threads).map(|_| Condvar::new()).collect(),
            cfg,
        });
        let mut threads = Vec::with_capacity(cfg.threads);
        for i in 0..cfg.threads {
            let mine = inner.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || run(&mine, i));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // stop the ones already started
                    drop(IoPool { inner, threads });
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(IoPool { inner, threads }))
    }

    /// The pool's size.
    pub fn config(&self) -> PoolConfig {
        self.inner.cfg
    }

    /// Queue `job` for `client` (any key that tells clients apart, e.g. one per
    /// connection) in `group` (what its calls may block on together, e.g. one per export).
    /// It runs after the client's earlier jobs have started.
    pub fn submit(&self, client: u64, group: u64, job: Job) {
        let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.stop {
            return;
        }
        let st = &mut *s;
        let q = st
            .queues
            .entry(client)
            .or_insert_with(|| st.spare.pop().unwrap_or_default());
        q.push_back((group, job));
        if q.len() == 1 {
            s.ring.push_back(client);
        }
        s.queued += 1;
        s.wake_one(&self.inner);
    }

    /// Jobs queued and running now.
    pub fn load(&self) -> PoolLoad {
        let s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        PoolLoad {
            queued: s.queued,
            running: s.running.values().sum(),
        }
    }

    /// Jobs run so far by each thread (index `i` is the thread named `{name}-{i}`).
    pub fn jobs_per_thread(&self) -> Vec<u64> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).ran.clone()
    }

    /// Threads parked now (waiting for a job).
    pub fn idle_threads(&self) -> usize {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).idle.len()
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        {
            let mut s = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            s.stop = true;
            s.queues.clear();
            s.spare.clear();
            s.ring.clear();
            s.queued = 0;
            s.idle.clear();
            s.parked.iter_mut().for_each(|p| *p = false);
        }
        for c in &self.inner.wake {
            c.notify_all();
        }
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            // the last reference may go away inside a job (it owned a server)
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

/// The next job a thread may run: the first client in ring order below its running
/// limit; that client goes to the back of the ring if it has more.
fn next(s: &mut State, cfg: &PoolConfig) -> Option<(u64, u64, Job)> {
    for _ in 0..s.ring.len() {
        let c = s.ring.pop_front()?;
        let group = s.queues.get(&c).and_then(|q| q.front()).map(|j| j.0)?;
        if s.running.get(&c).copied().unwrap_or(0) >= cfg.per_client
            || s.group_running.get(&group).copied().unwrap_or(0) >= cfg.per_group
        {
            s.ring.push_back(c);
            continue;
        }
        let q = s.queues.get_mut(&c)?;
        let (_, job) = q.pop_front()?;
        if q.is_empty() {
            if let Some(q) = s.queues.remove(&c)
                && s.spare.len() < SPARE_QUEUES
                && q.capacity() <= SPARE_CAPACITY
            {
                s.spare.push(q);
            }
        } else {
            s.ring.push_back(c);
        }
        s.queued -= 1;
        *s.running.entry(c).or_default() += 1;
        *s.group_running.entry(group).or_default() += 1;
        return Some((c, group, job));
    }
    None
}

fn run(inner: &Inner, me: usize) {
    let mut s = inner.state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if s.stop {
            return;
        }
        let Some((client, group, job)) = next(&mut s, &inner.cfg) else {
            if !s.parked[me] {
                s.parked[me] = true;
                s.idle.push(me);
            }
            s = inner.wake[me].wait(s).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        if s.parked[me] {
            // woken spuriously with work queued: no longer idle
            s.parked[me] = false;
            s.idle.retain(|&t| t != me);
        }
        s.ran[me] += 1;
        drop(s);
        // a panicking procedure must not take the pool thread (and its running count) with it
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            tracing::error!(client, "io pool: a job panicked");
        }
        s = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *s;
        for (map, key) in [(&mut st.running, client), (&mut st.group_running, group)] {
            if let Some(n) = map.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        // the client may be below its limit again: other threads may take its next jobs
        // (this one looks for work itself before it parks)
        for _ in 1..s.queued.min(s.idle.len() + 1) {
            s.wake_one(inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    /// `n` reaches `want` and stays there.
    fn settles_at(n: &AtomicUsize, want: usize, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while n.load(Ordering::SeqCst) < want && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(n.load(Ordering::SeqCst), want, "{what}");
    }

    /// Issue 17 ("without one slow client or disk holding others up"): a client whose
    /// jobs all block holds at most `per_client` threads; another client's job runs.
    #[test]
    fn a_blocked_client_holds_at_most_its_share() {
        let pool = IoPool::new("t-pool", PoolConfig::with_threads(4)).unwrap();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let started = Arc::new(AtomicUsize::new(0));
        for _ in 0..10 {
            let (g, st) = (gate.clone(), started.clone());
            pool.submit(
                1,
                0,
                Box::new(move || {
                    st.fetch_add(1, Ordering::SeqCst);
                    let (m, c) = &*g;
                    let mut open = m.lock().unwrap();
                    while !*open {
                        open = c.wait(open).unwrap();
                    }
                }),
            );
        }
        let (tx, rx) = channel();
        pool.submit(2, 0, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("client 2 ran while client 1 was blocked");
        settles_at(&started, 2, "client 1 runs only its share");
        assert_eq!(pool.load(), PoolLoad { queued: 8, running: 2 });
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while pool.load() != PoolLoad::default() {
            assert!(std::time::Instant::now() < deadline, "{:?}", pool.load());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(started.load(Ordering::SeqCst), 10);
    }

    /// Round robin: with one thread, a flood of one client and another client's jobs
    /// alternate rather than running in arrival order.
    #[test]
    fn clients_are_served_in_turn() {
        let pool = IoPool::new(
            "t-pool",
            PoolConfig {
                threads: 1,
                per_client: 1,
                per_group: 1,
            },
        )
        .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (hold_tx, hold_rx) = channel::<()>();
        // occupy the thread while both clients queue
        pool.submit(
            9,
            0,
            Box::new(move || {
                let _ = hold_rx.recv_timeout(Duration::from_secs(5));
            }),
        );
        for i in 0..4 {
            let o = order.clone();
            pool.submit(1, 0, Box::new(move || o.lock().unwrap().push((1, i))));
        }
        for i in 0..2 {
            let o = order.clone();
            pool.submit(2, 0, Box::new(move || o.lock().unwrap().push((2, i))));
        }
        hold_tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while order.lock().unwrap().len() < 6 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            *order.lock().unwrap(),
            vec![(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (1, 3)]
        );
    }

    /// A stalled disk: many clients of one group (an export on a frozen file system) hold
    /// at most `per_group` threads together; another group's client runs.
    #[test]
    fn a_blocked_group_holds_at_most_its_share() {
        let pool = IoPool::new("t-pool", PoolConfig::with_threads(4)).unwrap();
        let (open_tx, open_rx) = channel::<()>();
        let open_rx = Arc::new(Mutex::new(open_rx));
        let started = Arc::new(AtomicUsize::new(0));
        for client in 1..=6 {
            let (o, st) = (open_rx.clone(), started.clone());
            pool.submit(
                client,
                7,
                Box::new(move || {
                    st.fetch_add(1, Ordering::SeqCst);
                    let _ = o.lock().unwrap().recv();
                }),
            );
        }
        let (tx, rx) = channel();
        pool.submit(100, 8, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(5))
            .expect("group 8 ran while group 7 was blocked");
        settles_at(&started, 3, "group 7 runs only its share");
        drop(open_tx);
    }

    /// Idle threads until all `n` are parked.
    fn all_parked(pool: &IoPool, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.idle_threads() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {n} parked",
                pool.idle_threads()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Issue 18 (one caller's 1 MiB READs): calls made one at a time, each submitted when
    /// every thread is parked, run on one thread, the one that parked last, not on each
    /// thread in turn (decided by the pool's wake-up order, not by the scheduler: the
    /// thread that ran a job parks after the others).
    #[test]
    fn one_call_at_a_time_runs_on_one_warm_thread() {
        let pool = IoPool::new("t-pool", PoolConfig::with_threads(8)).unwrap();
        for i in 0..40 {
            all_parked(&pool, 8);
            let (tx, rx) = channel();
            pool.submit(1, 0, Box::new(move || tx.send(i).unwrap()));
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), i);
        }
        all_parked(&pool, 8);
        let ran = pool.jobs_per_thread();
        assert_eq!(ran.iter().sum::<u64>(), 40);
        assert_eq!(ran.iter().filter(|&&n| n > 0).count(), 1, "jobs per thread: {ran:?}");
        // jobs that do overlap still spread over the threads
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let started = Arc::new(AtomicUsize::new(0));
        for c in 0..4u64 {
            let (g, st) = (gate.clone(), started.clone());
            pool.submit(
                10 + c,
                0,
                Box::new(move || {
                    st.fetch_add(1, Ordering::SeqCst);
                    let (m, cv) = &*g;
                    let mut open = m.lock().unwrap();
                    while !*open {
                        open = cv.wait(open).unwrap();
                    }
                }),
            );
        }
        settles_at(&started, 4, "four blocking jobs run at once");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        all_parked(&pool, 8);
        let busy = pool.jobs_per_thread().iter().filter(|&&n| n > 0).count();
        assert!(busy >= 4, "{:?}", pool.jobs_per_thread());
    }

    #[test]
    fn a_panicking_job_does_not_take_the_thread() {
        let pool = IoPool::new("t-pool", PoolConfig::with_threads(1)).unwrap();
        pool.submit(1, 0, Box::new(|| panic!("test panic")));
        let (tx, rx) = channel();
        pool.submit(1, 0, Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
    }
}
