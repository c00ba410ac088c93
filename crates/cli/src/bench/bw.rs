//! The bandwidth and message-rate loop of the client.

use super::*;

/// Bandwidth / message-rate run over every QP. Returns (messages, seconds, peak Gbit/s).
#[allow(clippy::too_many_arguments)]
pub(super) fn bandwidth(
    conns: &mut [ClientQp],
    op: Op,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    size: u64,
    depth: u32,
    grant: u32,
    stop: Stop,
    prog: &Progress,
) -> Result<(u64, f64, f64)> {
    let len = if op == Op::Atomic { 8 } else { size as u32 };
    let cq_mod = cq_mod(depth) as u64;
    let depth = depth as u64;
    if op == Op::Send {
        for (q, c) in conns.iter().enumerate() {
            let n = c.reply.credits / grant + 2;
            let wrs: Vec<RecvWr> = (0..n)
                .map(|i| RecvWr {
                    wr_id: wr_id(KIND_RECV, q, i as u64),
                    sg_list: vec![mr.sge(0, 8)],
                })
                .collect();
            c.qp.post_recv(&wrs)?;
        }
    }
    let mut wcs = Vec::with_capacity(256);
    let mut batch: Vec<SendWr> = Vec::with_capacity(depth as usize);
    let start = Instant::now();
    let mut total_done = 0u64;
    // Peak: the best window of at least 100 ms and 16 signaled completions (each
    // completion reports cq_mod messages at once, so fewer would quantize the rate).
    let (mut win_start, mut win_done, mut win_events, mut peak) = (start, 0u64, 0u32, 0.0f64);
    let mut posting = true;
    let mut spins = 0u32;
    loop {
        if posting
            && let Stop::Time(d) = stop
            && start.elapsed() >= d
        {
            posting = false;
        }
        let limit = match stop {
            Stop::Iters(n) => n,
            Stop::Time(_) => u64::MAX,
        };
        // Everything posted (or time is up): the final Read below waits for the rest.
        if !posting || conns.iter().all(|c| c.posted >= limit) {
            break;
        }
        for (q, c) in conns.iter_mut().enumerate() {
            if c.posted < limit {
                let mut room = depth - (c.posted - c.completed);
                if op == Op::Send {
                    room = room.min(c.credits);
                }
                room = room.min(limit - c.posted);
                if room > 0 {
                    // The batch's WRs are rewritten in place, as perftest reuses its WR
                    // array: no gather-list allocation per post in the harness.
                    let room_n = room as usize;
                    batch.truncate(room_n);
                    for k in 0..room_n {
                        let n = c.posted + k as u64;
                        let signaled = (n + 1).is_multiple_of(cq_mod) || n + 1 == limit;
                        let remote = RemoteAddr {
                            addr: c.reply.addr,
                            rkey: c.reply.rkey,
                        };
                        let opcode = match op {
                            Op::Write => WrOpcode::RdmaWrite { remote },
                            Op::Read => WrOpcode::RdmaRead { remote },
                            Op::Send => WrOpcode::Send,
                            Op::Atomic => WrOpcode::AtomicFetchAdd { remote, add: 1 },
                        };
                        let flags = if signaled {
                            SendFlags::SIGNALED
                        } else {
                            SendFlags::empty()
                        };
                        let id = wr_id(KIND_DATA, q, n);
                        if let Some(w) = batch.get_mut(k) {
                            w.wr_id = id;
                            w.opcode = opcode;
                            w.flags = flags;
                            w.sg_list.clear();
                            w.sg_list.push(mr.sge(0, len));
                        } else {
                            batch.push(SendWr::new(id, opcode, vec![mr.sge(0, len)]).flags(flags));
                        }
                    }
                    c.qp.post_send(&batch).context("post_send")?;
                    c.posted += room;
                    if op == Op::Send {
                        c.credits -= room;
                    }
                }
            }
        }
        wcs.clear();
        if cq.poll(&mut wcs, 256) == 0 {
            spins += 1;
            if spins > 64 {
                // Stop burning the CPU the progress threads need; the engine
                // wakes the CQ's waiters when a completion arrives.
                if let Some(wc) = cq.wait_spin(Duration::ZERO, Some(Duration::from_millis(1))) {
                    wcs.push(wc);
                }
            }
        } else {
            spins = 0;
        }
        for wc in &wcs {
            let (kind, q, n) = split_wr_id(wc.wr_id);
            check(wc, op.name())?;
            let c = conns
                .get_mut(q)
                .ok_or_else(|| anyhow!("completion for unknown QP {q}"))?;
            match kind {
                KIND_DATA => {
                    let done = n + 1 - c.completed;
                    c.completed = n + 1;
                    total_done += done;
                    win_done += done;
                    win_events += 1;
                }
                KIND_RECV => {
                    c.credits += grant as u64;
                    c.grants += 1;
                    c.qp.post_recv(&[RecvWr {
                        wr_id: wc.wr_id,
                        sg_list: vec![mr.sge(0, 8)],
                    }])?;
                }
                _ => bail!("unexpected completion {wc:?}"),
            }
        }
        if !wcs.is_empty() {
            let now = Instant::now();
            let w = now.duration_since(win_start);
            if w >= Duration::from_millis(100) && win_events >= 16 {
                peak = peak.max(win_done as f64 * len as f64 * 8.0 / w.as_secs_f64() / 1e9);
                win_start = now;
                win_done = 0;
                win_events = 0;
            }
            prog.tick(start, total_done, len as u64);
        }
    }
    // Unsignaled WRs after the last signaled one (a --duration run stops
    // anywhere) and Writes still in flight: one signaled Read per QP
    // completes only after all of them.
    for (q, c) in conns.iter().enumerate() {
        let remote = RemoteAddr {
            addr: c.reply.addr,
            rkey: c.reply.rkey,
        };
        c.qp.post_send_one(SendWr::new(
            wr_id(KIND_FENCE, q, 0),
            WrOpcode::RdmaRead { remote },
            vec![mr.sge(0, 8)],
        ))?;
    }
    let mut fenced = 0;
    while fenced < conns.len() {
        let wc = cq
            .wait(Some(T))
            .ok_or_else(|| anyhow!("no completion for the final Read"))?;
        check(&wc, "final Read")?;
        let (kind, q, _) = split_wr_id(wc.wr_id);
        match kind {
            KIND_FENCE => {
                fenced += 1;
                let c = &mut conns[q];
                total_done += c.posted - c.completed;
                c.completed = c.posted;
            }
            KIND_DATA => {
                let c = &mut conns[q];
                let (_, _, n) = split_wr_id(wc.wr_id);
                total_done += n + 1 - c.completed;
                c.completed = n + 1;
            }
            KIND_RECV => conns[q].grants += 1,
            _ => {}
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if op == Op::Send {
        // The server grants credit for every `grant` messages it received, needed or not:
        // take every grant before the disconnect, or a late one meets a closed receive
        // queue and the server gets a Terminate ("no buffer available") at the test's end.
        let owed = |c: &ClientQp| c.posted / grant as u64;
        while conns.iter().any(|c| c.grants < owed(c)) {
            let wc = cq
                .wait(Some(T))
                .ok_or_else(|| anyhow!("no credit message from the server at the end"))?;
            check(&wc, "credit message")?;
            let (kind, q, _) = split_wr_id(wc.wr_id);
            if kind == KIND_RECV
                && let Some(c) = conns.get_mut(q)
            {
                c.grants += 1;
            }
        }
    }
    let avg = total_done as f64 * len as f64 * 8.0 / secs / 1e9;
    if peak == 0.0 || peak < avg {
        peak = peak.max(avg);
    }
    Ok((total_done, secs, peak))
}
