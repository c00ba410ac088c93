//! `bench --listen`: the server side of a two-process run. One session at a time: a gate
//! thread answers every connect request at once (a second client is refused with the reason),
//! each session has its idle timeout and memory bound, and a failed session is reported with
//! QP and peer (the resource model in the parent module's docs).

use super::*;

/// Serves one client session: tests until the one flagged last.
/// Takes every connect request off the listener while the server runs, so that a second
/// client is answered at once: requests of the session being served (the first client's
/// [`Hello::session`]) go to the session loop; others are rejected with the reason in the
/// reject's private data, and so are bad hellos and sessions over the memory cap.
/// Wakes twice a second to notice `stop`.
pub(super) fn gate(
    listener: &Listener,
    tx: std::sync::mpsc::Sender<(ConnectRequest, Hello)>,
    stop: &AtomicBool,
    limits: Limits,
) {
    let mut owner: Option<(u32, SocketAddr)> = None;
    while !stop.load(Ordering::Acquire) {
        let req = match listener.get_request(Some(Duration::from_millis(500))) {
            Ok(r) => r,
            Err(Error::Timeout) => continue,
            Err(_) => return,
        };
        let peer = req.peer_addr();
        let refuse = |req: ConnectRequest, why: String| {
            eprintln!("bench server: refusing {peer}: {why}");
            let _ = req.reject(format!("softrdma bench: {why}").as_bytes());
        };
        let hello = match Hello::decode(req.private_data()) {
            Ok(h) => h,
            Err(e) => {
                refuse(req, format!("bad hello: {e}"));
                continue;
            }
        };
        let mem = (buffer_len(hello.size) as u64 + 64).saturating_mul(hello.qps as u64);
        if mem > limits.max_mem {
            refuse(
                req,
                format!(
                    "{} QPs of {} bytes exceed the server's --max-session-mem {}",
                    hello.qps, hello.size, limits.max_mem
                ),
            );
            continue;
        }
        match owner {
            None => owner = Some((hello.session, peer)),
            Some((id, _)) if id == hello.session => {}
            Some((_, first)) => {
                refuse(
                    req,
                    format!("busy: serving the session of {first}; one client at a time"),
                );
                continue;
            }
        }
        if tx.send((req, hello)).is_err() {
            return;
        }
    }
}

pub(super) fn serve(dev: &Device, listener: &Listener, tcp: Option<TcpServer>, limits: Limits) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| gate(listener, tx, &stop, limits));
        let r = serve_session(dev, &rx, tcp, limits);
        stop.store(true, Ordering::Release);
        r.context("bench server: session failed")
    })
}

/// Serves the tests of one client session (see [`gate`]); an error when the client went
/// silent or a test failed.
pub(super) fn serve_session(
    dev: &Device,
    rx: &std::sync::mpsc::Receiver<(ConnectRequest, Hello)>,
    tcp: Option<TcpServer>,
    limits: Limits,
) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let mut tests = 0u32;
    let mut client: Option<SocketAddr> = None;
    loop {
        let mut conns: Vec<(QueuePair, CompletionQueue, MemoryRegion, Hello)> = Vec::new();
        let mut want = 1usize;
        while conns.len() < want {
            let (req, hello) = match (client, limits.idle) {
                (None, _) | (_, None) => rx.recv().map_err(|_| anyhow!("listener closed"))?,
                (Some(c), Some(idle)) => match rx.recv_timeout(idle) {
                    Ok(x) => x,
                    Err(_) => bail!(
                        "client {c} went silent: peer closed its connections after {tests} test(s) and \
                         opened none for the next within {} s (--idle-timeout)",
                        idle.as_secs()
                    ),
                },
            };
            if hello.test_id != tests || hello.qp_index as usize != conns.len() {
                eprintln!(
                    "bench server: refusing {}: test {} QP {} out of order (expected test {tests} QP {})",
                    req.peer_addr(),
                    hello.test_id,
                    hello.qp_index,
                    conns.len()
                );
                let _ = req.reject(b"softrdma bench: test or QP out of order");
                continue;
            }
            client.get_or_insert(req.peer_addr());
            want = hello.qps as usize;
            // [0, L): the client's messages; byte L: the READY value for the client's ready byte.
            let mr = pd.reg_mr(buffer_len(hello.size) + 64, Access::all_remote())?;
            mr.write(buffer_len(hello.size), &[READY])?;
            let (credits, grant) = send_credits(hello.depth);
            let cq = dev.create_cq(credits as usize + 256)?;
            let reply = Reply {
                addr: mr.addr(),
                rkey: mr.rkey(),
                credits,
                grant,
                tcp_port: tcp.as_ref().map_or(0, |t| t.port),
            };
            let opts = QpOptions::new(&cq)
                .attr(qp_attr(64, credits + 8))
                .rd_atomic(RD_ATOMIC, RD_ATOMIC)
                .private_data(&reply.encode());
            let qp = req.accept(&pd, opts)?;
            conns.push((qp, cq, mr, hello));
        }
        let last = conns.iter().any(|c| c.3.flags & FLAG_LAST != 0);
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = conns
                .iter()
                .map(|(qp, cq, mr, hello)| {
                    s.spawn(move || {
                        serve_qp(qp, cq, mr, hello, limits)
                            .with_context(|| format!("QP {} with peer {}", qp.qp_num(), qp.conn_info().peer_addr))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("server QP thread panicked"))))
                .collect()
        });
        let mut failed = results.into_iter().filter_map(Result::err).collect::<Vec<_>>();
        // Every test ends with the client's disconnect; one that finished its test wrote
        // its Report into our buffer first. Without it the client died or was interrupted.
        let mut report = None;
        for (qp, _, mr, hello) in &conns {
            let mut b = [0u8; Report::LEN];
            mr.read(done_offset(hello.size), &mut b)?;
            report = report.or(Report::decode(&b));
            if Report::decode(&b).is_none() && failed.is_empty() {
                failed.push(anyhow!(
                    "QP {} with peer {}: the client disconnected before the end of its test \
                     (it exited or was killed)",
                    qp.qp_num(),
                    qp.conn_info().peer_addr
                ));
            }
        }
        // The first failure is the session's error; any others are said here.
        for e in failed.iter().skip(1) {
            eprintln!("bench server: test {tests}: {e:#}");
        }
        if let Some(e) = failed.into_iter().next() {
            return Err(e.context(format!("test {tests} failed")));
        }
        if let (Some(unit), Some(r)) = (limits.report, report) {
            print_report(
                tests == 0,
                unit,
                &conns[0].3,
                &r,
                client,
                crate::providers::transport(dev),
            );
        }
        tests += 1;
        if last && limits.report.is_some() && report.is_some() {
            println!("{}", "-".repeat(87));
        }
        if last {
            // Stay until the client's baseline runs, which follow each test, are over.
            let h = &conns[0].3;
            if let Some(t) = &tcp
                && h.flags & FLAG_BASELINE != 0
            {
                let per_test = if h.lat() { 1 } else { h.qps as u64 };
                t.wait_done((h.test_id as u64 + 1) * per_test);
            }
            if let Some(u) = tcp.as_ref().and_then(|t| t.udp.as_ref())
                && h.flags & FLAG_BASELINE_UDP != 0
            {
                u.wait_done(h.test_id as u64 + 1);
            }
            return Ok(());
        }
    }
}

/// How a test's connection ended: `Ok` when the client closed it, gracefully or by a reset
/// (how every test ends: a client that exits with unread data in its socket, or is killed,
/// resets the connection instead of closing it; whether it finished its test first is for its
/// [`Report`] to say), an error naming the cause otherwise.
pub(super) fn ended(ev: Option<CmEvent>) -> Option<Result<()>> {
    match ev? {
        CmEvent::Disconnected | CmEvent::ConnectionError(_) => Some(Ok(())),
        CmEvent::ErrorReceived(t) => Some(Err(anyhow!("fatal error received from the peer: {t}"))),
        CmEvent::ErrorSent(t) => Some(Err(anyhow!("fatal error sent to the peer: {t}"))),
        CmEvent::Established => None,
    }
}

/// After a failed completion: the event that explains it (queued before the completions
/// the engine flushed), or the completion itself. A flush after a plain disconnect is how
/// a Send test ends.
pub(super) fn failed(qp: &QueuePair, wc: &WorkCompletion) -> Result<()> {
    while let Some(ev) = qp.get_event(Some(Duration::from_millis(200))) {
        match ended(Some(ev)) {
            Some(Ok(())) if wc.status == WcStatus::WrFlushErr => return Ok(()),
            Some(Ok(())) => break,
            Some(Err(e)) => {
                return Err(e.context(format!("completion {} (vendor_err {:#x})", wc.status, wc.vendor_err)));
            }
            None => {}
        }
    }
    bail!(
        "completion {:?} {} (vendor_err {:#x})",
        wc.opcode,
        wc.status,
        wc.vendor_err
    )
}

/// The server's part of one QP's test; returns when the client disconnects, or an error
/// when the connection failed or the client went silent ([`Limits`]).
pub(super) fn serve_qp(
    qp: &QueuePair,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    hello: &Hello,
    limits: Limits,
) -> Result<()> {
    let size = hello.size as u32;
    let (echo_off, ready_off, _) = client_layout(hello.size, hello.qps);
    let client = |off: usize| RemoteAddr {
        addr: hello.client_addr + off as u64,
        rkey: hello.client_rkey,
    };
    // Tell the client our receives are posted (call after posting them).
    let ready = || {
        qp.post_send_one(SendWr::new(
            u64::MAX,
            WrOpcode::RdmaWrite {
                remote: client(ready_off + hello.qp_index as usize),
            },
            vec![mr.sge(buffer_len(hello.size), 1)],
        ))
    };
    // Two-sided tests: the time since the client's last message.
    let mut last_msg = Instant::now();
    let silent = |last: Instant| -> Result<()> {
        match limits.idle {
            Some(idle) if last.elapsed() >= idle => bail!(
                "client idle: no message for {} s (--idle-timeout); dropping it",
                idle.as_secs()
            ),
            _ => Ok(()),
        }
    };
    match (hello.op, hello.lat()) {
        (Op::Write | Op::Read | Op::Atomic, false) | (Op::Read | Op::Atomic, true) => {
            // One-sided: the provider answers; the application only waits, asleep.
            let until = limits.max_test.map(|m| Instant::now() + m);
            loop {
                let wait = until.map(|u| u.saturating_duration_since(Instant::now()));
                if wait == Some(Duration::ZERO) {
                    bail!(
                        "one-sided test still connected after {} s (--max-test-secs); dropping it",
                        limits.max_test.unwrap_or_default().as_secs()
                    );
                }
                if let Some(r) = ended(qp.get_event(wait)) {
                    return r;
                }
            }
        }
        (Op::Send, false) => {
            let (credits, grant) = send_credits(hello.depth);
            let recv = |n: u64| RecvWr {
                wr_id: n,
                sg_list: vec![mr.sge(0, size)],
            };
            let wrs: Vec<RecvWr> = (0..credits as u64).map(recv).collect();
            qp.post_recv(&wrs)?;
            ready()?;
            let mut since_grant = 0u32;
            let mut sent = 0u64;
            loop {
                // The engine queues every event before the completions it flushes, and
                // receives are always posted: the CQ wakes us for a disconnect too.
                match cq.wait(Some(Duration::from_millis(500))) {
                    Some(wc) if wc.is_ok() => {
                        if wc.opcode == WcOpcode::Recv {
                            last_msg = Instant::now();
                            qp.post_recv(&[recv(wc.wr_id)])?;
                            since_grant += 1;
                            if since_grant == grant {
                                since_grant = 0;
                                sent += 1;
                                qp.post_send_one(SendWr::new(u64::MAX - sent, WrOpcode::Send, vec![mr.sge(0, 8)]))?;
                            }
                        }
                    }
                    Some(wc) => return failed(qp, &wc),
                    None => {
                        if let Some(r) = ended(qp.get_event(Some(Duration::ZERO))) {
                            return r;
                        }
                        silent(last_msg)?;
                    }
                }
            }
        }
        (Op::Send, true) => {
            let recv = |n: u64| RecvWr {
                wr_id: n,
                sg_list: vec![mr.sge(0, size)],
            };
            qp.post_recv(&[recv(0), recv(1)])?;
            ready()?;
            // The next reply's work request, built while waiting (off the round trip, as
            // perftest prepares its WRs); its length is set from the message it answers.
            let reply = || SendWr::new(0, WrOpcode::Send, vec![mr.sge(0, size)]);
            let mut next = Some(reply());
            let mut n = 2;
            let mut idle = 0u32;
            let events = hello.flags & FLAG_EVENTS != 0;
            loop {
                // Busy-poll while messages flow (latency); after 100 ms without one, sleep
                // on the CQ instead of spinning.
                let sleepy = events || idle >= 4096 && last_msg.elapsed() > Duration::from_millis(100);
                let wc = if sleepy {
                    cq.wait_spin(Duration::ZERO, Some(Duration::from_millis(100)))
                } else {
                    cq.poll_one()
                };
                match wc {
                    Some(wc) if wc.is_ok() => {
                        idle = 0;
                        if wc.opcode == WcOpcode::Recv {
                            // The reply first, then the receive it replaces: a spare receive is
                            // posted (two at the start), and the client sends its next message
                            // only after this reply, so the re-post is off the round trip
                            // (as a TCP ping-pong server writes its reply at once).
                            let mut wr = next.take().unwrap_or_else(reply);
                            wr.sg_list[0].length = wc.byte_len;
                            qp.post_send_one(wr)?;
                            qp.post_recv(&[recv(n)])?;
                            next = Some(reply());
                            n += 1;
                            last_msg = Instant::now();
                        }
                    }
                    Some(wc) => return failed(qp, &wc),
                    None => {
                        idle = idle.saturating_add(1);
                        if sleepy || idle.is_multiple_of(4096) {
                            if let Some(r) = ended(qp.get_event(Some(Duration::ZERO))) {
                                return r;
                            }
                            silent(last_msg)?;
                        }
                        if !sleepy {
                            std::hint::spin_loop();
                        }
                    }
                }
            }
        }
        (Op::Write, true) => {
            let last = size as usize - 1;
            let remote = client(echo_off);
            let mut wcs = Vec::new();
            let mut b = [0u8];
            let mut i = 0u64;
            let mut idle = 0u32;
            loop {
                wcs.clear();
                cq.poll(&mut wcs, 16);
                if let Some(wc) = wcs.iter().find(|wc| !wc.is_ok()) {
                    return failed(qp, wc);
                }
                mr.read(last, &mut b)?;
                if b[0] == stamp(i) {
                    idle = 0;
                    let flags = if i % 64 == 63 {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::empty()
                    };
                    qp.post_send_one(
                        SendWr::new(i, WrOpcode::RdmaWrite { remote }, vec![mr.sge(0, size)]).flags(flags),
                    )?;
                    last_msg = Instant::now();
                    i += 1;
                } else {
                    idle = idle.saturating_add(1);
                    // The client's Writes stopped for 100 ms: poll the memory every 10 ms.
                    let sleepy = idle >= 4096 && last_msg.elapsed() > Duration::from_millis(100);
                    if sleepy || idle.is_multiple_of(4096) {
                        if let Some(r) = ended(qp.get_event(Some(Duration::ZERO))) {
                            return r;
                        }
                        silent(last_msg)?;
                    }
                    if sleepy {
                        std::thread::sleep(Duration::from_millis(10));
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }
}

/// The server's copy of a test's result (the client's [`Report`]), as a perftest server
/// prints its client's figures: a header before the first test, then one row per test.
fn print_report(first: bool, unit: Unit, h: &Hello, r: &Report, client: Option<SocketAddr>, transport: &str) {
    let line = "-".repeat(87);
    let iters = r.messages / h.qps.max(1) as u64;
    if first {
        println!("{line}");
        println!(
            "                    {} {} Test (server side: the client's figures)",
            h.op.title(),
            if h.lat() { "Latency" } else { "BW" }
        );
        if let Some(c) = client {
            println!(" Client          : {c}");
        }
        println!(" Number of qps   : {:<10} Transport type : {transport}", h.qps);
        println!("{line}");
        if h.lat() {
            println!(" #bytes   #iterations  t_p50[usec] t_avg[usec]");
        } else {
            let u = unit.label();
            println!(" #bytes     #iterations   BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]");
        }
    }
    if h.lat() {
        let avg = if r.messages > 0 {
            r.secs * 1e6 / r.messages as f64
        } else {
            0.0
        };
        println!(
            " {:<8} {:<12} {:<11.2} {:.2}",
            h.size,
            iters,
            r.p50_ns as f64 / 1000.0,
            avg
        );
    } else {
        let gbit = if r.secs > 0.0 {
            r.messages as f64 * h.size as f64 * 8.0 / r.secs / 1e9
        } else {
            0.0
        };
        let rate = if r.secs > 0.0 {
            r.messages as f64 / r.secs / 1e6
        } else {
            0.0
        };
        println!(
            " {:<10} {:<13} {:<18.2} {:<20.2} {:.6}",
            h.size,
            iters,
            unit.convert_gbit(r.peak_gbit),
            unit.convert_gbit(gbit),
            rate
        );
    }
}
