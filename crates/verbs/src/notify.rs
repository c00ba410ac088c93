//! A small blocking-and-async queue: the wake-up mechanism behind completion
//! queues and connection-manager events. Waiting threads sleep on a condition
//! variable (no CPU while idle); async tasks register a `Waker`.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Called with each item as it is pushed, before waiters see it.
type Tap<T> = Box<dyn Fn(&T) + Send + Sync>;

/// A queue of events with blocking and async waits: CM requests, CM events, async events.
pub struct EventQueue<T> {
    state: Mutex<(VecDeque<T>, Vec<Waker>, bool)>,
    cond: Condvar,
    tap: Option<Tap<T>>,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        EventQueue {
            state: Mutex::new((VecDeque::new(), Vec::new(), false)),
            cond: Condvar::new(),
            tap: None,
        }
    }
}

impl<T> EventQueue<T> {
    /// An empty, open queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A queue that also shows every pushed item to `tap` (the verbs layer
    /// derives device-wide asynchronous events from a QP's CM events this way).
    pub fn with_tap(tap: impl Fn(&T) + Send + Sync + 'static) -> Self {
        EventQueue {
            tap: Some(Box::new(tap)),
            ..Self::default()
        }
    }

    /// Adds an event and wakes one waiter.
    pub fn push(&self, v: T) {
        if let Some(tap) = &self.tap {
            tap(&v);
        }
        let wakers = {
            let mut s = self.state.lock().unwrap();
            s.0.push_back(v);
            std::mem::take(&mut s.1)
        };
        self.cond.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Marks the queue closed: waiters return `None` once it is empty.
    pub fn close(&self) {
        let wakers = {
            let mut s = self.state.lock().unwrap();
            s.2 = true;
            std::mem::take(&mut s.1)
        };
        self.cond.notify_all();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The next event, if one is waiting.
    pub fn try_pop(&self) -> Option<T> {
        self.state.lock().unwrap().0.pop_front()
    }

    /// Blocks until an item arrives, the queue closes, or `timeout` passes.
    pub fn pop_timeout(&self, timeout: Option<Duration>) -> Option<T> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(v) = s.0.pop_front() {
                return Some(v);
            }
            if s.2 {
                return None;
            }
            match deadline {
                None => s = self.cond.wait(s).unwrap(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    s = self.cond.wait_timeout(s, d - now).unwrap().0;
                }
            }
        }
    }

    /// Async pop: resolves to `None` when the queue is closed and empty.
    pub fn pop_async(&self) -> PopFuture<'_, T> {
        PopFuture { q: self }
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.state.lock().unwrap().0.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The future of [`EventQueue::pop_async`].
pub struct PopFuture<'a, T> {
    q: &'a EventQueue<T>,
}

impl<T> Future for PopFuture<'_, T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.q.state.lock().unwrap();
        if let Some(v) = s.0.pop_front() {
            return Poll::Ready(Some(v));
        }
        if s.2 {
            return Poll::Ready(None);
        }
        if !s.1.iter().any(|w| w.will_wake(cx.waker())) {
            s.1.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
