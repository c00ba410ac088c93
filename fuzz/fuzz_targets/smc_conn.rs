//! Fuzzes the SMC-R connection machine (`smc::conn::Conn`) as a rogue peer would drive it
//! (A2.15): the input is a script of local calls and arbitrary CDC messages (any token,
//! sequence, cursors, flags, taken from the input octets through `Cdc::parse`). The machine
//! must never panic; every RDMA Write it asks for stays inside the peer's element's data
//! area (failover replays included); unread octets never exceed the capacity; its cursors
//! stay in range.
#![no_main]
use libfuzzer_sys::fuzz_target;
use smc::conn::{Action, Conn, ConnParams};
use smc::wire::cdc::{Cdc, CDC_LEN};
use smc::wire::cursor::{EyecatcherMode, Rmbe};

fuzz_target!(|data: &[u8]| {
    let Some((&geo, mut rest)) = data.split_first() else {
        return;
    };
    let mode = if geo & 1 == 0 { EyecatcherMode::None } else { EyecatcherMode::Rfc };
    let len = 5 + u32::from(geo >> 1) * 37;
    let Ok(e) = Rmbe::new(len, mode) else {
        return;
    };
    let mut c = Conn::new(ConnParams { local_token: 7, peer_token: 9, local_rmbe: e, peer_rmbe: e, send_buf: 3_000 });
    while let Some((&op, r)) = rest.split_first() {
        rest = r;
        let arg = u64::from(op >> 3) * 13;
        match op & 7 {
            0 => {
                let _ = c.write(arg);
            }
            1 => {
                let n = c.readable().min(arg);
                let _ = c.consume(n);
            }
            2 => {
                let _ = c.write_urgent(arg % 40);
            }
            3 => c.writes_completed(arg),
            4 => match op >> 3 {
                0 => c.close(),
                1 => {
                    let _ = c.shutdown_write();
                }
                2 => c.on_timeout(),
                3 => c.on_tcp_reset(),
                4 => c.abort(),
                // Failover (SMC-FO-2..5): a completed CDC send, a link switch.
                5 => c.cdc_completed((arg & 0xFFFF) as u16),
                6 => c.failover(),
                _ => {}
            },
            _ => {
                if rest.len() < CDC_LEN - 2 {
                    return;
                }
                let mut b = [0u8; CDC_LEN];
                b[0] = 0xFE;
                b[1] = CDC_LEN as u8;
                b[2..].copy_from_slice(&rest[..CDC_LEN - 2]);
                rest = &rest[CDC_LEN - 2..];
                if op & 0x80 != 0 {
                    b[4..8].copy_from_slice(&7u32.to_be_bytes());
                }
                if let Ok(m) = Cdc::parse(&b) {
                    let _ = c.on_cdc(&m);
                }
            }
        }
        while let Some(a) = c.poll_action() {
            if let Action::RdmaWrite { remote_off, len, .. } = a {
                assert!(remote_off >= e.base() && remote_off + len <= e.len());
            }
        }
        assert!(c.readable() <= u64::from(e.capacity()));
        assert!(e.check(c.producer()).is_ok() && e.check(c.consumer()).is_ok());
    }
});
