//! A waiting caller's mailbox: where the thread that polls a connection's completion queue
//! puts the caller's outcome (or its turn to poll). It has the semantics of the
//! `sync_channel(2)` it replaces (at most two messages, `try_send` drops a third; the
//! receiver sees "disconnected" once the sender is gone and nothing is left), but a caller
//! thread reuses one mailbox for its calls: the channel was one 128-byte-aligned allocation
//! (`memalign`) and its frees per call, ~1,300 instructions of each small call (issue 18,
//! session 16).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Messages a mailbox holds at most (the Requester sends a Lead and then the outcome).
const CAPACITY: usize = 2;

struct Slots<T> {
    msgs: VecDeque<T>,
    /// The sender was dropped.
    closed: bool,
    /// The receiver sleeps in [`Receiver::recv_timeout`]: only then is the condition variable
    /// notified (std's `Condvar::notify_one` is a `futex` system call whether anyone waits or
    /// not: two per call, on the path of every Reply, before this flag).
    waiting: bool,
    /// Notifications made (a count for the tests).
    notified: u64,
}

/// The shared part.
pub(super) struct Mailbox<T> {
    slots: Mutex<Slots<T>>,
    cv: Condvar,
}

impl<T> Mailbox<T> {
    pub(super) fn new() -> Self {
        Mailbox {
            slots: Mutex::new(Slots {
                msgs: VecDeque::with_capacity(CAPACITY),
                closed: false,
                waiting: false,
                notified: 0,
            }),
            cv: Condvar::new(),
        }
    }
}

/// A new sender/receiver pair on `spare`, or on a new mailbox if `spare` is still shared
/// (a sender or receiver of an earlier call is alive: its messages must not reach this one).
/// `spare` becomes the mailbox used, so the next call on this thread reuses it.
pub(super) fn pair<T>(spare: &mut Arc<Mailbox<T>>) -> (Sender<T>, Receiver<T>) {
    if Arc::strong_count(spare) != 1 || Arc::weak_count(spare) != 0 {
        *spare = Arc::new(Mailbox::new());
    } else {
        // no one else holds it: nothing can be sent to it meanwhile
        let mut s = spare.slots.lock().unwrap_or_else(|e| e.into_inner());
        s.msgs.clear();
        s.closed = false;
        s.waiting = false;
    }
    (Sender(spare.clone()), Receiver(spare.clone()))
}

/// The sending side (one per mailbox use).
pub(super) struct Sender<T>(Arc<Mailbox<T>>);

impl<T> Sender<T> {
    /// Puts `msg` in the mailbox unless it is full (then `msg` is dropped, as a full
    /// `SyncSender::try_send` returns it).
    pub(super) fn try_send(&self, msg: T) -> bool {
        let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
        if s.msgs.len() >= CAPACITY {
            return false;
        }
        s.msgs.push_back(msg);
        let wake = s.waiting;
        s.notified += u64::from(wake);
        drop(s);
        if wake {
            self.0.cv.notify_one();
        }
        true
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
        s.closed = true;
        let wake = s.waiting;
        s.notified += u64::from(wake);
        drop(s);
        if wake {
            self.0.cv.notify_one();
        }
    }
}

/// Why a receive found nothing.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Empty {
    /// Nothing yet (or the wait timed out).
    Now,
    /// Nothing, and the sender is gone.
    Disconnected,
}

/// The receiving side.
pub(super) struct Receiver<T>(Arc<Mailbox<T>>);

impl<T> Receiver<T> {
    /// The next message, without waiting.
    pub(super) fn try_recv(&self) -> Result<T, Empty> {
        let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
        match s.msgs.pop_front() {
            Some(m) => Ok(m),
            None if s.closed => Err(Empty::Disconnected),
            None => Err(Empty::Now),
        }
    }

    /// The next message, waiting at most `timeout` for it.
    pub(super) fn recv_timeout(&self, timeout: Duration) -> Result<T, Empty> {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = self.0.slots.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(m) = s.msgs.pop_front() {
                return Ok(m);
            }
            if s.closed {
                return Err(Empty::Disconnected);
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::MAX,
            };
            if left.is_zero() {
                return Err(Empty::Now);
            }
            // set and read under the lock: a sender that pushes after this sees it
            s.waiting = true;
            s = self.0.cv.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
            s.waiting = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_sync_channel_of_two() {
        let mut spare = Arc::new(Mailbox::new());
        let (tx, rx) = pair::<u32>(&mut spare);
        assert_eq!(rx.try_recv(), Err(Empty::Now));
        assert!(tx.try_send(1));
        assert!(tx.try_send(2));
        assert!(!tx.try_send(3), "full: dropped");
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(2));
        assert_eq!(rx.recv_timeout(Duration::ZERO), Err(Empty::Now));
        assert!(tx.try_send(4));
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(4), "what was sent before the drop is received");
        assert_eq!(rx.try_recv(), Err(Empty::Disconnected));
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Err(Empty::Disconnected));
    }

    fn notified<T>(m: &Arc<Mailbox<T>>) -> u64 {
        m.slots.lock().unwrap().notified
    }

    /// Issue 18: a Reply delivered to a caller that polls (the leader, or a follower not yet
    /// asleep) makes no `futex` wake-up; one delivered to a sleeping follower does.
    #[test]
    fn only_a_sleeping_receiver_is_notified() {
        let mut spare = Arc::new(Mailbox::new());
        let (tx, rx) = pair::<u32>(&mut spare);
        assert!(tx.try_send(1));
        assert_eq!(rx.try_recv(), Ok(1));
        drop(tx);
        assert_eq!(rx.try_recv(), Err(Empty::Disconnected));
        assert_eq!(notified(&spare), 0, "nobody slept: no notification");
        drop(rx);
        let (tx, rx) = pair::<u32>(&mut spare);
        let m = spare.clone();
        let t = std::thread::spawn(move || {
            // the receiver is asleep once it has set `waiting` (under the lock)
            while !m.slots.lock().unwrap().waiting {
                std::thread::yield_now();
            }
            assert!(tx.try_send(5));
            tx
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(5));
        let tx = t.join().unwrap();
        drop(tx);
        // the send to the sleeper notified; the sender's drop (the receiver awake) did not
        assert_eq!(notified(&spare), 1);
    }

    #[test]
    fn a_free_mailbox_is_reused_and_a_held_one_is_not() {
        let mut spare = Arc::new(Mailbox::new());
        let first = Arc::as_ptr(&spare);
        {
            let (tx, rx) = pair::<u32>(&mut spare);
            assert!(tx.try_send(7));
            drop(tx);
            drop(rx);
        }
        // both ends gone: the same mailbox, emptied and open again
        let (tx, rx) = pair::<u32>(&mut spare);
        assert_eq!(Arc::as_ptr(&spare), first);
        assert_eq!(rx.try_recv(), Err(Empty::Now), "the earlier call's message is gone");
        // a sender of that call still alive: the next call gets a mailbox of its own
        let (tx2, rx2) = pair::<u32>(&mut spare);
        assert_ne!(Arc::as_ptr(&spare), first);
        assert!(tx.try_send(1));
        drop(tx);
        assert_eq!(rx2.try_recv(), Err(Empty::Now), "not the other call's message");
        assert_eq!(rx.try_recv(), Ok(1));
        assert!(tx2.try_send(2));
        assert_eq!(rx2.try_recv(), Ok(2));
    }

    #[test]
    fn a_waiting_receiver_is_woken_by_a_send_and_by_the_drop() {
        let mut spare = Arc::new(Mailbox::new());
        let (tx, rx) = pair::<u32>(&mut spare);
        let t = std::thread::spawn(move || {
            assert!(tx.try_send(9));
            tx
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(9));
        let tx = t.join().unwrap();
        let t = std::thread::spawn(move || drop(tx));
        assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Err(Empty::Disconnected));
        t.join().unwrap();
    }
}
