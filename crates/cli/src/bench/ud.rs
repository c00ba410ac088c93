//! `softrdma bench send --ud`: UD Send message rate on one QP (issue 14), both ends in this
//! process on loopback addresses, with `--baseline udp` a plain UDP socket sending
//! datagrams of the same sizes in the same run.
//!
//! The sender posts `--depth` Sends per `post_send` (one signaled in every `depth/4`, as the
//! other bandwidth tests), each to the receiver's QP through one address handle; a UD Send
//! completes when its datagram is handed to the kernel, so the sender's rate is what the
//! stack takes. The receiver thread keeps 4,096 receives posted and counts what arrives:
//! UD is unreliable, so the table shows both rates and the loss. The UDP baseline does the
//! same with `send_to` of one datagram at a time to a receiving thread.
//!
//! The figures are for a quiet machine: the merger measures them with
//! `softrdma bench send --ud --provider roce --sizes 64,1024 -D 3 --baseline udp`.

use super::*;
use std::net::UdpSocket;
use std::sync::atomic::AtomicU64;

/// Receives the receiver keeps posted.
const RQ: u32 = 4096;
const QKEY: u32 = 0x0bec_0001;

/// One size's result.
#[derive(serde::Serialize, Debug, Clone)]
struct UdResult {
    test: &'static str,
    size: u64,
    secs: f64,
    sent: u64,
    received: u64,
    sent_mpps: f64,
    received_mpps: f64,
    received_mb_per_s: f64,
    udp_sent_mpps: Option<f64>,
    udp_received_mpps: Option<f64>,
    /// UD sent rate / UDP sent rate (higher is better).
    ratio: Option<f64>,
    /// CPU time (user + system) of the sending thread per UD Send, in microseconds: what
    /// posting and handing the datagram to the kernel costs, robust to a loaded machine.
    cpu_us_per_msg: Option<f64>,
    /// The same for the UDP socket's `send_to`.
    udp_cpu_us_per_msg: Option<f64>,
    /// UDP CPU per message / UD CPU per message (higher is better for UD).
    cpu_ratio: Option<f64>,
}

/// Runs the UD message-rate test for every size of `args`.
pub(super) fn run(args: &Args, flags: &[crate::providers::Flag]) -> Result<()> {
    use crate::providers::Endpoint;
    if args.connect.is_some() || args.lat || args.qps != 1 {
        bail!("--ud measures the message rate of one UD QP in this process: drop --connect, --lat and --qps");
    }
    if !args.loopback.is_loopback() {
        bail!("--loopback {}: not a 127.0.0.0/8 address", args.loopback);
    }
    let here: IpAddr = args.loopback.into();
    let rdev = crate::providers::open(&args.dev, flags, Endpoint::Listen(here))?;
    let sdev = crate::providers::open(&args.dev, flags, Endpoint::LoopbackClient(here))?;
    let mtu = u64::from(rdev.query_port(1)?.active_mtu.bytes());
    let sizes: Vec<u64> = if !args.sizes.is_empty() {
        args.sizes.clone()
    } else if let Some(s) = args.size {
        vec![s]
    } else {
        vec![64, mtu]
    };
    if let Some(&s) = sizes.iter().find(|&&s| s > mtu) {
        bail!("a UD message is at most the MTU ({mtu} bytes), not {s}");
    }
    if !args.json {
        println!(
            "UD Send message rate, one QP, {} -> {} ({})",
            sdev.query_gid(1, 0)?.to_ip(),
            rdev.query_gid(1, 0)?.to_ip(),
            crate::providers::label(&rdev)
        );
        println!(
            " {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8}",
            "#bytes",
            "sent",
            "Mpps sent",
            "Mpps rcvd",
            "MB/s rcvd",
            "UDP Mpps",
            "UDP rcvd",
            "UD/UDP",
            "us/msg",
            "UDP us",
            "CPU x"
        );
    }
    for &size in &sizes {
        let mut r = ud_rate(&sdev, &rdev, args, size)?;
        if args.baseline.as_deref() == Some("udp") {
            let (s, rc, cpu) = udp_rate(here, args, size)?;
            r.udp_sent_mpps = Some(s);
            r.udp_received_mpps = Some(rc);
            r.ratio = Some(r.sent_mpps / s);
            r.udp_cpu_us_per_msg = cpu;
            r.cpu_ratio = cpu.zip(r.cpu_us_per_msg).map(|(u, d)| u / d);
        }
        if args.json {
            crate::report::print_line(&r);
        } else {
            let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
            println!(
                " {:>8} {:>10} {:>10.3} {:>10.3} {:>10.1} {:>10} {:>10} {:>8} {:>9} {:>9} {:>8}",
                r.size,
                r.sent,
                r.sent_mpps,
                r.received_mpps,
                r.received_mb_per_s,
                opt(r.udp_sent_mpps, 3),
                opt(r.udp_received_mpps, 3),
                opt(r.ratio, 2),
                opt(r.cpu_us_per_msg, 2),
                opt(r.udp_cpu_us_per_msg, 2),
                opt(r.cpu_ratio, 2)
            );
        }
    }
    Ok(())
}

/// How long to run: `-D` seconds, or until `-n` messages (default 200,000) are sent.
fn until(args: &Args) -> (Option<Duration>, u64) {
    match args.duration {
        Some(d) => (Some(Duration::from_secs_f64(d)), u64::MAX),
        None => (None, args.iters.unwrap_or(200_000)),
    }
}

fn ud_qp(dev: &Device, depth: u32) -> Result<(ProtectionDomain, CompletionQueue, QueuePair, MemoryRegion)> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(2 * (RQ + depth) as usize + 64)?;
    let mut init = QpInit::new(QpType::Ud, &cq);
    init.cap.max_send_wr = depth.max(1);
    init.cap.max_recv_wr = RQ;
    let qp = pd.create_qp(init)?;
    qp.modify_qp(&QpAttr::init_ud(1, 0, QKEY))?;
    qp.modify_qp(&QpAttr::state(QpState::Rtr))?;
    qp.modify_qp(&QpAttr {
        sq_psn: Some(0),
        ..QpAttr::state(QpState::Rts)
    })?;
    let mr = pd.reg_mr(RQ as usize * 4200 + 8192, Access::LOCAL_WRITE)?;
    Ok((pd, cq, qp, mr))
}

fn ud_rate(sdev: &Device, rdev: &Device, args: &Args, size: u64) -> Result<UdResult> {
    let depth = args.depth.min(1024);
    let (_rpd, rcq, rqp, rmr) = ud_qp(rdev, depth)?;
    let (spd, scq, sqp, smr) = ud_qp(sdev, depth)?;
    let slot = 40 + size;
    let recv = |i: u64| RecvWr {
        wr_id: i,
        sg_list: vec![Sge {
            addr: rmr.addr() + i * slot,
            length: slot as u32,
            lkey: rmr.lkey(),
        }],
    };
    let all: Vec<RecvWr> = (0..u64::from(RQ)).map(recv).collect();
    rqp.post_recv(&all)?;
    let received = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| -> Result<UdResult> {
        let rx = sc.spawn(|| -> Result<()> {
            let mut wcs = Vec::with_capacity(256);
            while !stop.load(Ordering::Relaxed) {
                wcs.clear();
                if rcq.poll(&mut wcs, 256) == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let again: Vec<RecvWr> = wcs.iter().map(|w| recv(w.wr_id)).collect();
                received.fetch_add(wcs.iter().filter(|w| w.is_ok()).count() as u64, Ordering::Relaxed);
                rqp.post_recv(&again)?;
            }
            Ok(())
        });
        let r = send_loop(&spd, &scq, &sqp, &smr, rdev, rqp.qp_num(), args, size, depth);
        settle(&received, r.as_ref().map_or(0, |r| r.0));
        stop.store(true, Ordering::Relaxed);
        rx.join().map_err(|_| anyhow!("the UD receiver thread panicked"))??;
        let (sent, secs, cpu) = r?;
        let received = received.load(Ordering::Relaxed);
        Ok(UdResult {
            test: "ud_send_rate",
            size,
            secs,
            sent,
            received,
            sent_mpps: sent as f64 / secs / 1e6,
            received_mpps: received as f64 / secs / 1e6,
            received_mb_per_s: received as f64 * size as f64 / secs / (1 << 20) as f64,
            udp_sent_mpps: None,
            udp_received_mpps: None,
            ratio: None,
            cpu_us_per_msg: cpu.map(|c| c * 1e6 / sent.max(1) as f64),
            udp_cpu_us_per_msg: None,
            cpu_ratio: None,
        })
    })
}

/// The sender: `depth` Sends per post until the time or count is up; (sent, seconds, this
/// thread's CPU seconds).
#[allow(clippy::too_many_arguments)]
fn send_loop(
    spd: &ProtectionDomain,
    scq: &CompletionQueue,
    sqp: &QueuePair,
    smr: &MemoryRegion,
    rdev: &Device,
    rqpn: u32,
    args: &Args,
    size: u64,
    depth: u32,
) -> Result<(u64, f64, Option<f64>)> {
    let to = UdDest {
        ah: spd.create_ah(&AhAttr::to_gid(rdev.query_gid(1, 0)?))?,
        remote_qpn: rqpn,
        remote_qkey: QKEY,
    };
    let cq_mod = (depth / 4).clamp(1, 64);
    let batch: Vec<SendWr> = (0..depth)
        .map(|i| {
            let flags = if (i + 1) % cq_mod == 0 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            SendWr::new(
                u64::from(i),
                WrOpcode::Send,
                vec![Sge {
                    addr: smr.addr(),
                    length: size as u32,
                    lkey: smr.lkey(),
                }],
            )
            .flags(flags)
            .ud(to.clone())
        })
        .collect();
    let signaled = u64::from(depth / cq_mod);
    let (dur, iters) = until(args);
    let cpu0 = crate::procstat::thread_cpu_secs();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut wcs = Vec::with_capacity(64);
    loop {
        if sent >= iters || dur.is_some_and(|d| start.elapsed() >= d) {
            break;
        }
        sqp.post_send(&batch)?;
        sent += u64::from(depth);
        // Every send completes when handed over: reap this batch's signaled completions.
        let mut got = 0;
        while got < signaled {
            wcs.clear();
            got += scq.poll(&mut wcs, 64) as u64;
            if let Some(w) = wcs.iter().find(|w| !w.is_ok()) {
                bail!("UD send failed: {:?}", w.status);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0.zip(crate::procstat::thread_cpu_secs()).map(|(a, b)| b - a);
    Ok((sent, secs, cpu))
}

/// Waits until the receiver has counted `sent` messages or its count stopped moving for
/// 200 ms (the rest were lost; 2 s while nothing came): on a busy machine the receiving
/// threads may run late.
fn settle(received: &AtomicU64, sent: u64) {
    let mut last = u64::MAX;
    let mut still = 0;
    loop {
        let now = received.load(Ordering::Relaxed);
        if still >= if now == 0 { 100 } else { 10 } {
            return;
        }
        if now >= sent {
            return;
        }
        if now == last {
            still += 1;
        } else {
            still = 0;
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The baseline: `send_to` of `size`-octet datagrams from one UDP socket to another on
/// loopback, a thread receiving; (sent, received) in millions per second and the sending
/// thread's CPU microseconds per datagram.
fn udp_rate(here: IpAddr, args: &Args, size: u64) -> Result<(f64, f64, Option<f64>)> {
    let r = UdpSocket::bind(SocketAddr::new(here, 0))?;
    r.set_read_timeout(Some(Duration::from_millis(50)))?;
    let to = r.local_addr()?;
    let s = UdpSocket::bind(SocketAddr::new(here, 0))?;
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let rx = {
        let (stop, received) = (stop.clone(), received.clone());
        std::thread::Builder::new().name("bench-udp-rx".into()).spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                if r.recv(&mut buf).is_ok() {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        })?
    };
    let msg = vec![0x5au8; size as usize];
    let (dur, iters) = until(args);
    let cpu0 = crate::procstat::thread_cpu_secs();
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < iters && dur.is_none_or(|d| start.elapsed() < d) {
        for _ in 0..64 {
            if s.send_to(&msg, to).is_ok() {
                sent += 1;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu0
        .zip(crate::procstat::thread_cpu_secs())
        .map(|(a, b)| (b - a) * 1e6 / sent.max(1) as f64);
    settle(&received, sent);
    stop.store(true, Ordering::Relaxed);
    rx.join().map_err(|_| anyhow!("the UDP receiver thread panicked"))?;
    let received = received.load(Ordering::Relaxed);
    Ok((sent as f64 / secs / 1e6, received as f64 / secs / 1e6, cpu))
}
