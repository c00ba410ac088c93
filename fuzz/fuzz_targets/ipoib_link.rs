//! Fuzzes the IPoIB link machine (`ipoib::link::Link`) with an arbitrary script of events:
//! UD and RC messages with arbitrary or IPoIB-shaped octets, packets from the kernel, CM
//! REQ/REP/REJ/RTU/close events with arbitrary service IDs and private data, and clock
//! steps. It must never panic, and its tables stay bounded.
#![no_main]
use std::net::Ipv4Addr;
use std::time::Duration;

use ipoib::link::{Action, ConnId, Link, LinkConfig, Mode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, mut rest)) = data.split_first() else { return };
    let mode = if sel & 1 == 0 { Mode::Connected } else { Mode::Datagram };
    let mut cfg = LinkConfig::new(mode, 0x48, [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 1]);
    cfg.ipv4.push((Ipv4Addr::new(10, 20, 0, 1), 24));
    cfg.max_neigh = 8;
    cfg.max_conns = 4;
    cfg.queue_len = 4;
    let mut l = Link::new(cfg);
    l.start();
    let mut now = Duration::from_secs(1);
    let mut conns: Vec<ConnId> = Vec::new();
    while rest.len() >= 2 {
        let op = rest[0];
        let len = usize::from(rest[1]).min(rest.len() - 2);
        let body = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let pick = |v: &Vec<ConnId>| v.get(usize::from(op >> 4) % v.len().max(1)).copied().unwrap_or(ConnId(1));
        match op & 0x0f {
            0 => l.on_ud_recv(now, body),
            1 => {
                let mut m = vec![0x08, 0x06, 0, 0];
                m.extend_from_slice(body);
                l.on_ud_recv(now, &m)
            }
            2 => {
                let mut m = vec![0x86, 0xdd, 0, 0];
                m.extend_from_slice(body);
                l.on_ud_recv(now, &m)
            }
            3 => kernel(&mut l, now, body.to_vec()),
            4 => {
                let sid = 0x1000_0000_0000_0048u64 ^ u64::from(body.first().copied().unwrap_or(0) & 3);
                let mut g = [0u8; 16];
                g[15] = body.get(1).copied().unwrap_or(0) & 3;
                l.on_cm_req(now, u64::from(op), sid, g, body.get(2..).unwrap_or(&[]));
            }
            5 => l.on_cm_rep(now, pick(&conns), body),
            6 => l.on_cm_rej(now, pick(&conns), u16::from(body.first().copied().unwrap_or(28))),
            7 => l.on_cm_rtu(now, pick(&conns)),
            8 => l.on_conn_closed(now, pick(&conns)),
            9 if op & 0x10 != 0 => {
                // The daemon's zero-copy receive: the range must lie in the message.
                if let Some(r) = l.on_rc_recv_in_place(now, pick(&conns), body) {
                    assert!(r.start >= 4 && r.end <= body.len() && r.start <= r.end, "{r:?}");
                }
            }
            9 => l.on_rc_recv(now, pick(&conns), body),
            10 => {
                now += Duration::from_millis(u64::from(op) * 500);
                l.on_tick(now);
            }
            11 => l.shutdown(),
            _ => {
                // a well-formed IPv4 packet from the kernel towards 10.20.0.x
                let n = body.first().copied().unwrap_or(2) & 7;
                let size = 28 + usize::from(body.get(1).copied().unwrap_or(0)) * 300;
                let mut p = vec![0u8; size];
                ipoib::wire::ip::emit_ipv4_header(
                    &mut p,
                    size as u16,
                    1,
                    if op & 0x10 != 0 { 0x4000 } else { 0 },
                    17,
                    Ipv4Addr::new(10, 20, 0, 1),
                    Ipv4Addr::new(10, 20, 0, n),
                )
                .unwrap();
                kernel(&mut l, now, p);
            }
        }
        for a in l.take_actions() {
            match a {
                Action::Connect { conn, .. } | Action::Accept { conn, .. } => conns.push(conn),
                Action::UdSend { payload, .. } | Action::RcSend { payload, .. } => {
                    assert!(payload.len() <= 65524, "message beyond the Receive MTU");
                }
                _ => {}
            }
        }
        assert!(l.neighbours(now).len() <= 8);
        assert!(l.connections(now).len() <= 8);
        assert!(l.neighbours(now).iter().all(|n| n.queued <= 4));
    }
});

/// A packet from the kernel as the daemon hands it over: `rc_route` first (the zero-copy
/// path), which must agree with what `on_kernel_packet` would have done on a twin.
fn kernel(l: &mut Link, now: Duration, p: Vec<u8>) {
    let mut twin = l.clone();
    match l.rc_route(now, &p) {
        Some((conn, _)) => {
            twin.on_kernel_packet(now, p.clone());
            let acts = twin.take_actions();
            assert!(
                matches!(acts.as_slice(), [Action::RcSend { conn: c, payload }] if *c == conn && payload[4..] == p[..]),
                "rc_route said {conn:?}, on_kernel_packet did {acts:?}"
            );
        }
        None => l.on_kernel_packet(now, p),
    }
}
