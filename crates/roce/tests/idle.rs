//! The progress model's promise (issue 13, point 5): idle QPs cost no CPU. Two RoCEv2
//! devices with 64 connected QP pairs, after some traffic, sit idle for 2 s; the whole
//! process (both progress threads included) must stay under 3 % of one CPU. Its own test
//! binary, so no other test shares the process while it measures.

use std::time::Duration;
use verbs::*;

/// utime + stime of this process in clock ticks (/proc/self/stat).
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn idle_device_uses_no_cpu() {
    let open = |a: &str| roce::RoceFactory.open(&DeviceOptions::new().with("addr", a)).unwrap();
    let (da, db) = (open("127.77.9.1"), open("127.77.9.2"));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (da.create_cq(4096).unwrap(), db.create_cq(4096).unwrap());
    let ma = pa.reg_mr(4096, Access::all_remote()).unwrap();
    let mb = pb.reg_mr(4096, Access::all_remote()).unwrap();
    let mut qps = Vec::new();
    for _ in 0..64 {
        let qa = pa.create_qp(QpInit::new(QpType::Rc, &ca)).unwrap();
        let qb = pb.create_qp(QpInit::new(QpType::Rc, &cb)).unwrap();
        for (q, peer, d) in [(&qa, &qb, &db), (&qb, &qa, &da)] {
            q.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
            q.modify_qp(&QpAttr::rtr(RtrAttr {
                ah_attr: AhAttr::to_gid(d.query_gid(1, 0).unwrap()),
                path_mtu: Mtu::Mtu1024,
                dest_qp_num: peer.qp_num(),
                rq_psn: 100,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
            }))
            .unwrap();
            q.modify_qp(&QpAttr::rts(RtsAttr {
                sq_psn: 100,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 4,
            }))
            .unwrap();
        }
        let remote = RemoteAddr {
            addr: mb.addr(),
            rkey: mb.rkey(),
        };
        qa.post_send_one(SendWr::new(1, WrOpcode::RdmaWrite { remote }, vec![ma.sge(0, 64)]))
            .unwrap();
        assert_eq!(
            ca.wait(Some(Duration::from_secs(10))).unwrap().status,
            WcStatus::Success
        );
        qps.push((qa, qb));
    }
    std::thread::sleep(Duration::from_millis(200));
    let t0 = cpu_ticks();
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks() - t0;
    // USER_HZ is 100: a tick is 10 ms; 6 ticks in 2 s is 3 %.
    assert!(used <= 6, "64 idle QP pairs used {used} ticks (10 ms each) in 2 s");
    assert_eq!(qps.len(), 64);
}
