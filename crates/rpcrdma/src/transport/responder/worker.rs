//! A worker thread: sleeps in its completion queue, takes new connections from its inbox,
//! routes completions to their connection, and closes idle or finished connections.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Conn, Fatal, SETTLE_POLL, WorkerHandle};
use crate::transport::wrid;
use verbs::WorkCompletion;

/// One worker: sleeps in its completion queue (no timeout unless a connection's idle
/// deadline is pending), hands each completion to the connection whose QP it names, and
/// ends connections that close, fail or stay idle too long.
pub(super) fn worker(w: &WorkerHandle, stop: &AtomicBool, live: &AtomicUsize, idle: Option<Duration>) {
    let mut st = WorkerState::default();
    let mut stopping = false;
    loop {
        if stop.load(Ordering::Relaxed) && !stopping {
            stopping = true;
            for c in st.conns.values_mut() {
                c.stopping = true;
                c.qp.disconnect();
            }
        }
        st.take_inbox(w, stopping);
        if stopping && st.conns.is_empty() {
            return;
        }
        let now = Instant::now();
        let deadline = idle.and_then(|t| {
            st.conns
                .values()
                .filter(|c| !c.idle_closed)
                .map(|c| c.last_active + t)
                .min()
        });
        // and the nearest timeout of an RDMA operation in flight
        let ops = st.conns.values().filter_map(Conn::op_deadline).min();
        let deadline = match (deadline, ops) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // a completion that came before its connection reached the inbox is retried soon
        let wait = match (deadline, st.orphans.is_empty()) {
            (d, true) => d.map(|d| d.saturating_duration_since(now)),
            (d, false) => Some(
                d.map_or(ORPHAN_RETRY, |d| d.saturating_duration_since(now))
                    .min(ORPHAN_RETRY),
            ),
        };
        // a retransmission waiting for its XID to settle is looked at again soon
        let wait = if st.conns.values().any(|c| c.settling.is_some()) {
            Some(wait.map_or(SETTLE_POLL, |w| w.min(SETTLE_POLL)))
        } else {
            wait
        };
        // a Reply from the pool whose wake-up a connection's wait consumed
        let wait = if w.done.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            wait
        } else {
            Some(Duration::ZERO)
        };
        let first = w.cq.wait_spin(Duration::ZERO, wait);
        // One clock read for this pass: the arrival time of what it routes, and the op and
        // idle deadlines checked after (a deadline passed while the pass ran is seen by the
        // next pass, whose wait then returns at once). It was 3-4 reads per pass and one
        // per completion, ~7 per busy NULL call (issue 18, session 17).
        let now = Instant::now();
        st.take_inbox(w, stopping);
        for o in std::mem::take(&mut st.orphans) {
            st.route(o);
        }
        if let Some(wc) = first {
            st.route((wc, now));
        }
        // and whatever else is there, without sleeping
        while let Some(wc) = w.cq.poll_one() {
            st.route((wc, now));
        }
        st.collect_done(w);
        // a peer that does not answer our RDMA Read or acknowledge our Send within the
        // timeout loses its connection; nothing of it ever held the others
        for (qpn, c) in &mut st.conns {
            if c.settling.is_some() && !st.pending.contains(qpn) {
                st.pending.push_back(*qpn);
            }
            if c.failed.is_none() && c.op_deadline().is_some_and(|d| d <= now) {
                c.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                c.failed = Some(Fatal::Timeout);
                if !st.pending.contains(qpn) {
                    st.pending.push_back(*qpn);
                }
            }
        }
        while let Some(qpn) = st.pending.pop_front() {
            let Some(c) = st.conns.get_mut(&qpn) else { continue };
            let r = c.step();
            if !matches!(r, Ok(true)) {
                let mut c = st.conns.remove(&qpn).expect("present");
                c.finish(r.err());
                live.fetch_sub(1, Ordering::AcqRel);
                w.load.fetch_sub(1, Ordering::Relaxed);
                if st.closed.len() == CLOSED_REMEMBERED {
                    st.closed.pop_front();
                }
                st.closed.push_back(qpn);
            }
            st.take_inbox(w, stopping);
        }
        if let Some(t) = idle {
            for c in st.conns.values_mut() {
                if !c.idle_closed && now.duration_since(c.last_active) >= t {
                    // idle timeout: close cleanly; the flushed receives end it
                    tracing::info!(qp = c.qpn, peer = %c.peer, idle_s = t.as_secs(), "rpcrdma server: closing idle connection");
                    c.idle_closed = true;
                    c.stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                    c.qp.disconnect();
                }
            }
        }
    }
}

/// How long a completion whose connection is not in the worker's map yet waits for it
/// (the accept thread pushes a connection right after `accept` returns).
const ORPHAN_RETRY: Duration = Duration::from_millis(20);

/// How long such a completion is kept at most.
const ORPHAN_MAX: Duration = Duration::from_secs(10);

/// Closed QPs a worker remembers, to drop their last flushed completions at once.
const CLOSED_REMEMBERED: usize = 1024;

#[derive(Default)]
struct WorkerState {
    /// By QPN: FxHash (every completion is routed through it).
    conns: rustc_hash::FxHashMap<u32, Conn>,
    /// Connections with completions to handle, in arrival order.
    pending: VecDeque<u32>,
    /// Completions for QPs not (yet) in `conns`, with when they came.
    orphans: Vec<(WorkCompletion, Instant)>,
    closed: VecDeque<u32>,
}

impl WorkerState {
    fn take_inbox(&mut self, w: &WorkerHandle, stopping: bool) {
        for mut c in w.inbox.lock().unwrap().drain(..) {
            if stopping {
                c.stopping = true;
                c.qp.disconnect();
            }
            self.conns.insert(c.qpn, c);
        }
    }

    /// Send the Replies the I/O pool finished; a connection whose Reply failed ends at its
    /// next step.
    fn collect_done(&mut self, w: &WorkerHandle) {
        let done = std::mem::take(&mut *w.done.lock().unwrap_or_else(|e| e.into_inner()));
        for f in done {
            let qpn = f.qpn;
            let Some(c) = self.conns.get_mut(&qpn) else { continue };
            if c.serial != f.serial {
                continue;
            }
            if c.failed.is_none()
                && let Err(e) = c.complete(f)
            {
                c.failed = Some(e);
            }
            if !self.pending.contains(&qpn) {
                self.pending.push_back(qpn);
            }
        }
    }

    fn route(&mut self, (wc, since): (WorkCompletion, Instant)) {
        if wc.wr_id == wrid::WAKE {
            return;
        }
        let qpn = wc.qp_num;
        match self.conns.get_mut(&qpn) {
            Some(c) => {
                c.admit(&wc);
                c.backlog.push_back(wc);
                if !self.pending.contains(&qpn) {
                    self.pending.push_back(qpn);
                }
            }
            None if self.closed.contains(&qpn) => {}
            None if since.elapsed() < ORPHAN_MAX => self.orphans.push((wc, since)),
            None => tracing::debug!(qp = qpn, "rpcrdma server: completion for an unknown connection"),
        }
    }
}
