//! The providers' fixtures: how each opens a device and connects a pair.

use crate::{Caps, End, Fixture, RcPath, cm_connect, modify_qp_connect};
use std::net::Ipv4Addr;
use std::sync::Arc;
use verbs::*;

/// The iWARP provider (`iwarp`, siw_soft0 devices), connected with the
/// rdma_cm-style CM; device variants CRC off and on.
pub struct Iwarp {
    /// The second byte of the loopback addresses this fixture uses.
    pub net: u8,
}

impl Fixture for Iwarp {
    fn name(&self) -> &'static str {
        "iwarp"
    }
    fn variants(&self) -> Vec<DeviceOptions> {
        vec![
            DeviceOptions::new().with("crc", "off"),
            DeviceOptions::new().with("crc", "on"),
        ]
    }
    fn open(&self, opts: &DeviceOptions, _ip: Ipv4Addr) -> Device {
        Registry::new()
            .with(Arc::new(iwarp::IwarpFactory))
            .open("iwarp", opts)
            .unwrap()
    }
    fn connect(&self, a: &End, b: &End, n: usize, caps: &Caps) -> Vec<(QueuePair, QueuePair)> {
        cm_connect(a, b, n, caps)
    }
    fn transport(&self) -> Transport {
        Transport::Iwarp
    }
    fn net(&self) -> u8 {
        self.net
    }
}

/// The RoCEv2 provider (`roce`, rxe_soft0-like devices each bound to its own
/// loopback address on UDP 4791), QPs connected by hand with `modify_qp` as
/// SMC-R does; device variants: port MTU 1024 and 4096 (the path MTU follows
/// the port's active MTU).
pub struct Roce {
    /// The second byte of the loopback addresses this fixture uses.
    pub net: u8,
    /// Timeouts and retries of the hand-made connections (its MTU is replaced
    /// by the port's).
    pub path: RcPath,
    /// Settings added to every variant (for instance fault injection).
    pub extra: Vec<(&'static str, String)>,
}

impl Roce {
    /// The default fixture on 127.`net`.x.y.
    pub const fn new(net: u8) -> Roce {
        Roce {
            net,
            path: RcPath::DEFAULT,
            extra: Vec::new(),
        }
    }
}

impl Fixture for Roce {
    fn name(&self) -> &'static str {
        "roce"
    }
    fn variants(&self) -> Vec<DeviceOptions> {
        ["1024", "4096"]
            .into_iter()
            .map(|mtu| {
                let mut o = DeviceOptions::new().with("mtu", mtu);
                for (k, v) in &self.extra {
                    o.set(k, v);
                }
                o
            })
            .collect()
    }
    fn open(&self, opts: &DeviceOptions, ip: Ipv4Addr) -> Device {
        let opts = opts.clone().with("addr", ip).with("name", format!("rxe_{ip}"));
        Registry::new()
            .with(Arc::new(roce::RoceFactory))
            .open("roce", &opts)
            .unwrap()
    }
    fn connect(&self, a: &End, b: &End, n: usize, caps: &Caps) -> Vec<(QueuePair, QueuePair)> {
        let mtu = a.dev.query_port(1).unwrap().active_mtu;
        modify_qp_connect(a, b, n, caps, RcPath { mtu, ..self.path })
    }
    fn transport(&self) -> Transport {
        Transport::RoceV2
    }
    fn net(&self) -> u8 {
        self.net
    }
}
