//! What the SMC-R tests (and examples/async_echo.rs) that run both ends over soft RoCEv2
//! devices of our own provider on loopback addresses share: the device, a test pattern and
//! the process's thread count.

#![allow(dead_code)]

use verbs::{Device, DeviceFactory, DeviceOptions};

/// A RoCEv2 device of our provider on `addr`, named `{prefix}{addr}` (a name is unique in a
/// process).
pub fn device(prefix: &str, addr: &str) -> Device {
    let opts = DeviceOptions::new()
        .with("addr", addr)
        .with("name", format!("{prefix}{addr}"));
    roce::RoceFactory.open(&opts).expect("open a RoCEv2 device")
}

/// `len` octets of a xorshift stream seeded with `seed` (one octet a step).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The threads of this process.
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}
