//! The client's side of one test: connect the QPs, run the measured loop, tell the server
//! the test is done; the work-request IDs and the progress line.

use super::*;

/// Signal one work request in this many (perftest's --cq-mod): often enough
/// that a deep queue never waits long for room, seldom enough to save completions.
pub(super) fn cq_mod(depth: u32) -> u32 {
    (depth / 4).clamp(1, 64)
}

/// The client's side of one connection.
pub(super) struct ClientQp {
    pub(super) qp: QueuePair,
    pub(super) reply: Reply,
    pub(super) posted: u64,
    pub(super) completed: u64,
    pub(super) credits: u64,
    /// Send bandwidth: credit messages received from the server so far.
    pub(super) grants: u64,
    /// Sleep on the CQ instead of busy-polling (latency mode).
    pub(super) events: bool,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_test(
    dev: &Device,
    target: SocketAddr,
    args: &Args,
    op: Op,
    test_id: u32,
    size: u64,
    last: bool,
    progress: bool,
    session: u32,
) -> Result<Outcome> {
    let lat = args.lat;
    let depth = if lat { 1 } else { args.depth };
    let pd = dev.alloc_pd()?;
    let (echo_off, ready_off, mr_len) = client_layout(size, args.qps);
    // Room for the Report the test's end writes to the server.
    let mr = pd.reg_mr(mr_len + Report::LEN, Access::all_remote())?;
    let (credits, grant) = send_credits(depth);
    let grant_recvs = credits / grant + 2;
    let cq = dev.create_cq(client_cqe(args.qps, depth))?;
    let mut flags = if lat { FLAG_LAT } else { 0 };
    if last {
        flags |= FLAG_LAST;
    }
    match args.baseline.as_deref() {
        Some("udp") => flags |= FLAG_BASELINE_UDP,
        Some(_) => flags |= FLAG_BASELINE,
        None => {}
    }
    if args.events {
        flags |= FLAG_EVENTS;
    }
    let mut conns = Vec::with_capacity(args.qps as usize);
    for q in 0..args.qps {
        let hello = Hello {
            op,
            flags,
            test_id,
            qp_index: q,
            qps: args.qps,
            depth,
            size,
            client_addr: mr.addr(),
            client_rkey: mr.rkey(),
            session,
        };
        let opts = QpOptions::new(&cq)
            .attr(qp_attr(depth.max(64) + 8, grant_recvs + 8))
            .rd_atomic(RD_ATOMIC, RD_ATOMIC)
            .private_data(&hello.encode());
        let qp = match pd.connect(target, opts, T) {
            Ok(qp) => qp,
            Err(Error::Rejected { private_data, .. }) => bail!(
                "connecting QP {q} to {target}: the server refused: {}",
                String::from_utf8_lossy(&private_data)
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("connecting QP {q} to {target} (is `softrdma bench --listen` running there?)")
                });
            }
        };
        let reply = Reply::decode(&qp.conn_info().peer_private_data)?;
        match qp.get_event(Some(T)) {
            Some(CmEvent::Established) => {}
            other => bail!("QP {q}: expected Established, got {other:?}"),
        }
        conns.push(ClientQp {
            qp,
            reply,
            posted: 0,
            completed: 0,
            credits: reply.credits as u64,
            grants: 0,
            events: args.events,
        });
    }
    if op == Op::Send {
        // Wait for each server QP's "receives are posted" Write.
        let t0 = Instant::now();
        let mut b = [0u8];
        for q in 0..conns.len() {
            loop {
                cq.poll(&mut Vec::new(), 0);
                mr.read(ready_off + q, &mut b)?;
                if b[0] == READY {
                    break;
                }
                if t0.elapsed() > T {
                    bail!("QP {q}: the server did not signal that its receives are posted");
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
    let detail = conns[0].qp.conn_info().detail;
    let crc = detail.contains("crc true");
    let tcp_port = conns[0].reply.tcp_port;
    let iters = args.iters.unwrap_or(if lat { 1000 } else { 5000 });
    let stop = match args.duration {
        Some(d) => Stop::Time(Duration::from_secs_f64(d)),
        None => Stop::Iters(iters),
    };
    let mut out = Outcome {
        op,
        size,
        qps: args.qps,
        depth,
        lat,
        events: args.events,
        crc,
        detail,
        messages: 0,
        secs: 0.0,
        peak_gbit: 0.0,
        hist: None,
        baseline: None,
        tcp_port,
        cpu_s: None,
    };
    let prog = Progress::new(progress, args.progress, op, size);
    let cpu0 = cpu_secs();
    if lat {
        let c = &mut conns[0];
        let hist = match op {
            Op::Send => lat_send(c, &cq, &mr, size, stop, &prog)?,
            Op::Write => lat_write(c, &cq, &mr, echo_off, size, stop, &prog)?,
            Op::Read | Op::Atomic => lat_one_sided(c, op, &cq, &mr, size, stop, &prog)?,
        };
        out.messages = hist.len();
        out.secs = hist.mean() * hist.len() as f64 / 1e9;
        out.peak_gbit = out.gbit();
        out.hist = Some(hist);
    } else {
        let (messages, secs, peak) = bandwidth(&mut conns, op, &cq, &mr, size, depth, grant, stop, &prog)?;
        out.messages = messages;
        out.secs = secs;
        out.peak_gbit = peak;
    }
    out.cpu_s = cpu0.and_then(|c0| Some(cpu_secs()? - c0));
    prog.clear();
    mr.write(mr_len, &Report::of(&out).encode())?;
    tell_done(&conns, &cq, &mr, mr_len, size)?;
    for c in &conns {
        c.qp.disconnect();
    }
    Ok(out)
}

/// The test's end: one signaled RDMA Write of the [`Report`] per QP into the server's buffer,
/// completed before the disconnect (which follows it on the same TCP stream), so that the
/// server tells a finished client from one that died.
fn tell_done(conns: &[ClientQp], cq: &CompletionQueue, mr: &MemoryRegion, src: usize, size: u64) -> Result<()> {
    for (q, c) in conns.iter().enumerate() {
        let remote = RemoteAddr {
            addr: c.reply.addr + done_offset(size) as u64,
            rkey: c.reply.rkey,
        };
        c.qp.post_send_one(
            SendWr::new(
                wr_id(KIND_DONE, q, 0),
                WrOpcode::RdmaWrite { remote },
                vec![mr.sge(src, Report::LEN as u32)],
            )
            .flags(SendFlags::SIGNALED),
        )?;
    }
    let mut done = 0;
    while done < conns.len() {
        let wc = cq
            .wait(Some(T))
            .ok_or_else(|| anyhow!("the end-of-test Write did not complete within {T:?}"))?;
        check(&wc, "end-of-test Write")?;
        if split_wr_id(wc.wr_id).0 == KIND_DONE {
            done += 1;
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
pub(super) enum Stop {
    Iters(u64),
    Time(Duration),
}

/// The stderr progress line (an indicatif spinner, see crate::progress).
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last: std::cell::Cell<Instant>,
}

impl Progress {
    fn new(on: bool, forced: bool, op: Op, size: u64) -> Progress {
        Progress {
            bar: crate::progress::spinner(on, forced, format!("bench {} {} B", op.name(), size)),
            last: std::cell::Cell::new(Instant::now()),
        }
    }
    /// Call often; formats the message at most twice a second.
    pub(super) fn tick(&self, start: Instant, messages: u64, size: u64) {
        let Some(bar) = &self.bar else { return };
        let now = Instant::now();
        if now.duration_since(self.last.get()) < Duration::from_millis(500) {
            return;
        }
        self.last.set(now);
        let s = now.duration_since(start).as_secs_f64();
        bar.set_message(format!(
            "{s:.1} s, {messages} messages, {:.2} Gbit/s, {:.3} M msg/s",
            messages as f64 * size as f64 * 8.0 / s / 1e9,
            messages as f64 / s / 1e6
        ));
        bar.tick();
    }
    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

pub(super) fn check(wc: &WorkCompletion, what: &str) -> Result<()> {
    if wc.is_ok() {
        Ok(())
    } else {
        bail!(
            "{what}: completion with status \"{}\" (vendor error {:#x})",
            wc.status,
            wc.vendor_err
        )
    }
}

const KIND_SHIFT: u32 = 56;
const QP_SHIFT: u32 = 40;
pub(super) const KIND_DATA: u64 = 0;
pub(super) const KIND_RECV: u64 = 1;
pub(super) const KIND_FENCE: u64 = 2;
const KIND_DONE: u64 = 3;

pub(super) fn wr_id(kind: u64, q: usize, n: u64) -> u64 {
    (kind << KIND_SHIFT) | ((q as u64) << QP_SHIFT) | (n & ((1 << QP_SHIFT) - 1))
}

pub(super) fn split_wr_id(id: u64) -> (u64, usize, u64) {
    (
        id >> KIND_SHIFT,
        ((id >> QP_SHIFT) & 0xffff) as usize,
        id & ((1 << QP_SHIFT) - 1),
    )
}
