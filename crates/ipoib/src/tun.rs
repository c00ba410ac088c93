//! A Linux TUN device (L3, no packet-information header): the kernel side of the IPoIB
//! interface (requirements D3). Opening `/dev/net/tun` and reading/writing packets use
//! `std::fs::File`; the `TUNSETIFF` ioctl and the `fcntl` for `O_NONBLOCK` are the only
//! unsafe code here (the zero-copy reads are in `sys`). Addresses, MTU and
//! the NOARP flag are set with `ip(8)`, as an administrator would.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;

/// `TUNSETIFF` = `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `TUNSETOFFLOAD` = `_IOW('T', 208, unsigned int)`.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// `TUN_F_CSUM`: the reader accepts packets with partial checksums.
const TUN_F_CSUM: libc::c_uint = 0x01;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TUN device.
#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
    vnet_hdr: bool,
}

impl Tun {
    /// Creates (or attaches to) the TUN device `name` (at most 15 octets).
    pub fn open(name: &str) -> io::Result<Tun> {
        Tun::open_flags(name, false)
    }

    /// Like [`Tun::open`], with checksum offload (issue 16): `IFF_VNET_HDR`, so every read
    /// and write carries a 10-octet `virtio_net_hdr` ([`crate::wire::offload::VnetHdr`])
    /// in front of the packet, and `TUNSETOFFLOAD` with `TUN_F_CSUM`, so the kernel hands
    /// over TCP and UDP packets with partial checksums (it computes none itself) and
    /// takes received ones marked checked or partial. No TSO: the kernel segments to the
    /// MTU, which in connected mode already lets a packet carry 64 KiB.
    pub fn open_offload(name: &str) -> io::Result<Tun> {
        Tun::open_flags(name, true)
    }

    fn open_flags(name: &str, vnet_hdr: bool) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('/') {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad interface name"));
        }
        let file = OpenOptions::new().read(true).write(true).open("/dev/net/tun")?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI | if vnet_hdr { IFF_VNET_HDR } else { 0 },
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: `file` is an open /dev/net/tun descriptor for the duration of the call;
        // `req` is a properly initialised `struct ifreq` layout (16-octet name, then the
        // flags, padded to the kernel's 40-octet union) that lives across the call; the
        // kernel reads it and writes back the name, within its size.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if vnet_hdr {
            // SAFETY: as above; TUNSETOFFLOAD takes its argument by value, no pointer.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD, TUN_F_CSUM as libc::c_ulong) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let end = req.name.iter().position(|b| *b == 0).unwrap_or(req.name.len());
        Ok(Tun {
            file,
            name: String::from_utf8_lossy(&req.name[..end]).into_owned(),
            vnet_hdr,
        })
    }

    /// Whether reads and writes carry the `virtio_net_hdr` ([`Tun::open_offload`]).
    pub fn vnet_hdr(&self) -> bool {
        self.vnet_hdr
    }

    /// The interface name the kernel gave.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes reads and writes non-blocking (`O_NONBLOCK`): a read with no packet waiting
    /// fails with `WouldBlock`.
    pub fn set_nonblocking(&self) -> io::Result<()> {
        // SAFETY: F_GETFL/F_SETFL on a descriptor `self.file` keeps open; no pointers.
        let fl = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// A second handle on the same queue (for a reader thread).
    pub fn try_clone(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// The file for writes.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// `ip link set dev NAME addrgenmode none`, `ip link set dev NAME mtu MTU arp off up`, then each address (`A/P`)
    /// added.
    pub fn configure(&self, mtu: u32, addrs: &[String]) -> io::Result<()> {
        // No kernel-made link-local (EUI-64 or stable-privacy): the daemon adds the RFC 4391
        // one. Set before the link first goes up, in a command of its own.
        ip(&["link", "set", "dev", &self.name, "addrgenmode", "none"])?;
        ip(&[
            "link",
            "set",
            "dev",
            &self.name,
            "mtu",
            &mtu.to_string(),
            "arp",
            "off",
            "up",
        ])?;
        for a in addrs {
            ip(&["addr", "add", a, "dev", &self.name])?;
        }
        Ok(())
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
