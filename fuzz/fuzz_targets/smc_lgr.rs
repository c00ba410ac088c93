//! Fuzzes the SMC-R link-group machine (`smc::lgr`): any sequence of received LLC payloads,
//! ticks, connections coming and going and CONFIRM RKEY requests never panics; every LLC it
//! sends parses; once terminated it sends nothing more. Requirements A2.5, A2.6, A2.12.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::lgr::{LgrAction, LgrConfig, LgrMachine};
use smc::stats::Role;
use smc::wire::llc::LlcMessage;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut rest)) = data.split_first() else { return };
    let role = if first & 1 == 0 { Role::Server } else { Role::Client };
    let t0 = Instant::now();
    let mut now = t0;
    let mut m = LgrMachine::new(LgrConfig::new(role), now);
    let mut done = false;
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        match op % 6 {
            0 => {
                let n = rest.len().min(44);
                let mut b = [0u8; 44];
                b[..n].copy_from_slice(&rest[..n]);
                rest = &rest[n..];
                m.on_llc(&b, now);
            }
            1 => now += Duration::from_millis(u64::from(op) * 500),
            2 => m.conn_added(),
            3 => m.conn_removed(now),
            4 => {
                let _ = m.confirm_rkey(u32::from(op), 0x1000, now);
            }
            _ => m.on_rx(now),
        }
        m.on_tick(now);
        while let Some(a) = m.poll_action() {
            assert!(!done, "action after Terminate: {a:?}");
            match a {
                LgrAction::SendLlc(b) => {
                    LlcMessage::parse(&b).expect("the machine emits valid LLC");
                }
                LgrAction::Terminate(_) => done = true,
                LgrAction::RkeyConfirmed { .. } => {}
            }
        }
    }
});
