//! Two RoCEv2 devices of our own provider on loopback, QPs connected by hand with
//! `modify_qp` (RESET → INIT → RTR → RTS), as SMC-R does (D1 in
//! ../shared/requirements/smcr-ipoibcm.md; C3 for the RC transport). Every test uses its own
//! 127.77.x.y addresses so tests (and other helpers' tests) run in parallel.

use std::time::Duration;

use sha2::{Digest, Sha256};
use verbs::*;

const T: Duration = Duration::from_secs(20);

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

fn side(addr: &str) -> Side {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("rxe_{addr}"));
    let dev = roce::RoceFactory.open(&opts).expect("open a RoCEv2 device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(65_536).unwrap();
    Side { dev, pd, cq }
}

fn qp(s: &Side) -> QueuePair {
    s.pd.create_qp(QpInit::new(QpType::Rc, &s.cq)).unwrap()
}

/// Moves `a` (on device `da`) and `b` to RTS, connected to each other.
fn connect(a: &QueuePair, da: &Device, b: &QueuePair, db: &Device) {
    let (psn_a, psn_b) = (0xff_fff0 ^ a.qp_num(), 0x12_3456 ^ b.qp_num());
    for (q, peer, dpeer, rq_psn, sq_psn) in [
        (a, b, db, psn_b & 0xff_ffff, psn_a & 0xff_ffff),
        (b, a, da, psn_a & 0xff_ffff, psn_b & 0xff_ffff),
    ] {
        q.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        q.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(dpeer.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.qp_num(),
            rq_psn,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
        }))
        .unwrap();
        q.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }))
        .unwrap();
        assert_eq!(q.state(), QpState::Rts);
    }
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait(Some(T)).expect("completion within timeout")
}

#[test]
fn device_ports_gids_pkeys_and_qpns() {
    let s = side("127.77.1.1");
    let port = s.dev.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    // The default port MTU follows the interface's as rxe's does: loopback (65536) allows 4096.
    assert_eq!(port.active_mtu, Mtu::Mtu4096);
    assert_eq!(
        s.dev.query_gid(1, 0).unwrap(),
        Gid::from_ip("127.77.1.1".parse().unwrap())
    );
    assert!(s.dev.query_gid(1, 1).is_err());
    assert_eq!(s.dev.query_pkey(1, 0).unwrap(), 0xffff);
    let qps: Vec<_> = (0..8).map(|_| qp(&s)).collect();
    for q in &qps {
        assert!(q.qp_num() > 1 && q.qp_num() < 1 << 24, "QPN {:#x}", q.qp_num());
        assert_eq!(q.state(), QpState::Reset);
    }
    // RTR before INIT is refused by the verbs layer.
    assert!(qps[0].modify_qp(&QpAttr::state(QpState::Rts)).is_err());
}

#[test]
fn send_imm_write_imm_read_atomics_c3() {
    let (a, b) = (side("127.77.2.1"), side("127.77.2.2"));
    let (qa, qb) = (qp(&a), qp(&b));
    connect(&qa, &a.dev, &qb, &b.dev);
    let ma = a.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(1 << 16, Access::all_remote()).unwrap();
    // Send, and a multi-packet Send with immediate data.
    qb.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: vec![mb.sge(0, 8192)],
    }])
    .unwrap();
    ma.write(0, b"ping").unwrap();
    qa.post_send_one(SendWr::new(1, WrOpcode::Send, vec![ma.sge(0, 4)]))
        .unwrap();
    let wc = wait(&a.cq);
    assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let wc = wait(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 4)
    );
    assert_eq!(mb.to_vec(0, 4).unwrap(), b"ping");
    let big: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    ma.write(100, &big).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 8,
        sg_list: vec![mb.sge(0, 8192)],
    }])
    .unwrap();
    qa.post_send_one(SendWr::new(
        2,
        WrOpcode::SendWithImm { imm_data: 0xabcd },
        vec![ma.sge(100, 5000)],
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let wc = wait(&b.cq);
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm_data), (8, 5000, Some(0xabcd)));
    assert_eq!(mb.to_vec(0, 5000).unwrap(), big);
    // Write, Write with immediate, Read back.
    let remote = RemoteAddr {
        addr: mb.addr() + 20_000,
        rkey: mb.rkey(),
    };
    qa.post_send_one(SendWr::new(3, WrOpcode::RdmaWrite { remote }, vec![ma.sge(100, 5000)]))
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    assert_eq!(mb.to_vec(20_000, 5000).unwrap(), big);
    qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: vec![],
    }])
    .unwrap();
    qa.post_send_one(SendWr::new(
        4,
        WrOpcode::RdmaWriteWithImm {
            remote,
            imm_data: 0xfeed,
        },
        vec![ma.sge(0, 4)],
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let wc = wait(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data),
        (9, WcOpcode::RecvRdmaWithImm, Some(0xfeed))
    );
    qa.post_send_one(SendWr::new(
        5,
        WrOpcode::RdmaRead { remote },
        vec![ma.sge(30_000, 5000)],
    ))
    .unwrap();
    let wc = wait(&a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (5, WcStatus::Success, WcOpcode::RdmaRead, 5000)
    );
    let mut expect = big.clone();
    expect[..4].copy_from_slice(b"ping");
    assert_eq!(ma.to_vec(30_000, 5000).unwrap(), expect);
    // Atomics.
    mb.write(64, &10u64.to_ne_bytes()).unwrap();
    let r64 = RemoteAddr {
        addr: mb.addr() + 64,
        rkey: mb.rkey(),
    };
    qa.post_send_one(SendWr::new(
        6,
        WrOpcode::AtomicFetchAdd { remote: r64, add: 5 },
        vec![ma.sge(0, 8)],
    ))
    .unwrap();
    let wc = wait(&a.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::FetchAdd));
    assert_eq!(ma.to_vec(0, 8).unwrap(), 10u64.to_ne_bytes());
    qa.post_send_one(SendWr::new(
        7,
        WrOpcode::AtomicCmpSwap {
            remote: r64,
            compare: 15,
            swap: 99,
        },
        vec![ma.sge(8, 8)],
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    assert_eq!(ma.to_vec(8, 8).unwrap(), 15u64.to_ne_bytes());
    assert_eq!(mb.to_vec(64, 8).unwrap(), 99u64.to_ne_bytes());
    // Bad R_Key: REM_ACCESS_ERR, the QP goes to ERR (C3 "errors move the QP to ERROR").
    let bad = RemoteAddr {
        addr: mb.addr(),
        rkey: mb.rkey() ^ 0x100,
    };
    qa.post_send_one(SendWr::new(8, WrOpcode::RdmaWrite { remote: bad }, vec![ma.sge(0, 4)]))
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr);
    assert_eq!(qa.state(), QpState::Err);
}

fn hash_transfer(read: bool, base: &str) {
    const LEN: usize = 64 << 20;
    const CHUNK: usize = 1 << 20;
    let (a, b) = (side(&format!("{base}.1")), side(&format!("{base}.2")));
    let (qa, qb) = (qp(&a), qp(&b));
    connect(&qa, &a.dev, &qb, &b.dev);
    let ma = a.pd.reg_mr(LEN, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(LEN, Access::all_remote()).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..LEN / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let (src, dst) = if read { (&mb, &ma) } else { (&ma, &mb) };
    src.write(0, &data).unwrap();
    let mut in_flight = 0;
    for (i, off) in (0..LEN).step_by(CHUNK).enumerate() {
        let wr = if read {
            let remote = RemoteAddr {
                addr: mb.addr() + off as u64,
                rkey: mb.rkey(),
            };
            SendWr::new(i as u64, WrOpcode::RdmaRead { remote }, vec![ma.sge(off, CHUNK as u32)])
        } else {
            let remote = RemoteAddr {
                addr: mb.addr() + off as u64,
                rkey: mb.rkey(),
            };
            SendWr::new(
                i as u64,
                WrOpcode::RdmaWrite { remote },
                vec![ma.sge(off, CHUNK as u32)],
            )
        };
        if in_flight == 8 {
            assert_eq!(wait(&a.cq).status, WcStatus::Success);
            in_flight -= 1;
        }
        qa.post_send_one(wr).unwrap();
        in_flight += 1;
    }
    while in_flight > 0 {
        assert_eq!(wait(&a.cq).status, WcStatus::Success);
        in_flight -= 1;
    }
    assert_eq!(
        Sha256::digest(dst.to_vec(0, LEN).unwrap()),
        Sha256::digest(&data),
        "64 MiB by {} arrives intact",
        if read { "Read" } else { "Write" }
    );
}

#[test]
fn write_64_mib_hashed_c3() {
    hash_transfer(false, "127.77.3");
}

#[test]
fn read_64_mib_hashed_c3() {
    hash_transfer(true, "127.77.4");
}

#[test]
fn two_hundred_fifty_six_qps() {
    let (a, b) = (side("127.77.5.1"), side("127.77.5.2"));
    let ma = a.pd.reg_mr(256 * 64, Access::all_remote()).unwrap();
    let mb = b.pd.reg_mr(256 * 64, Access::all_remote()).unwrap();
    let pairs: Vec<_> = (0..256)
        .map(|_| {
            let (qa, qb) = (qp(&a), qp(&b));
            connect(&qa, &a.dev, &qb, &b.dev);
            (qa, qb)
        })
        .collect();
    for (i, (qa, _)) in pairs.iter().enumerate() {
        ma.write(i * 64, format!("qp{i:05}").as_bytes()).unwrap();
        let remote = RemoteAddr {
            addr: mb.addr() + (i * 64) as u64,
            rkey: mb.rkey(),
        };
        qa.post_send_one(SendWr::new(
            i as u64,
            WrOpcode::RdmaWrite { remote },
            vec![ma.sge(i * 64, 7)],
        ))
        .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for _ in 0..256 {
        let wc = wait(&a.cq);
        assert_eq!(wc.status, WcStatus::Success);
        seen.insert(wc.wr_id);
    }
    assert_eq!(seen.len(), 256);
    for i in 0..256 {
        assert_eq!(mb.to_vec(i * 64, 7).unwrap(), format!("qp{i:05}").as_bytes());
    }
}
