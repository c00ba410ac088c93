//! One perftest session: the comm connection's exchanges, the data connection, the test
//! itself and the closing exchanges (steps 1-5 of the module doc of [`super`]).

use anyhow::{Context, Result, anyhow, bail};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use verbs::*;

use super::bw::{bw_rdma_client, send_bw_client, send_bw_server};
use super::comm::{Comm, comm_parts};
use super::lat::{read_lat, send_lat, write_lat};
use super::report::print_header;
use super::ud;
use super::wire::{self, BwReport, PingpongDest};
use super::{Args, CACHE_LINE, CYCLE_BUFFER, Data, MTU, Measured, Outcome, Params, Role, Test, Verb};

pub(super) fn session(dev: &Device, args: &Args, mut p: Params, role: Role) -> Result<Outcome> {
    let step = Duration::from_secs(args.timeout.max(1));
    let pd = dev.alloc_pd()?;
    let client = matches!(role, Role::Client(_));
    let role_name = if client { "client" } else { "server" };

    // 1. comm connection.
    let parts = comm_parts(dev, &pd)?;
    let opts = parts.opts.clone();
    let mut listen_again = None;
    let (comm_qp, peer_addr) = match role {
        Role::Client(addr) => {
            let retry = Duration::from_secs(args.connect_timeout.clamp(1, args.timeout.max(1)));
            let waiting = crate::net::Notice::new(format!(
                "perftest client: waiting for a perftest server on {addr}; retrying for up to {} s \
                 (--connect-timeout)",
                retry.as_secs()
            ));
            let qp = connect_retry(&pd, addr, &opts, retry).context("comm connection (rdma_client_connect)")?;
            drop(waiting);
            std::thread::sleep(Duration::from_millis(args.first_send_delay_ms));
            (qp, addr)
        }
        Role::Server(addr) => {
            let l = dev.listen(addr).with_context(|| format!("listening on {addr}"))?;
            if addr.port() == 0 {
                // `-p 0`: the system chose the port; say which, so a caller (a test) can use it
                // without finding a free port first and racing others for it.
                eprintln!("perftest server: listening on {}", l.local_addr());
            }
            if !args.json {
                println!("\n************************************");
                println!("* Waiting for client to connect... *");
                println!("************************************");
            }
            let req = l
                .get_request(None)
                .context("waiting for the comm connection (rdma_server_connect)")?;
            let peer = req.peer_addr();
            let qp = req.accept(&pd, opts).context("accepting the comm connection")?;
            // As perftest: the listener goes once the comm connection is accepted, so a
            // second client is refused while this one is served; the data connection
            // gets a listener of its own on the same address.
            listen_again = Some(l.local_addr());
            drop(l);
            (qp, peer)
        }
    };
    let mut comm = Comm::new(comm_qp, parts, client, step);

    // 2. versions, sys data, MTU.
    let v = comm.xchg(&wire::encode_version(), "version")?;
    let peer = wire::decode_version(&v)?;
    let peer_name = if peer.softrdma {
        format!("softrdma (perftest {})", peer.text)
    } else {
        format!("perftest {}", peer.text)
    };
    let c = comm.xchg(&wire::encode_int(CYCLE_BUFFER), "cycle buffer")?;
    wire::decode_int("cycle buffer", &c)?;
    let c = comm.xchg(&wire::encode_int(CACHE_LINE), "cache line size")?;
    wire::decode_int("cache line size", &c)?;
    // check_mtu: both state their port's MTU and use the smaller (a peer's value outside
    // 1..=5 is ignored); -c UD then fits the message size to it.
    let ours = if p.iwarp {
        MTU
    } else {
        dev.query_port(1).map(|a| a.active_mtu.bytes()).unwrap_or(MTU)
    };
    let m = comm.xchg(&wire::encode_mtu(wire::mtu_enum(ours)), "MTU")?;
    p.mtu = match wire::decode_mtu(&m)? {
        Some(e) => ours.min(wire::mtu_bytes(e)),
        None => ours,
    };
    if p.ud {
        ud::fit_size(&mut p)?;
    }

    // 3. the data connection between two syncs.
    let zero = PingpongDest::default();
    comm.hand_shake(&zero, "sync before the data connection")?;
    let data = if p.ud {
        ud::data_connection(dev, &pd, &p, role, listen_again, peer_addr, step)?
    } else {
        data_connection(dev, &pd, &p, role, listen_again, peer_addr, step, peer.softrdma)?
    };
    comm.hand_shake(&zero, "sync after the data connection")?;

    // 4. addresses.
    // A UD QP has no connection: its address is the comm connection's (the same device).
    let addr_qp = if p.ud { &comm.qp } else { &data.qp };
    let local_ip = match addr_qp.conn_info().local_addr.ip() {
        IpAddr::V4(a) => a,
        IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&local_ip.octets());
    let (rkey, vaddr) = match &data.credit {
        Some(c) => (c.rkey(), c.addr() + 4),
        None => (data.mr.rkey(), data.mr.addr() + p.half as u64),
    };
    let my = PingpongDest {
        lid: 0,
        out_reads: p.out_reads,
        qpn: data.qp.qp_num(),
        psn: psn(),
        rkey,
        vaddr,
        gid,
        srqn: 0,
        gid_index: 0,
    };
    // The payload goes in before the exchanges that tell the peer where it is: a read_bw
    // client reads the server's target as soon as the last exchange reaches it, so a pattern
    // written after it could be read before it was there (under load the check failed with
    // "the RDMA Read target does not hold the pattern": issue 18's perftest_loopback flake).
    let verify = peer.softrdma;
    let src = pattern(p.size as usize);
    data.mr.write(0, &src).map_err(|_| anyhow!("data region"))?;
    if verify && p.test.verb() == Verb::Read && !client {
        data.mr.write(p.half, &src).map_err(|_| anyhow!("data region"))?;
    }
    let mut rem: Option<PingpongDest> = None;
    for i in 0..p.test.preamble() {
        let d = comm.hand_shake(&my, "pingpong_dest")?;
        if let Some(prev) = rem
            && !prev.same_qp(&d)
        {
            bail!(
                "the peer's pingpong_dest changed in exchange {}: {prev:?} then {d:?}",
                i + 1
            );
        }
        rem = Some(d);
    }
    let rem = rem.expect("preamble has exchanges");
    std::thread::sleep(Duration::from_millis(args.pause_after_exchange_ms));
    if !args.json {
        print_header(&p, role_name, &peer_name, &my, &rem);
    }

    // 5. traffic and the closing exchanges.
    let deadline = Instant::now() + step + Duration::from_millis(p.iters); // generous
    let measured = match (p.test, client) {
        (Test::WriteBw | Test::ReadBw, true) => {
            let (report, verified) = bw_rdma_client(&data, &p, &rem, verify, deadline)?;
            comm.hand_shake(&my, "sync after the traffic")?;
            for (f, name) in report.encode().iter().zip(REPORT_FIELDS) {
                comm.xchg(f, name)?; // the server's fields are uninitialised in perftest
            }
            Measured::Bw {
                report,
                from_peer: false,
                verified,
            }
        }
        (Test::WriteBw | Test::ReadBw, false) => {
            comm.hand_shake(&my, "sync after the traffic")?;
            let mut fields = Vec::new();
            for (f, name) in BwReport::default().encode().iter().zip(REPORT_FIELDS) {
                fields.push(comm.xchg(f, name)?);
            }
            let report = BwReport::decode(&fields)?;
            let verified = if p.test == Test::WriteBw {
                "none on the target (the client verifies by reading back)".into()
            } else {
                "none (the client reads)".into()
            };
            Measured::Bw {
                report,
                from_peer: true,
                verified,
            }
        }
        (Test::SendBw, true) => {
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let report = send_bw_client(&data, &p, &rem, deadline)?;
            Measured::Bw {
                report,
                from_peer: false,
                verified: if p.iwarp {
                    format!("{} Send completions, credits from the receiver", p.iters)
                } else {
                    format!("{} Send completions", p.iters)
                },
            }
        }
        (Test::SendBw, false) => {
            let posted = post_recvs(&data, &p, p.rx_depth as u64)?;
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let (report, verified) = send_bw_server(&data, &p, &rem, posted, verify, deadline)?;
            Measured::Bw {
                report,
                from_peer: false,
                verified,
            }
        }
        (Test::WriteLat, _) => {
            let (lat, verified) = write_lat(&data, &p, &rem, client, deadline)?;
            Measured::Lat { lat, verified }
        }
        (Test::ReadLat, true) => {
            let (lat, verified) = read_lat(&data, &p, &rem, verify, deadline)?;
            Measured::Lat { lat, verified }
        }
        (Test::ReadLat, false) => Measured::Nothing,
        (Test::SendLat, _) => {
            let posted = post_recvs(&data, &p, p.rx_depth as u64)?;
            comm.hand_shake(&my, "sync before the traffic (receives posted)")?;
            let (lat, verified) = send_lat(&data, &p, client, posted, verify, deadline)?;
            Measured::Lat { lat, verified }
        }
    };
    // `ctx_close_connection`: one last `pingpong_dest`, in every test but ib_write_lat.
    if p.test != Test::WriteLat {
        comm.hand_shake(&my, "ctx_close_connection")?;
    }
    let out = Outcome {
        peer: peer_name,
        role: role_name,
        measured,
        p,
    };

    // perftest does not disconnect a UD data QP (`rdma_cm_disconnect_nodes` skips UD).
    let data_qp = (!p.ud).then_some(&data.qp);
    teardown(&comm.qp, data_qp, !peer.softrdma);
    Ok(out)
}

/// Waits up to `secs` for the peer to close `qp` (or for our own close to complete).
pub(super) fn await_disconnect(qp: &QueuePair, secs: f64) -> bool {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    while let Some(ev) = qp.get_event(Some(until.saturating_duration_since(Instant::now()))) {
        if matches!(ev, CmEvent::Disconnected | CmEvent::ConnectionError(_)) {
            return true;
        }
    }
    false
}

/// perftest's `destroy_ctx` order: the data connection first, then comm. Linux siw completed
/// a Send or Write with IBV_WC_LOC_QP_OP_ERR when we closed right after its message had arrived
/// here (the last comm message of either side, perftest's last Write in ib_write_lat;
/// docs/interop-perftest.md, P3), so with a perftest peer we let it close first and only close
/// ourselves after a grace period. A softrdma peer completes its work requests once they are
/// on the wire, so between two softrdma ends both close at once. The grace was 3 s; in one
/// of 16 lab runs over rxe under heavy host load (TCG guest, load average 10), ib_write_lat's
/// client died of a general protection fault in librdmacm during its teardown, which our DREQ
/// may have met half-way: a perftest peer that closes normally is not slowed by a longer one.
pub(super) fn teardown(comm: &QueuePair, data: Option<&QueuePair>, linger: bool) {
    const GRACE: f64 = 10.0;
    if let Some(data) = data
        && !(linger && await_disconnect(data, GRACE))
    {
        data.disconnect();
        await_disconnect(data, 2.0);
    }
    if !(linger && await_disconnect(comm, GRACE)) {
        comm.disconnect();
    }
}

pub(super) const REPORT_FIELDS: [&str; 5] = [
    "report size",
    "report iterations",
    "report BW peak",
    "report BW average",
    "report MsgRate",
];

/// A 24-bit PSN, as `lrand48() & 0xffffff` (iWARP does not use it).
pub(super) fn psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(1);
    (t.wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff
}

/// The payload pattern checked between two softrdma ends.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31).wrapping_add(7) % 251) as u8)
        .collect()
}

/// Between two softrdma ends: the target half holds the pattern (`what` names it in the
/// error); notes the check in `verified`.
pub(super) fn check_pattern(d: &Data, p: &Params, what: &str, verified: &mut String) -> Result<()> {
    let got =
        d.mr.to_vec(p.half + p.grh(), p.size as usize)
            .map_err(|_| anyhow!("data region"))?;
    if got != pattern(p.size as usize) {
        bail!("payload check failed: {what} does not hold the pattern");
    }
    verified.push_str(", payload pattern checked");
    Ok(())
}

/// Where the peer's `pingpong_dest` says its buffer is.
pub(super) fn remote_of(rem: &PingpongDest) -> RemoteAddr {
    RemoteAddr {
        addr: rem.vaddr,
        rkey: rem.rkey,
    }
}

/// Retries a refused connect, as perftest's client does while the server is not listening
/// yet (`rdma_cm_client_connection`: 10 tries 100 ms apart; here until `step` runs out).
pub(super) fn connect_retry(
    pd: &ProtectionDomain,
    addr: SocketAddr,
    opts: &QpOptions,
    step: Duration,
) -> Result<QueuePair> {
    retry_refused(
        step,
        |t| pd.connect(addr, opts.clone(), t),
        || {
            format!(
                "no perftest server at {addr}: still refused after {} s of retries",
                step.as_secs()
            )
        },
        || format!("connecting to {addr}"),
    )
}

/// Runs `attempt` (given the time one try may take) until it is neither refused nor rejected
/// (the server not listening yet), 100 ms apart, for at most `step`: the retry loop of
/// perftest's `rdma_cm_client_connection`, for an RC connect and a UD resolution alike.
/// `gave_up` and `failed` name the two ways it ends in an error.
pub(super) fn retry_refused<T>(
    step: Duration,
    mut attempt: impl FnMut(Duration) -> verbs::Result<T>,
    gave_up: impl Fn() -> String,
    failed: impl Fn() -> String,
) -> Result<T> {
    let deadline = Instant::now() + step;
    loop {
        match attempt(step.min(Duration::from_secs(10))) {
            Ok(v) => return Ok(v),
            Err(e @ (Error::ConnectionRefused | Error::Rejected { .. })) => {
                if Instant::now() >= deadline {
                    return Err(anyhow!(e).context(gave_up()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(anyhow!(e).context(failed())),
        }
    }
}

/// The data QP's completion queues and capacities (`ctx_init` / `create_qp_main`), the same
/// for an RC and a UD data QP.
pub(super) fn data_resources(dev: &Device, p: &Params) -> Result<(CompletionQueue, CompletionQueue, QpInitAttr)> {
    let send_cq = dev.create_cq((p.tx_depth as usize + 16).max(64))?;
    let recv_cq = dev.create_cq((p.rx_depth as usize + 16).max(64))?;
    let cap = QpInitAttr {
        max_send_wr: p.tx_depth + 4,
        max_recv_wr: p.rx_depth + 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpInitAttr::default()
    };
    Ok((send_cq, recv_cq, cap))
}

/// The server's side of the data connection (`rdma_cm_server_connection`): listens anew on the
/// comm connection's address in port space `ps`, takes one request within `step` and checks
/// that it comes from the comm connection's peer. `what` names the request in errors. The
/// caller accepts it and then drops the listener.
pub(super) fn data_request(
    dev: &Device,
    addr: SocketAddr,
    ps: PortSpace,
    peer: SocketAddr,
    step: Duration,
    what: &str,
) -> Result<(Listener, ConnectRequest)> {
    let l = dev
        .listen_in(addr, ps)
        .with_context(|| format!("listening on {addr} ({ps:?} port space) for {what}"))?;
    let req = l
        .get_request(Some(step))
        .with_context(|| format!("waiting for {what} (rdma_cm_server_connection)"))?;
    if req.peer_addr().ip() != peer.ip() {
        bail!(
            "{what} from {}, but the comm connection came from {peer}",
            req.peer_addr()
        );
    }
    Ok((l, req))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn data_connection(
    dev: &Device,
    pd: &ProtectionDomain,
    p: &Params,
    role: Role,
    listen_on: Option<SocketAddr>,
    peer: SocketAddr,
    step: Duration,
    softrdma_peer: bool,
) -> Result<Data> {
    let (send_cq, recv_cq, cap) = data_resources(dev, p)?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_mr(2 * p.half, access)?;
    let credit = if p.test == Test::SendBw && p.iwarp {
        Some(pd.reg_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?)
    } else {
        None
    };
    // perftest: IRD = ORD = out_reads for Read tests, 0 otherwise. Between two softrdma ends
    // write_bw reads its target back once, which needs one Read.
    let rd = if p.test.verb() == Verb::Read {
        p.out_reads.min(255) as u8
    } else if softrdma_peer && p.test == Test::WriteBw {
        1
    } else {
        0
    };
    let mut opts = QpOptions::new(&send_cq).rd_atomic(rd, rd).attr(cap);
    opts.recv_cq = recv_cq.clone();
    let qp = match role {
        Role::Client(addr) => {
            connect_retry(pd, addr, &opts, step).context("data connection (rdma_cm_client_connection)")?
        }
        Role::Server(_) => {
            let addr = listen_on.expect("server has listened");
            let (_l, req) = data_request(dev, addr, PortSpace::Tcp, peer, step, "the data connection")?;
            req.accept(pd, opts).context("accepting the data connection")?
        }
    };
    Ok(Data {
        qp,
        send_cq,
        recv_cq,
        mr,
        credit,
        ud: None,
    })
}

/// Receives of `size` bytes (UD: 40 more for the GRH) into the target half
/// (`ctx_set_recv_wqes`); returns how many.
pub(super) fn post_recvs(d: &Data, p: &Params, n: u64) -> Result<u64> {
    let wrs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: vec![d.mr.sge(p.half, (p.size as usize + p.grh()) as u32)],
        })
        .collect();
    d.qp.post_recv(&wrs).context("posting receives")?;
    Ok(n)
}
