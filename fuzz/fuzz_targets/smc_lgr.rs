//! Fuzzes the SMC-R link-group machine (`smc::lgr`), one link or two: any sequence of
//! received LLC payloads (on link 1, 2 or 3), ticks, connections coming and going, CONFIRM
//! RKEY requests, ADD LINK started (server) or answered (client) and links failing never
//! panics; every LLC it sends parses and goes on a link the machine knows; never more links
//! than the maximum; once terminated it sends nothing more. A v2 group (SMC-Rv2, bit 2 of
//! the first octet) receives up to 88-octet messages, sends only the v2 form and never has
//! a second link, even when configured for two. Requirements A2.5, A2.6, A2.12, A2.13, C5.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::lgr::{LgrAction, LgrConfig, LgrMachine, LinkAddr};
use smc::stats::Role;
use smc::wire::llc::{LlcMessage, LlcVersion, RtokenPair};
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut rest)) = data.split_first() else { return };
    let role = if first & 1 == 0 { Role::Server } else { Role::Client };
    let multi = first & 2 != 0;
    let v2 = first & 4 != 0;
    let version = if v2 { LlcVersion::V2 } else { LlcVersion::V1 };
    let cfg = LgrConfig {
        max_links: if multi { 2 } else { 1 },
        add_link_retry: multi.then_some(Duration::from_secs(3)),
        version,
        ..LgrConfig::new(role)
    };
    let t0 = Instant::now();
    let mut now = t0;
    let mut m = LgrMachine::new(cfg, now);
    m.peer_rmb_known(1, 0x11, 0x1000);
    let mut done = false;
    let addr = LinkAddr {
        qpn: 0x99,
        qp_mtu: 3,
        ..LinkAddr::default()
    };
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        match op % 10 {
            0 | 9 => {
                let len = if v2 { 88 } else { 44 };
                let n = rest.len().min(len);
                let mut b = [0u8; 88];
                b[..n].copy_from_slice(&rest[..n]);
                rest = &rest[n..];
                if op % 10 == 0 {
                    m.on_llc(&b[..len], now);
                } else {
                    m.on_llc_on(1 + (op / 10) % 3, &b[..len], now);
                }
            }
            1 => now += Duration::from_millis(u64::from(op) * 500),
            2 => m.conn_added(),
            3 => m.conn_removed(now),
            4 => {
                let _ = m.confirm_rkey(u32::from(op), 0x1000, now);
            }
            5 => {
                let pairs = (0..op % 5)
                    .map(|i| RtokenPair {
                        ref_rkey: 0x11,
                        new_rkey: u32::from(i),
                        new_vaddr: 0,
                    })
                    .collect();
                if op & 0x80 == 0 {
                    let _ = m.srv_add_link(addr, pairs, now);
                } else {
                    let _ = m.cli_add_link_accept(addr, pairs, now);
                }
            }
            6 => m.cli_add_link_reject(1),
            7 => m.link_failed(1 + (op / 10) % 3, "fuzz".into(), now),
            _ => m.on_rx(now),
        }
        m.on_tick(now);
        assert!(m.links().len() <= usize::from(m.config().max_links));
        assert!(!v2 || (m.links().len() <= 1 && m.adding_link().is_none()), "v2 group with a second link");
        while let Some(a) = m.poll_action() {
            assert!(!done, "action after Terminate: {a:?}");
            match a {
                LgrAction::SendLlc { msg, .. } => {
                    let sent = LlcMessage::parse(&msg).expect("the machine emits valid LLC");
                    assert_eq!(sent.version, version, "LLC of the group's version");
                }
                LgrAction::Terminate(_) => done = true,
                _ => {}
            }
        }
    }
});
