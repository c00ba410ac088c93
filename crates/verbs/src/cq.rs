//! Completion queues: poll, blocking wait, async wait, and completion events
//! (`ibv_req_notify_cq` / `ibv_get_cq_event`).
//!
//! Progress model: a provider pushes completions from whichever thread made
//! progress (the caller of `post_send`, a `poll` that drove receive progress,
//! or the provider's background thread). `poll` first drains what is there;
//! if nothing is, it asks every QP attached to this CQ to make non-blocking
//! progress once (run-to-completion, so a busy-polling application gets
//! TCP-like latency without a thread hop) and looks again. Blocking waits
//! sleep on a condition variable: an idle CQ costs no CPU.

use crate::types::{WcStatus, WorkCompletion};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Implemented by providers' QPs: make whatever progress is possible without blocking.
pub trait Progress: Send + Sync {
    /// Returns true if anything happened.
    fn progress(&self) -> bool;
    /// The polling thread stops polling and goes to sleep: a provider that
    /// relied on it (busy polling) must make progress on its own again.
    fn parked(&self) {}
    /// Inline waiting (issue 18): a thread about to sleep in [`CompletionQueue::wait`] may
    /// sleep in `poll(2)` on this descriptor (readable: the QP has something to receive)
    /// instead of waiting for the provider's own thread to receive it and wake the waiter
    /// (two thread wake-ups per message where a blocking TCP reader has one). A provider
    /// that returns it stops waking its own thread for what the waiter will read, until
    /// [`wait_done`](Self::wait_done) and a while after. `None` (the default): not
    /// possible now; the waiter sleeps on the condition variable as before.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// The descriptor from [`wait_fd`](Self::wait_fd) polled readable (or hung up): make
    /// progress, as [`progress`](Self::progress) does, without the busy-poll bookkeeping.
    /// Returns false when the descriptor can no longer be slept on (the stream ended, so
    /// it stays readable): the waiter then sleeps on the condition variable.
    fn wait_ready(&self) -> bool {
        self.progress();
        true
    }
    /// The inline waiter that [`wait_fd`](Self::wait_fd) was given to left.
    fn wait_done(&self) {}
    /// The inline waiter found no completion and is about to sleep in `poll(2)` again:
    /// what the provider held back for the waiter's next call (a reply that would leave
    /// with its next post) must leave now, since no call comes before the waiter wakes.
    /// A bulk requester's packets that an ACK let into the window are such (issue 13,
    /// session 13: they waited for the provider thread's 1 ms check).
    fn wait_idle(&self) {}
    /// A thread declares that it busy-polls this QP's CQ from now on
    /// ([`CompletionQueue::declare_spin`]): the provider may stop waking its own thread
    /// for what this thread will receive, at once rather than after a stretch of polls
    /// it has to recognise as busy polling (which a preempted spinner on a shared core
    /// keeps breaking). Declarations nest (one count per declaring thread).
    fn spin_begin(&self) {}
    /// A declaration of [`spin_begin`](Self::spin_begin) ended: once nobody polls or
    /// waits, the provider's own thread must make progress again (within the provider's
    /// idle time; nothing that arrives is left unread).
    fn spin_end(&self) {}
}

/// A declared busy poll of a CQ (see [`CompletionQueue::declare_spin`]): the QPs attached
/// when it began are told when it ends (on drop).
pub struct SpinDeclaration {
    qps: [Option<Weak<dyn Progress>>; MAX_INLINE_QPS],
}

impl Drop for SpinDeclaration {
    fn drop(&mut self) {
        for q in self.qps.iter().flatten().filter_map(Weak::upgrade) {
            q.spin_end();
        }
    }
}

/// Most QPs a CQ's waiter sleeps on inline; a CQ shared by more sleeps on its condition
/// variable (one `poll(2)` over hundreds of sockets would cost more than the hop it saves).
const MAX_INLINE_QPS: usize = 4;

/// The CQ had no room: the provider must move the QP that produced the
/// completion to the error state (RDMAP-SEC-10: only streams on this CQ suffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqOverflow;

#[derive(Default)]
struct State {
    entries: VecDeque<WorkCompletion>,
    overflowed: bool,
    /// Armed for the next completion (`Some(false)`) or next solicited/error one (`Some(true)`).
    armed: Option<bool>,
    events: u32,
    wakers: Vec<Waker>,
    /// Threads asleep on `Inner::cond` (`wait_spin`, `get_event`). std's
    /// `Condvar::notify_all` is a `futex` system call even with nobody
    /// waiting, so `deliver` notifies only when this is non-zero: a
    /// busy-polled CQ costs no system call per completion.
    sleepers: u32,
    /// Times `deliver` notified the condition variable (see [`CompletionQueue::notifies`]).
    notifies: u64,
    /// A thread sleeps in `poll(2)` on the attached QPs' sockets and `Inner::wake_fd`
    /// (an inline wait, [`Progress::wait_fd`]); `deliver` writes the eventfd to wake it.
    inline_sleeper: bool,
}

struct Inner {
    id: u32,
    capacity: usize,
    state: Mutex<State>,
    cond: Condvar,
    attached: Mutex<Vec<Weak<dyn Progress>>>,
    /// Bumped by [`CompletionQueue::interrupt`] (under `state`'s lock, so a waiter checking it
    /// under the lock before it sleeps cannot miss it): a waiter that sees it change returns.
    /// An atomic, so that a wait reads it at its start without taking the lock.
    interrupts: std::sync::atomic::AtomicU64,
    /// The eventfd of inline waits, made at the first one (`None`: could not be made).
    wake_fd: std::sync::OnceLock<Option<crate::waitfd::WakeFd>>,
}

/// A thread's deferred wake-ups (see [`defer_wakeups`]).
struct Deferred {
    /// Inside a [`defer_wakeups`] scope.
    active: std::cell::Cell<bool>,
    /// CQs whose waiters this thread owes a wake-up. Kept between scopes, so a scope
    /// (one per busy poll of an iWARP QP) allocates and frees nothing.
    owed: std::cell::RefCell<Vec<CompletionQueue>>,
}

thread_local! {
    static DEFERRED: Deferred = const {
        Deferred {
            active: std::cell::Cell::new(false),
            owed: std::cell::RefCell::new(Vec::new()),
        }
    };
}

/// Runs `f` with the wake-ups of the completions this thread delivers meanwhile held back
/// until `f` returns (or [`flush_wakeups`]). A provider wraps the work it does under its QP's
/// lock in it, so a thread woken by a completion does not run straight into that lock (issue
/// 18: with `--events` the woken application re-posted its receive while the progress thread
/// still held the QP, slept on the lock and was woken a second time: two more `futex` calls
/// and a second context switch per message). Nested calls join the outer one.
pub(crate) fn defer_wakeups<R>(f: impl FnOnce() -> R) -> R {
    struct Flush;
    impl Drop for Flush {
        fn drop(&mut self) {
            flush_wakeups();
            DEFERRED.with(|d| d.active.set(false));
        }
    }
    if DEFERRED.with(|d| d.active.replace(true)) {
        return f();
    }
    let _flush = Flush;
    f()
}

/// Wakes now the waiters that [`defer_wakeups`] held back so far on this thread (a provider
/// calls it before it blocks or starts a long piece of work, so a wake-up waits only for the
/// end of the current one). Nothing owed (a busy poll's case): no allocation, no wake-up.
pub(crate) fn flush_wakeups() {
    let owed = DEFERRED.with(|d| {
        let mut v = d.owed.borrow_mut();
        if v.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut *v))
        }
    });
    if let Some(owed) = owed {
        owed.iter().for_each(CompletionQueue::wake);
    }
}

/// A completion queue (`ibv_cq`). Cheap to clone; clones share the queue.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<Inner>,
}

static NEXT_CQ: AtomicU32 = AtomicU32::new(1);

impl CompletionQueue {
    /// Creates a CQ holding up to `cqe` completions. Applications call
    /// [`Device::create_cq`](crate::Device::create_cq); providers
    /// [`provider::new_cq`](crate::provider::new_cq).
    pub(crate) fn create(cqe: usize) -> Self {
        CompletionQueue {
            inner: Arc::new(Inner {
                id: NEXT_CQ.fetch_add(1, Ordering::Relaxed),
                capacity: cqe.max(1),
                state: Mutex::new(State::default()),
                cond: Condvar::new(),
                attached: Mutex::new(Vec::new()),
                interrupts: std::sync::atomic::AtomicU64::new(0),
                wake_fd: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The CQ's number, unique in the process (what `IBV_EVENT_CQ_ERR` names).
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Whether two handles name the same CQ.
    pub fn same(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many completions it holds (`cqe` of `ibv_create_cq`).
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Attach a QP so that `poll` can drive its progress
    /// ([`CqProviderExt::attach`](crate::provider::CqProviderExt::attach)).
    pub(crate) fn attach_progress(&self, p: Weak<dyn Progress>) {
        let mut a = self.inner.attached.lock().unwrap();
        a.retain(|w| w.strong_count() > 0);
        a.push(p);
    }

    /// Deliver a completion; wakes blocking and async waiters
    /// ([`CqProviderExt::push`](crate::provider::CqProviderExt::push)), or, inside
    /// [`defer_wakeups`] on this thread, leaves the wake-up for the end of it.
    pub(crate) fn deliver(&self, wc: WorkCompletion) -> Result<(), CqOverflow> {
        let wakers;
        let sleepers;
        let inline;
        let defer = DEFERRED.with(|d| d.active.get());
        {
            let mut s = self.inner.state.lock().unwrap();
            if s.entries.len() >= self.inner.capacity {
                s.overflowed = true;
                return Err(CqOverflow);
            }
            if let Some(solicited_only) = s.armed
                && (!solicited_only || wc.solicited || wc.status != WcStatus::Success)
            {
                s.armed = None;
                s.events += 1;
            }
            s.entries.push_back(wc);
            if defer && (s.sleepers > 0 || s.inline_sleeper || !s.wakers.is_empty()) {
                drop(s);
                DEFERRED.with(|d| {
                    let mut v = d.owed.borrow_mut();
                    if !v.iter().any(|c| c.same(self)) {
                        v.push(self.clone());
                    }
                });
                return Ok(());
            }
            wakers = std::mem::take(&mut s.wakers);
            sleepers = s.sleepers > 0;
            inline = s.inline_sleeper;
            s.notifies += u64::from(sleepers) + u64::from(inline);
        }
        if sleepers {
            self.inner.cond.notify_all();
        }
        if inline {
            self.wake_inline();
        }
        wakers.into_iter().for_each(Waker::wake);
        Ok(())
    }

    /// Writes the inline waiter's eventfd.
    fn wake_inline(&self) {
        if let Some(Some(w)) = self.inner.wake_fd.get() {
            w.wake();
        }
    }

    /// Wakes whoever waits on this CQ (a deferred [`deliver`](Self::deliver)'s wake-up).
    fn wake(&self) {
        let (wakers, sleepers, inline) = {
            let mut s = self.inner.state.lock().unwrap();
            let sleepers = s.sleepers > 0;
            s.notifies += u64::from(sleepers) + u64::from(s.inline_sleeper);
            (std::mem::take(&mut s.wakers), sleepers, s.inline_sleeper)
        };
        if sleepers {
            self.inner.cond.notify_all();
        }
        if inline {
            self.wake_inline();
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    /// How many completions woke a thread asleep in [`wait`](Self::wait),
    /// [`wait_spin`](Self::wait_spin) or [`get_event`](Self::get_event) (a
    /// `futex` or eventfd `write` system call each). A busy-polled CQ makes none,
    /// nor does an inline waiter that received its completion itself: a diagnostic
    /// for tests that count system calls per message.
    pub fn notifies(&self) -> u64 {
        self.inner.state.lock().unwrap().notifies
    }

    /// True once a completion was dropped for lack of room.
    pub fn overflowed(&self) -> bool {
        self.inner.state.lock().unwrap().overflowed
    }

    /// Calls `f` on each attached QP still alive. They are collected first, so
    /// no lock is held while they run; up to four on the stack, so a poll
    /// allocates nothing in the common case.
    fn for_each_attached(&self, mut f: impl FnMut(&dyn Progress)) {
        // One QP (a busy poller's usual CQ): no array to fill and drop per poll.
        let one = {
            let a = self.inner.attached.lock().unwrap();
            match a.as_slice() {
                [q] => Some(q.upgrade()),
                _ => None,
            }
        };
        if let Some(q) = one {
            if let Some(q) = q {
                f(&*q);
            }
            return;
        }
        let mut few: [Option<Arc<dyn Progress>>; 4] = Default::default();
        let mut more = Vec::new();
        {
            let a = self.inner.attached.lock().unwrap();
            for (i, q) in a.iter().filter_map(Weak::upgrade).enumerate() {
                match few.get_mut(i) {
                    Some(slot) => *slot = Some(q),
                    None => more.push(q),
                }
            }
        }
        few.iter().flatten().chain(more.iter()).for_each(|q| f(&**q));
    }

    fn drive_progress(&self) -> bool {
        let mut any = false;
        self.for_each_attached(|q| any |= q.progress());
        any
    }

    fn park_progress(&self) {
        self.for_each_attached(|q| q.parked());
    }

    fn take(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let mut s = self.inner.state.lock().unwrap();
        let n = max.min(s.entries.len());
        out.extend(s.entries.drain(..n));
        n
    }

    /// Declares that this thread busy-polls the CQ (with [`poll`](Self::poll),
    /// [`poll_one`](Self::poll_one) or a spinning [`wait_spin`](Self::wait_spin)) until the
    /// declaration is dropped: "I am polling this until further notice". A provider may then
    /// leave the attached QPs' receive progress to this thread for the whole declaration
    /// (the iWARP provider stops its progress thread's wake-ups for their sockets), instead
    /// of guessing from the rhythm of the polls, a guess a spinner preempted on a shared
    /// core keeps breaking. A declaring thread that sleeps must do so through this CQ's
    /// waits (a parked wait hands the QPs back to the provider's thread; an inline wait
    /// reads them itself). Once dropped, the provider's own progress resumes as after any
    /// busy poll, so nothing is left unread if the spinner goes away. With more QPs
    /// attached than an inline wait takes (four), nothing is declared (the provider keeps
    /// its own busy-poll detection).
    pub fn declare_spin(&self) -> SpinDeclaration {
        let mut qps: [Option<Weak<dyn Progress>>; MAX_INLINE_QPS] = Default::default();
        {
            let a = self.inner.attached.lock().unwrap();
            if a.len() <= MAX_INLINE_QPS {
                for (slot, q) in qps.iter_mut().zip(a.iter()) {
                    *slot = Some(q.clone());
                }
            }
        }
        for q in qps.iter().flatten().filter_map(Weak::upgrade) {
            q.spin_begin();
        }
        SpinDeclaration { qps }
    }

    /// Moves up to `max` completions into `out` (`ibv_poll_cq`); returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let n = self.take(out, max);
        if n > 0 {
            return n;
        }
        if self.drive_progress() {
            return self.take(out, max);
        }
        0
    }

    /// Moves up to `max` completions already queued into `out` without driving the
    /// providers' progress (no receive, no transmission of what a receive deferred: an
    /// ACK waiting to ride with the caller's next post stays deferred); returns how many.
    /// For a thread that has just been handed a completion and collects the rest of the
    /// batch before it acts on them.
    pub fn poll_queued(&self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        self.take(out, max)
    }

    /// One completion if there is one.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        // Like `poll(.., 1)` without a Vec to allocate on every (empty) poll.
        let one = || self.inner.state.lock().unwrap().entries.pop_front();
        if let Some(wc) = one() {
            return Some(wc);
        }
        if self.drive_progress() { one() } else { None }
    }

    /// Busy-polls (driving progress inline) for up to `spin`, then sleeps until a
    /// completion arrives or `timeout` passes. `None` on timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<WorkCompletion> {
        self.wait_spin(Duration::from_micros(50), timeout)
    }

    /// Like [`wait`](Self::wait) with an explicit busy-poll budget (zero: sleep at once).
    ///
    /// When every QP attached to the CQ (at most four) offers it ([`Progress::wait_fd`]),
    /// the thread sleeps in `poll(2)` on their sockets and receives what arrives itself,
    /// as a blocking TCP reader does: one wake-up per completion instead of the
    /// provider's thread waking and then waking this one (issue 18).
    pub fn wait_spin(&self, spin: Duration, timeout: Option<Duration>) -> Option<WorkCompletion> {
        self.wait_spin_since(spin, timeout, self.interrupt_epoch())
    }

    /// How many times [`interrupt`](Self::interrupt) was called so far: taken by a poller
    /// while it holds the lock its application hands the CQ over with, and given to
    /// [`wait_spin_since`](Self::wait_spin_since), an interrupt made after the hand-over
    /// and before the wait began still ends the wait.
    pub fn interrupt_epoch(&self) -> u64 {
        self.inner.interrupts.load(Ordering::Acquire)
    }

    /// [`wait_spin`](Self::wait_spin) that does not sleep if `interrupt` was called since
    /// `epoch` ([`interrupt_epoch`](Self::interrupt_epoch)): it returns a completion already
    /// queued, else `None`.
    pub fn wait_spin_since(&self, spin: Duration, timeout: Option<Duration>, epoch: u64) -> Option<WorkCompletion> {
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let interrupts = epoch;
        if spin.is_zero() {
            // No progress pass first: the inline wait's poll(2) returns at once if a
            // socket has data, so a read that would only say EAGAIN is saved.
            if let Some(wc) = self.pop() {
                return Some(wc);
            }
            if let Some(r) = self.wait_inline(deadline, interrupts) {
                return r;
            }
        }
        loop {
            if let Some(wc) = self.poll_one() {
                return Some(wc);
            }
            if start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        if !spin.is_zero()
            && let Some(r) = self.wait_inline(deadline, interrupts)
        {
            return r;
        }
        self.park_progress();
        let mut s = self.inner.state.lock().unwrap();
        loop {
            if let Some(wc) = s.entries.pop_front() {
                return Some(wc);
            }
            if self.inner.interrupts.load(Ordering::Acquire) != interrupts {
                return None;
            }
            // Sleep until a provider pushes a completion (providers make progress on their
            // own threads once parked) or the deadline passes: no periodic wake-ups, so an
            // idle waiter costs no CPU.
            s = self.sleep(s, deadline)?;
        }
    }

    fn pop(&self) -> Option<WorkCompletion> {
        self.inner.state.lock().unwrap().entries.pop_front()
    }

    /// The inline wait of [`wait_spin`](Self::wait_spin): `None` if it cannot be done
    /// (a QP without [`Progress::wait_fd`], too many QPs, another thread already
    /// waiting inline, no eventfd), else the wait's outcome (`Some(None)`: timed out).
    fn wait_inline(&self, deadline: Option<Instant>, interrupts: u64) -> Option<Option<WorkCompletion>> {
        // Fixed arrays, not `Vec`s: a blocking reader waits here once per message, and
        // two allocations per wait were a tenth of what a 64 B SMC-R round trip allocated
        // (issue 15, session 15).
        let mut held: [Option<Arc<dyn Progress>>; MAX_INLINE_QPS] = Default::default();
        let n = {
            let a = self.inner.attached.lock().unwrap();
            if a.is_empty() || a.len() > MAX_INLINE_QPS {
                return None;
            }
            let mut n = 0;
            for q in a.iter().filter_map(Weak::upgrade) {
                held[n] = Some(q);
                n += 1;
            }
            n
        };
        let wake = self
            .inner
            .wake_fd
            .get_or_init(|| crate::waitfd::WakeFd::new().ok())
            .as_ref()?;
        let qps = &held[..n];
        let mut fd_store = [crate::waitfd::pollfd(-1); MAX_INLINE_QPS + 1];
        for (i, q) in qps.iter().flatten().enumerate() {
            match q.wait_fd() {
                Some(fd) => fd_store[i] = crate::waitfd::pollfd(fd),
                None => {
                    qps[..i].iter().flatten().for_each(|q| q.wait_done());
                    return None;
                }
            }
        }
        fd_store[n] = crate::waitfd::pollfd(wake.raw());
        let fds = &mut fd_store[..=n];
        let qps = || qps.iter().flatten();
        let out = loop {
            {
                let mut s = self.inner.state.lock().unwrap();
                if let Some(wc) = s.entries.pop_front() {
                    break Some(Some(wc));
                }
                if self.inner.interrupts.load(Ordering::Acquire) != interrupts {
                    break Some(None); // interrupted (leader/follower hand-over)
                }
                if s.inline_sleeper {
                    break None; // another thread sleeps inline: this one on the condvar
                }
                s.inline_sleeper = true;
            }
            // After `inline_sleeper` is set: a completion this delivers writes the eventfd,
            // so the poll below returns at once.
            qps().for_each(|q| q.wait_idle());
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()).filter(|t| !t.is_zero()) {
                    Some(t) => Some(t),
                    None => {
                        self.inner.state.lock().unwrap().inline_sleeper = false;
                        break Some(None);
                    }
                },
            };
            let r = crate::waitfd::poll_in(fds, timeout);
            self.inner.state.lock().unwrap().inline_sleeper = false;
            match r {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break None,
            }
            let (last, socks) = fds.split_last_mut().expect("the eventfd is in the set");
            if last.revents != 0 {
                wake.drain();
            }
            last.revents = 0;
            let mut keep = true;
            for (q, f) in qps().zip(socks.iter_mut()) {
                if std::mem::take(&mut f.revents) != 0 {
                    keep &= q.wait_ready();
                }
            }
            if !keep {
                // A stream ended: what it flushed may be queued; if not, the condvar.
                match self.pop() {
                    Some(wc) => break Some(Some(wc)),
                    None => break None,
                }
            }
        };
        qps().for_each(|q| q.wait_done());
        out
    }

    /// Sleeps on the condition variable (counted in `sleepers`, so `deliver`
    /// knows to wake it) until notified or `deadline`; `None` once the
    /// deadline has passed.
    fn sleep<'a>(&self, mut s: MutexGuard<'a, State>, deadline: Option<Instant>) -> Option<MutexGuard<'a, State>> {
        let timeout = match deadline {
            None => None,
            Some(d) => Some(d.checked_duration_since(Instant::now()).filter(|t| !t.is_zero())?),
        };
        s.sleepers += 1;
        let mut s = match timeout {
            None => self.inner.cond.wait(s).unwrap(),
            Some(t) => self.inner.cond.wait_timeout(s, t).unwrap().0,
        };
        s.sleepers -= 1;
        Some(s)
    }

    /// Makes every thread asleep in [`wait`](Self::wait) or [`wait_spin`](Self::wait_spin)
    /// return now (`None` if no completion is there), as if its timeout had passed; a waiter
    /// still spinning returns when it would go to sleep. For an application whose threads take
    /// turns at polling one CQ (leader/follower): the new poller tells the old one to leave.
    /// A `futex` system call only when a thread sleeps.
    pub fn interrupt(&self) {
        let (sleepers, inline) = {
            let s = self.inner.state.lock().unwrap();
            self.inner.interrupts.fetch_add(1, Ordering::AcqRel);
            (s.sleepers > 0, s.inline_sleeper)
        };
        if sleepers {
            self.inner.cond.notify_all();
        }
        if inline {
            self.wake_inline();
        }
    }

    /// Async wait for the next completion (usable from tokio or any executor).
    pub fn next_async(&self) -> NextCompletion<'_> {
        NextCompletion { cq: self }
    }

    /// Arms the CQ (`ibv_req_notify_cq`): the next completion (or with
    /// `solicited_only`, the next solicited or failed one) raises an event.
    pub fn req_notify(&self, solicited_only: bool) {
        let mut s = self.inner.state.lock().unwrap();
        s.armed = Some(solicited_only);
    }

    /// Waits for a completion event raised after `req_notify` (`ibv_get_cq_event`).
    pub fn get_event(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.inner.state.lock().unwrap();
        loop {
            if s.events > 0 {
                s.events -= 1;
                return true;
            }
            match self.sleep(s, deadline) {
                Some(g) => s = g,
                None => return false,
            }
        }
    }

    /// Number of completions waiting.
    pub fn len(&self) -> usize {
        self.inner.state.lock().unwrap().entries.len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CompletionQueue(id {}, {} entries)",
            self.inner.id, self.inner.capacity
        )
    }
}

/// Future returned by [`CompletionQueue::next_async`].
pub struct NextCompletion<'a> {
    cq: &'a CompletionQueue,
}

impl Future for NextCompletion<'_> {
    type Output = WorkCompletion;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WorkCompletion> {
        if let Some(wc) = self.cq.poll_one() {
            return Poll::Ready(wc);
        }
        let mut s = self.cq.inner.state.lock().unwrap();
        if let Some(wc) = s.entries.pop_front() {
            return Poll::Ready(wc);
        }
        if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            s.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WcOpcode;

    fn wc(id: u64, solicited: bool) -> WorkCompletion {
        WorkCompletion {
            solicited,
            ..WorkCompletion::new(id, WcStatus::Success, WcOpcode::Recv, 1)
        }
    }

    #[test]
    fn fifo_and_overflow() {
        // RDMAP-SEC-10: overflow is reported to the producer, the queue keeps what it had.
        let cq = CompletionQueue::create(2);
        cq.deliver(wc(1, false)).unwrap();
        cq.deliver(wc(2, false)).unwrap();
        assert_eq!(cq.deliver(wc(3, false)), Err(CqOverflow));
        assert!(cq.overflowed());
        assert_eq!(cq.poll_one().unwrap().wr_id, 1);
        assert_eq!(cq.poll_one().unwrap().wr_id, 2);
        assert!(cq.poll_one().is_none());
    }

    #[test]
    fn solicited_events() {
        let cq = CompletionQueue::create(8);
        cq.req_notify(true);
        cq.deliver(wc(1, false)).unwrap();
        assert!(!cq.get_event(Some(Duration::from_millis(1))));
        cq.deliver(wc(2, true)).unwrap();
        assert!(cq.get_event(Some(Duration::from_millis(1))));
        // Disarmed after one event.
        cq.deliver(wc(3, true)).unwrap();
        assert!(!cq.get_event(Some(Duration::from_millis(1))));
    }

    #[test]
    fn completions_wake_only_sleepers() {
        // Issue 18: a busy-polled CQ costs no futex system call per completion.
        let cq = CompletionQueue::create(256);
        for i in 0..100 {
            cq.deliver(wc(i, false)).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(cq.poll(&mut out, 256), 100);
        assert_eq!(cq.notifies(), 0, "nobody slept, so nobody was notified");
        // A sleeping waiter is woken (once) by the next completion.
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))));
        while cq.inner.state.lock().unwrap().sleepers == 0 {
            std::thread::yield_now();
        }
        cq.deliver(wc(7, false)).unwrap();
        assert_eq!(t.join().unwrap().unwrap().wr_id, 7);
        assert_eq!(cq.notifies(), 1);
        assert_eq!(cq.inner.state.lock().unwrap().sleepers, 0);
    }

    #[test]
    fn deferred_wakeups_come_when_the_scope_ends() {
        // Issue 18: a provider delivering under its QP's lock wakes the sleeper only after it
        // (the scope) ends, so the woken thread does not sleep again on that lock.
        let cq = CompletionQueue::create(8);
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))));
        while cq.inner.state.lock().unwrap().sleepers == 0 {
            std::thread::yield_now();
        }
        defer_wakeups(|| {
            cq.deliver(wc(1, false)).unwrap();
            // Nested scopes join the outer one.
            defer_wakeups(|| cq.deliver(wc(2, false)).unwrap());
            assert_eq!(cq.notifies(), 0, "woken inside the scope");
            assert_eq!(cq.len(), 2, "the completions themselves are queued at once");
        });
        assert_eq!(cq.notifies(), 1, "one wake-up for the CQ at the end of the scope");
        assert_eq!(t.join().unwrap().unwrap().wr_id, 1);
        // flush_wakeups wakes inside the scope; outside one, deliver wakes at once.
        let c2 = cq.clone();
        let t = std::thread::spawn(move || {
            let first = c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30)));
            (first, c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))))
        });
        let asleep = |n: u64| {
            while cq.inner.state.lock().unwrap().sleepers == 0 || cq.notifies() != n {
                std::thread::yield_now();
            }
        };
        // Completion 2 is still queued: the thread returns it without sleeping.
        asleep(1);
        defer_wakeups(|| {
            cq.deliver(wc(3, false)).unwrap();
            flush_wakeups();
            assert_eq!(cq.notifies(), 2);
        });
        let (a, b) = t.join().unwrap();
        assert_eq!((a.unwrap().wr_id, b.unwrap().wr_id), (2, 3));
        assert_eq!(cq.notifies(), 2);
    }

    /// A QP over a Unix socket: each byte received is one completion with that id.
    struct SockQp {
        sock: std::os::unix::net::UnixStream,
        cq: CompletionQueue,
        waits: std::sync::atomic::AtomicU32,
        ready: std::sync::atomic::AtomicU32,
        done: std::sync::atomic::AtomicU32,
    }

    impl Progress for SockQp {
        fn progress(&self) -> bool {
            use std::io::Read;
            let mut b = [0u8; 16];
            let mut any = false;
            while let Ok(n @ 1..) = (&self.sock).read(&mut b) {
                b[..n]
                    .iter()
                    .for_each(|&id| self.cq.deliver(wc(id as u64, false)).unwrap());
                any = true;
            }
            any
        }
        fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
            use std::os::fd::AsRawFd;
            self.waits.fetch_add(1, Ordering::Relaxed);
            Some(self.sock.as_raw_fd())
        }
        fn wait_ready(&self) -> bool {
            self.ready.fetch_add(1, Ordering::Relaxed);
            self.progress();
            true
        }
        fn wait_done(&self) {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn an_inline_waiter_receives_itself_and_is_woken_by_other_deliveries() {
        // Issue 18: with --events the waiter sleeps in poll(2) on its QP's socket and
        // receives itself (no provider thread in between, no condvar wake-up).
        use std::io::Write;
        let cq = CompletionQueue::create(8);
        let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let qp = Arc::new(SockQp {
            sock: ours,
            cq: cq.clone(),
            waits: 0.into(),
            ready: 0.into(),
            done: 0.into(),
        });
        let weak: Weak<dyn Progress> = Arc::downgrade(&qp) as Weak<dyn Progress>;
        cq.attach_progress(weak);
        let asleep = || {
            while !cq.inner.state.lock().unwrap().inline_sleeper {
                std::thread::yield_now();
            }
        };
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))));
        asleep();
        peer.write_all(&[5]).unwrap();
        assert_eq!(t.join().unwrap().unwrap().wr_id, 5);
        assert_eq!(cq.notifies(), 0, "the socket woke the waiter, not a notification");
        assert_eq!(qp.ready.load(Ordering::Relaxed), 1);
        // A completion delivered by another thread wakes the inline waiter (its eventfd).
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))));
        asleep();
        cq.deliver(wc(9, false)).unwrap();
        assert_eq!(t.join().unwrap().unwrap().wr_id, 9);
        assert_eq!(cq.notifies(), 1);
        // A deferred one too, when its scope ends.
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(30))));
        asleep();
        defer_wakeups(|| cq.deliver(wc(10, false)).unwrap());
        assert_eq!(t.join().unwrap().unwrap().wr_id, 10);
        // A timeout ends the wait; every wait_fd was matched by a wait_done.
        assert!(cq.wait_spin(Duration::ZERO, Some(Duration::from_millis(20))).is_none());
        assert_eq!(qp.waits.load(Ordering::Relaxed), 4);
        assert_eq!(qp.done.load(Ordering::Relaxed), 4);
        assert!(!cq.inner.state.lock().unwrap().inline_sleeper);
    }

    #[test]
    fn blocking_wait_wakes() {
        let cq = CompletionQueue::create(8);
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait(Some(Duration::from_secs(5))));
        std::thread::sleep(Duration::from_millis(20));
        cq.deliver(wc(7, false)).unwrap();
        assert_eq!(t.join().unwrap().unwrap().wr_id, 7);
        assert!(cq.wait_spin(Duration::ZERO, Some(Duration::from_millis(5))).is_none());
    }

    /// `interrupt` makes a thread asleep in `wait` return `None` long before its timeout (issue
    /// 18: the RPC client's progress thread leaves the CQ to a caller that polls it), and a
    /// completion is still taken by the next wait.
    #[test]
    fn interrupt_ends_a_sleeping_wait() {
        let cq = CompletionQueue::create(4);
        let c2 = cq.clone();
        let t = std::thread::spawn(move || c2.wait_spin(Duration::ZERO, Some(Duration::from_secs(600))));
        // repeated until the waiter returns: it may not be asleep yet at the first one
        while !t.is_finished() {
            cq.interrupt();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(t.join().unwrap().is_none());
        cq.deliver(wc(9, false)).unwrap();
        assert_eq!(cq.wait(Some(Duration::from_secs(600))).unwrap().wr_id, 9);
    }
}
