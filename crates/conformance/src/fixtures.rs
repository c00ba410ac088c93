//! The providers' fixtures: how each opens a device and connects a pair.

use crate::{Caps, End, Fixture, cm_connect};
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
    fn send_imm_after_write_reports_write_imm(&self) -> bool {
        true
    }
    fn net(&self) -> u8 {
        self.net
    }
}
