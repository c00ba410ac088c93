//! One perftest session: the comm connection's exchanges, the data connection, the test
//! itself and the closing exchanges (steps 1-5 of the module doc of [`super`]).

use anyhow::{Context, Result, anyhow, bail};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use verbs::*;

use super::bw::{bw_rdma_client, send_bw_client, send_bw_server};
use super::comm::{Comm, comm_parts};
use super::data::{connect_retry, data_connection, pattern, post_recvs, psn};
use super::lat::{read_lat, send_lat, write_lat};
use super::report::print_header;
use super::ud;
use super::wire::{self, BwReport, PingpongDest};
use super::{Args, CACHE_LINE, CYCLE_BUFFER, MTU, Measured, Outcome, Params, Role, Test, Verb};

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
