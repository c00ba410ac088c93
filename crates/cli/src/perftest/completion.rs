//! Waiting for completions with a deadline, and turning QP events into errors that name
//! their cause (Terminate, peer closed, reset).

use anyhow::{Result, bail};
use std::time::{Duration, Instant};
use verbs::*;

/// A failed completion with what caused it: the engine queues the event (Terminate, peer
/// closed) before the completions it flushes, so it is there to be read now.
pub(super) fn with_cause(qp: &QueuePair, wc: WorkCompletion, what: &str) -> Result<WorkCompletion> {
    if wc.status == WcStatus::Success {
        return Ok(wc);
    }
    match check_events(qp, what) {
        Err(e) => Err(e.context(format!(
            "{what}: completion with status {} (vendor_err {:#x})",
            wc.status, wc.vendor_err
        ))),
        Ok(()) => Ok(wc),
    }
}

pub(super) fn wait_wc(cq: &CompletionQueue, qp: &QueuePair, deadline: Instant, what: &str) -> Result<WorkCompletion> {
    loop {
        if let Some(wc) = cq.poll_one() {
            return with_cause(qp, wc, what);
        }
        check_events(qp, what)?;
        let now = Instant::now();
        if now >= deadline {
            bail!(
                "timed out waiting for {what} (--timeout; QP {}, peer {}): the peer went silent",
                qp.qp_num(),
                qp.conn_info().peer_addr
            );
        }
        // The cap only bounds how late an event without a completion is seen (the engine
        // queues events before the completions it flushes): idle costs five wake-ups a second.
        if let Some(wc) = cq.wait(Some((deadline - now).min(Duration::from_millis(200)))) {
            return with_cause(qp, wc, what);
        }
    }
}

/// Turns the QP's events into errors that say what ended the session, with the QP number
/// and the peer's address (issue 12 Diagnostics: at default log level, exit non-zero).
pub(super) fn check_events(qp: &QueuePair, what: &str) -> Result<()> {
    while let Some(ev) = qp.get_event(Some(Duration::ZERO)) {
        let who = || format!("QP {}, peer {}", qp.qp_num(), qp.conn_info().peer_addr);
        match ev {
            CmEvent::Established => {}
            CmEvent::Disconnected => bail!("peer closed the connection ({}) while we waited for {what}", who()),
            CmEvent::ErrorReceived(t) => bail!("fatal error received ({}) while waiting for {what}: {t}", who()),
            CmEvent::ErrorSent(t) => bail!("fatal error sent ({}) while waiting for {what}: {t}", who()),
            CmEvent::ConnectionError(e) => bail!("peer reset the connection ({}) while waiting for {what}: {e}", who()),
        }
    }
    Ok(())
}

pub(super) fn ok(wc: &WorkCompletion, op: WcOpcode, what: &str) -> Result<()> {
    if wc.status != WcStatus::Success {
        bail!(
            "{what}: completion with status {} (vendor_err {:#x})",
            wc.status,
            wc.vendor_err
        );
    }
    if wc.opcode != op {
        bail!("{what}: completion {:?}, expected {op:?}", wc.opcode);
    }
    Ok(())
}
