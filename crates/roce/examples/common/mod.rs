//! Shared by the roce examples (`roce_bench.rs`, `udp_bound.rs`; include with `mod common;`):
//! two connected RC queue pairs on loopback, and the device counters the benches print with
//! `ROCE_BENCH_COUNTERS=1`.

#![allow(dead_code)]

use verbs::*;

/// One end of an RC connection.
pub struct Side {
    /// The device (its counters).
    pub dev: Device,
    /// The protection domain (memory regions).
    pub pd: ProtectionDomain,
    /// The completion queue of both directions.
    pub cq: CompletionQueue,
    /// The RC queue pair.
    pub qp: QueuePair,
}

/// Two RoCE devices on `a` and `b` (MTU 4096, and the device options `opts`, `key=value`),
/// each with a CQ of `cq_depth` entries and an RC QP of `wr_depth` send and receive work
/// requests, connected to each other (path MTU 4096, 16 outstanding reads, timeout 14, seven
/// retries).
pub fn rc_pair(a: &str, b: &str, opts: &[String], cq_depth: usize, wr_depth: u32) -> (Side, Side) {
    let open = |addr: &str| {
        let mut o = DeviceOptions::new().with("addr", addr).with("mtu", "4096");
        for kv in opts {
            o.set_pair(kv).unwrap();
        }
        let dev = roce::RoceFactory.open(&o).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(cq_depth).unwrap();
        let qp = pd
            .create_qp(QpInit::new(QpType::Rc, &cq).cap(QpInitAttr {
                max_send_wr: wr_depth,
                max_recv_wr: wr_depth,
                ..QpInitAttr::default()
            }))
            .unwrap();
        Side { dev, pd, cq, qp }
    };
    let (x, y) = (open(a), open(b));
    for (s, p) in [(&x, &y), (&y, &x)] {
        s.qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        s.qp.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(p.dev.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: p.qp.qp_num(),
            rq_psn: 0,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 1,
        }))
        .unwrap();
        s.qp.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }))
        .unwrap();
    }
    (x, y)
}

/// Whether the device counters are wanted (`ROCE_BENCH_COUNTERS` set).
pub fn counters_wanted() -> bool {
    std::env::var_os("ROCE_BENCH_COUNTERS").is_some()
}

/// The device counter `name` of `dev` (0 when the device has none of that name).
pub fn counter(dev: &Device, name: &str) -> u64 {
    dev.hw_counter(name).unwrap_or(0)
}
