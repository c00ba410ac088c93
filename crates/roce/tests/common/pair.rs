//! Two RoCEv2 devices on loopback addresses with one RC QP each, moved RESET → INIT → RTR →
//! RTS by hand (`modify_qp`, as SMC-R does) at path MTU 4096, and a registered region on
//! each: the setup the counting tests (`copies_per_octet.rs`, `datagrams_per_message.rs`,
//! `inline_wait.rs`, `per_message_costs.rs`) share.

#![allow(dead_code)]

use verbs::*;

/// One side of a pair.
pub struct End {
    pub dev: Device,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
}

/// What differs between the tests' pairs.
pub struct PairOpts<'a> {
    /// Entries of each side's CQ.
    pub cq_depth: usize,
    /// Octets of each side's region (all remote access).
    pub mr_len: usize,
    /// Both directions' starting PSN.
    pub psn: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Extra device options (`icrc_rx`, ...).
    pub dev_opts: &'a [(&'a str, &'a str)],
}

/// Devices on `a` and `b` with connected RC QPs.
pub fn rc_pair(a: &str, b: &str, o: &PairOpts<'_>) -> (End, End) {
    let open = |addr: &str| {
        let mut opts = DeviceOptions::new().with("addr", addr);
        for (k, v) in o.dev_opts {
            opts = opts.with(k, v);
        }
        let dev = roce::RoceFactory.open(&opts).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(o.cq_depth).unwrap();
        let qp = pd.create_qp(QpInit::new(QpType::Rc, &cq)).unwrap();
        let mr = pd.reg_mr(o.mr_len, Access::all_remote()).unwrap();
        End { dev, cq, qp, mr }
    };
    let (x, y) = (open(a), open(b));
    for (s, p) in [(&x, &y), (&y, &x)] {
        assert_eq!(
            s.dev.query_port(1).unwrap().active_mtu,
            Mtu::Mtu4096,
            "loopback allows 4096"
        );
        s.qp.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        s.qp.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(p.dev.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: p.qp.qp_num(),
            rq_psn: o.psn,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
        }))
        .unwrap();
        s.qp.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: o.psn,
            timeout: o.timeout,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        }))
        .unwrap();
    }
    (x, y)
}

/// A device counter that must exist.
pub fn counter(d: &Device, name: &str) -> u64 {
    d.hw_counter(name).unwrap_or_else(|| panic!("counter {name}"))
}
