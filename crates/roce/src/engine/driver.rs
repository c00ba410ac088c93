//! The per-device progress thread: `epoll_wait` (through mio) on the device's UDP socket
//! and a waker, with the earliest QP timer as its timeout. Nothing to read and no timer
//! armed: it sleeps without a timeout, so an idle device costs no CPU.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::DevInner;

const SOCKET: Token = Token(0);
pub(super) const WAKER: Token = Token(1);

/// Registers the device's socket with `poll` and starts the thread.
pub(super) fn start(poll: Poll, dev: &Arc<DevInner>) -> std::io::Result<()> {
    poll.registry()
        .register(&mut SourceFd(&dev.rx_fd()), SOCKET, Interest::READABLE)?;
    let weak = Arc::downgrade(dev);
    std::thread::Builder::new()
        .name(format!("{}-progress", dev.cfg.name))
        .spawn(move || run(poll, weak))?;
    Ok(())
}

fn run(mut poll: Poll, dev: Weak<DevInner>) {
    let mut events = Events::with_capacity(16);
    loop {
        let timeout = {
            let Some(d) = dev.upgrade() else { return };
            if d.stop.load(Ordering::SeqCst) {
                return;
            }
            d.sleep_deadline().map(|t| t.saturating_duration_since(Instant::now()))
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "RoCEv2 progress thread: epoll_wait failed");
                return;
            }
        }
        let Some(d) = dev.upgrade() else { return };
        if d.stop.load(Ordering::SeqCst) {
            return;
        }
        d.awake();
        // Edge-triggered: drain whenever woken (a waker wake-up may hide a socket edge
        // consumed in the same batch).
        d.drain_rx();
        d.fire_timers(Instant::now());
    }
}
