//! The latency loops of the client: Send, Write and one-sided ping-pongs.

use super::*;

pub(super) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

fn warmup(stop: Stop) -> u64 {
    match stop {
        Stop::Iters(n) => (n / 100).clamp(10, 1000),
        Stop::Time(_) => 100,
    }
}

fn keep_going(stop: Stop, start: Instant, done: u64) -> bool {
    match stop {
        Stop::Iters(n) => done < n,
        Stop::Time(d) => start.elapsed() < d,
    }
}

/// Busy-polls `cq` (which drives the provider inline) until a completion
/// arrives, or with `events` sleeps until the provider's thread delivers one.
fn spin(cq: &CompletionQueue, events: bool) -> Result<WorkCompletion> {
    if events {
        return cq
            .wait_spin(Duration::ZERO, Some(T))
            .ok_or_else(|| anyhow!("no completion within {T:?}"));
    }
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.poll_one() {
            return Ok(wc);
        }
        if start.elapsed() > T {
            bail!("no completion within {T:?}");
        }
        std::hint::spin_loop();
    }
}

/// Send ping-pong: post a Send, spin until the echo arrives.
pub(super) fn lat_send(
    c: &mut ClientQp,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let len = size as u32;
    let recv = |n: u64| RecvWr {
        wr_id: wr_id(KIND_RECV, 0, n),
        sg_list: vec![mr.sge(0, len)],
    };
    c.qp.post_recv(&[recv(0)])?;
    ping_pong(stop, prog, size, |i| {
        // The work request is built before the clock starts, as perftest prepares its
        // WRs and the TCP baseline its buffer: its allocation is not the round trip's.
        let wr = SendWr::new(wr_id(KIND_DATA, 0, i), WrOpcode::Send, vec![mr.sge(0, len)]);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        loop {
            let wc = spin(cq, c.events)?;
            check(&wc, "send ping-pong")?;
            if split_wr_id(wc.wr_id).0 == KIND_RECV {
                break;
            }
        }
        let dt = t0.elapsed();
        c.qp.post_recv(&[recv(i + 1)])?;
        Ok(dt)
    })
}

/// The byte a ping-pong Write number `i` leaves at the end of the buffer (never 0).
pub(super) fn stamp(i: u64) -> u8 {
    (i % 255) as u8 + 1
}

/// Write ping-pong: each side spins on the last byte of its buffer (perftest's write_lat).
pub(super) fn lat_write(
    c: &mut ClientQp,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    echo_off: usize,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let len = size as u32;
    let last = size as usize - 1;
    let remote = RemoteAddr {
        addr: c.reply.addr,
        rkey: c.reply.rkey,
    };
    let mut wcs = Vec::new();
    let mut b = [0u8];
    ping_pong(stop, prog, size, |i| {
        let s = stamp(i);
        mr.write(last, &[s])?; // the last byte of what we send
        let seen = echo_off + last; // where the server's echo puts it
        // Signal every 64th Write so the send queue drains.
        let flags = if i % 64 == 63 {
            SendFlags::SIGNALED
        } else {
            SendFlags::empty()
        };
        // Built before the clock starts (see lat_send).
        let wr = SendWr::new(
            wr_id(KIND_DATA, 0, i),
            WrOpcode::RdmaWrite { remote },
            vec![mr.sge(0, len)],
        )
        .flags(flags);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        loop {
            wcs.clear();
            cq.poll(&mut wcs, 16);
            for wc in &wcs {
                check(wc, "write ping-pong")?;
            }
            mr.read(seen, &mut b)?;
            if b[0] == s {
                break;
            }
            if t0.elapsed() > T {
                bail!("write ping-pong: no answer within {T:?}");
            }
            std::hint::spin_loop();
        }
        Ok(t0.elapsed())
    })
}

/// One Read or atomic at a time.
pub(super) fn lat_one_sided(
    c: &mut ClientQp,
    op: Op,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    stop: Stop,
    prog: &Progress,
) -> Result<Histogram<u64>> {
    let remote = RemoteAddr {
        addr: c.reply.addr,
        rkey: c.reply.rkey,
    };
    let (opcode, len) = match op {
        Op::Read => (WrOpcode::RdmaRead { remote }, size as u32),
        _ => (WrOpcode::AtomicFetchAdd { remote, add: 1 }, 8),
    };
    ping_pong(stop, prog, len as u64, |i| {
        // Built before the clock starts (see lat_send).
        let wr = SendWr::new(wr_id(KIND_DATA, 0, i), opcode.clone(), vec![mr.sge(0, len)]);
        let t0 = Instant::now();
        c.qp.post_send_one(wr)?;
        let wc = spin(cq, c.events)?;
        check(&wc, op.name())?;
        Ok(t0.elapsed())
    })
}

/// The loop every latency test runs: `one(i)` does message `i` and returns its round trip;
/// the first [`warmup`] messages are not recorded, then messages run until `stop`, each
/// recorded in the histogram and shown on the progress line (`bytes` per message).
fn ping_pong(
    stop: Stop,
    prog: &Progress,
    bytes: u64,
    mut one: impl FnMut(u64) -> Result<Duration>,
) -> Result<Histogram<u64>> {
    let mut hist = new_hist();
    let wu = warmup(stop);
    let mut start = Instant::now();
    for i in 0u64.. {
        if i == wu {
            start = Instant::now();
        }
        let measured = i.saturating_sub(wu);
        if i >= wu && !keep_going(stop, start, measured) {
            break;
        }
        let dt = one(i)?;
        if i >= wu {
            hist.record(dt.as_nanos().max(1) as u64)?;
            prog.tick(start, measured + 1, bytes);
        }
    }
    Ok(hist)
}
