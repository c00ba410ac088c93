//! The engine's seams: QP1 MADs between two devices through `GsiPort::send_mad` and the
//! registered `GsiHandler` (IBA vol. 1 ch. 13, §13.5 unconfirmed: UD SEND_ONLY, DETH with the GSI Q_Key
//! 0x80010000 and source QP 1; C1 in ../shared/requirements/smcr-ipoibcm.md), and a device
//! on an IPv6 address (its GID is the address; the ICRC masks TC/flow label/hop limit).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roce::gsi::{GsiHandler, GsiPort};
use roce::{RoceConfig, RoceProvider};
use verbs::*;

/// A MAD as the handler saw it: sender GID, source QP, P_Key, octets.
type Mad = (Gid, u32, u16, Vec<u8>);

#[derive(Default)]
struct Inbox(Mutex<Vec<Mad>>);

impl GsiHandler for Inbox {
    fn on_mad(&self, from: Gid, src_qp: u32, pkey: u16, mad: &[u8]) {
        self.0.lock().unwrap().push((from, src_qp, pkey, mad.to_vec()));
    }
}

fn provider(addr: &str) -> Arc<RoceProvider> {
    Arc::new(
        RoceProvider::new(RoceConfig {
            addr: addr.parse().unwrap(),
            ..RoceConfig::default()
        })
        .unwrap(),
    )
}

fn wait_for(inbox: &Inbox, n: usize) {
    let t0 = Instant::now();
    while inbox.0.lock().unwrap().len() < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "MAD not delivered");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn mads_travel_between_qp1s_c1_gsi() {
    let (a, b) = (provider("127.78.6.1"), provider("127.78.6.2"));
    let inbox = Arc::new(Inbox::default());
    let weak: std::sync::Weak<dyn GsiHandler> = Arc::downgrade(&(inbox.clone() as Arc<dyn GsiHandler>));
    b.set_gsi_handler(weak);
    let mad: Vec<u8> = (0..=255u8).collect();
    a.send_mad(b.local_gid(), &mad).unwrap();
    wait_for(&inbox, 1);
    let got = inbox.0.lock().unwrap()[0].clone();
    assert_eq!(got, (a.local_gid(), 1, 0xffff, mad));
    assert_eq!(a.local_gid(), Gid::from_ip("127.78.6.1".parse().unwrap()));
}

#[test]
fn ipv6_device_connects_and_writes() {
    let open = |a: &str| roce::RoceFactory.open(&DeviceOptions::new().with("addr", a));
    let (da, db) = match (open("::1"), open("::1")) {
        (Ok(a), Err(_)) => {
            // One IPv6 loopback address only: the second device cannot bind ::1 port 4791
            // again. Loop a QP back to itself on the one device instead.
            (a.clone(), a)
        }
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) => {
            eprintln!("skipped: cannot bind [::1]:4791 ({e})");
            return;
        }
    };
    assert_eq!(da.query_gid(1, 0).unwrap(), Gid::from_ip("::1".parse().unwrap()));
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
    let qa = pa.create_qp(QpInit::new(QpType::Rc, &ca)).unwrap();
    let qb = pb.create_qp(QpInit::new(QpType::Rc, &cb)).unwrap();
    for (q, peer, d) in [(&qa, &qb, &db), (&qb, &qa, &da)] {
        q.modify_qp(&QpAttr::init(1, 0, Access::all_remote())).unwrap();
        q.modify_qp(&QpAttr::rtr(RtrAttr {
            ah_attr: AhAttr::to_gid(d.query_gid(1, 0).unwrap()),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.qp_num(),
            rq_psn: 5,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
        }))
        .unwrap();
        q.modify_qp(&QpAttr::rts(RtsAttr {
            sq_psn: 5,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        }))
        .unwrap();
    }
    let ma = pa.reg_mr(8192, Access::all_remote()).unwrap();
    let mb = pb.reg_mr(8192, Access::all_remote()).unwrap();
    ma.fill(0, 3000, 0x66).unwrap();
    let remote = RemoteAddr {
        addr: mb.addr(),
        rkey: mb.rkey(),
    };
    qa.post_send_one(SendWr::new(1, WrOpcode::RdmaWrite { remote }, vec![ma.sge(0, 3000)]))
        .unwrap();
    assert_eq!(
        ca.wait(Some(Duration::from_secs(10))).unwrap().status,
        WcStatus::Success
    );
    assert_eq!(mb.to_vec(0, 3000).unwrap(), vec![0x66; 3000]);
    assert_eq!(da.hw_counter("icrc_err"), Some(0));
}
