//! What the SMC-R tests between two network namespaces joined by two veth pairs share
//! (netns_two_links.rs, netns_failover.rs): the namespaces and veths, a thread inside a
//! namespace, a soft RoCEv2 device, and a hash-checked transfer.
//!
//! [`Lab::up`]`(["xA", "xB"], "10.N")` makes namespaces `xA` and `xB`, veths `xA1`–`xB1`
//! (10.N.1.1/24 in `xA`, 10.N.1.2/24 in `xB`) and `xA2`–`xB2` (10.N.2.0/24 likewise), all up
//! with `lo`; dropping the [`Lab`] deletes the namespaces. It needs root: without it (or when
//! `ip` fails) it says why on stderr and returns `None`, and the test skips. Each test file
//! uses its own names and subnet, so the files can run at once.

#![allow(dead_code)]

use sha2::{Digest, Sha256};
use smc::SmcStream;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread;
use verbs::{Device, DeviceFactory, DeviceOptions};

/// Runs `ip args`; whether it succeeded.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).status().is_ok_and(|s| s.success())
}

/// Two namespaces joined by two veth pairs (deleted on drop).
pub struct Lab {
    ns: [&'static str; 2],
}

impl Lab {
    /// Namespaces `ns`, veth pairs `{ns[0]}{k}`–`{ns[1]}{k}` on `{net}.{k}.0/24` for k = 1, 2
    /// (`.1` in `ns[0]`, `.2` in `ns[1]`); `None` (test skipped) without root or when `ip`
    /// fails.
    pub fn up(ns: [&'static str; 2], net: &str) -> Option<Lab> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: the two-namespace SMC-R tests need root (ip netns, veth)");
            return None;
        }
        for n in ns {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(std::process::Stdio::null())
                .status();
        }
        // From here on, whatever was made is deleted on every return.
        let lab = Lab { ns };
        let mut ok = ip(&["netns", "add", ns[0]]) && ip(&["netns", "add", ns[1]]);
        for k in ["1", "2"] {
            let (va, vb) = (format!("{}{k}", ns[0]), format!("{}{k}", ns[1]));
            ok =
                ok && ip(&[
                    "link", "add", &va, "netns", ns[0], "type", "veth", "peer", "name", &vb, "netns", ns[1],
                ]) && ip(&["-n", ns[0], "addr", "add", &format!("{net}.{k}.1/24"), "dev", &va])
                    && ip(&["-n", ns[1], "addr", "add", &format!("{net}.{k}.2/24"), "dev", &vb])
                    && ip(&["-n", ns[0], "link", "set", &va, "up"])
                    && ip(&["-n", ns[1], "link", "set", &vb, "up"]);
        }
        ok = ok && ip(&["-n", ns[0], "link", "set", "lo", "up"]) && ip(&["-n", ns[1], "link", "set", "lo", "up"]);
        if !ok {
            eprintln!("skipped: could not create the namespaces and veth pairs");
            return None;
        }
        Some(lab)
    }

    /// Sets the second namespace's end of veth `k` up or down; whether `ip` succeeded.
    pub fn set_veth(&self, k: u8, up: bool) -> bool {
        let dev = format!("{}{k}", self.ns[1]);
        ip(&["-n", self.ns[1], "link", "set", &dev, if up { "up" } else { "down" }])
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

/// Runs `f` on a thread inside namespace `ns` (sockets it makes live there; they can be
/// used from any thread afterwards).
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("namespace file");
        // SAFETY: `file` is an open namespace file; setns changes only this thread's network
        // namespace.
        let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
}

/// A RoCEv2 device of our provider on `addr` (made in the calling thread's namespace).
pub fn device(addr: &str) -> Device {
    roce::RoceFactory
        .open(
            &DeviceOptions::new()
                .with("addr", addr)
                .with("name", format!("smc_{addr}")),
        )
        .unwrap()
}

/// `len` octets of a xorshift stream seeded with `seed` (eight octets a step).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Sends `len` octets of pattern `seed` on `w` while `r` reads them; returns the reader's
/// hash and the writer's, or the first error. `progress` is told once 8 MiB arrived.
pub fn transfer(
    mut w: SmcStream,
    mut r: SmcStream,
    seed: u64,
    len: usize,
    progress: Option<std::sync::mpsc::Sender<()>>,
) -> std::io::Result<([u8; 32], [u8; 32])> {
    let writer = thread::spawn(move || -> std::io::Result<[u8; 32]> {
        let mut h = Sha256::new();
        let mut off = 0usize;
        let chunk = 4 << 20;
        while off < len {
            let n = chunk.min(len - off);
            let d = pattern(seed + off as u64, n);
            h.update(&d);
            w.write_all(&d)?;
            off += n;
        }
        Ok(h.finalize().into())
    });
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    let mut signalled = false;
    let res = (|| {
        while got < len {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "early EOF"));
            }
            h.update(&buf[..n]);
            got += n;
            if !signalled && got >= 8 << 20 {
                signalled = true;
                if let Some(p) = &progress {
                    let _ = p.send(());
                }
            }
        }
        Ok(())
    })();
    let sent = writer.join().unwrap();
    res?;
    Ok((h.finalize().into(), sent?))
}
