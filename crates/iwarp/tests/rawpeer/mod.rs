//! A scripted iWARP peer for tests: speaks raw MPA/DDP/RDMAP over a plain TCP
//! socket, built from the crate's own sans-I/O encoders, so a test can send
//! exactly the bytes a misbehaving peer would and read back exactly what the
//! implementation under test (IUT) answers.

#![allow(dead_code)]

use iwarp::wire::ddp::{self, Addr, Header};
use iwarp::wire::fpdu::{Deframer, DeframerConfig, Framer};
use iwarp::wire::mpa::{self, EnhancedData, FrameKind, RtrSet};
pub use iwarp::wire::rdmap::op;
use iwarp::wire::terminate::{self, TermWireForm};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// RDMAP control octet: RV = 01, the opcode in the low nibble.
pub const fn ctrl(opcode: u8) -> u8 {
    0x40 | opcode
}

/// An untagged ULPDU (DDP header, then `body`).
pub fn untagged(opcode: u8, qn: u32, msn: u32, mo: u32, last: bool, inv_stag: u32, body: &[u8]) -> Vec<u8> {
    let h = Header {
        last,
        rdmap_ctrl: ctrl(opcode),
        addr: Addr::Untagged { qn, msn, mo, inv_stag },
    };
    let mut u = vec![0u8; ddp::UNTAGGED_HEADER_LEN + body.len()];
    h.emit(&mut u).unwrap();
    u[ddp::UNTAGGED_HEADER_LEN..].copy_from_slice(body);
    u
}

/// A tagged ULPDU.
pub fn tagged(opcode: u8, stag: u32, to: u64, last: bool, body: &[u8]) -> Vec<u8> {
    let h = Header {
        last,
        rdmap_ctrl: ctrl(opcode),
        addr: Addr::Tagged { stag, to },
    };
    let mut u = vec![0u8; ddp::TAGGED_HEADER_LEN + body.len()];
    h.emit(&mut u).unwrap();
    u[ddp::TAGGED_HEADER_LEN..].copy_from_slice(body);
    u
}

/// What the IUT sent, split into ULPDUs, and how the stream ended.
pub struct Received {
    pub ulpdus: Vec<Vec<u8>>,
    /// The IUT closed its side (FIN) after the last ULPDU.
    pub eof: bool,
    /// Bytes after the last whole FPDU (should be none).
    pub trailing: usize,
}

impl Received {
    /// The Terminates among the ULPDUs (QN 2, opcode 7).
    pub fn terminates(&self) -> Vec<&Vec<u8>> {
        self.ulpdus
            .iter()
            .filter(|u| u.len() >= ddp::UNTAGGED_HEADER_LEN && u[0] & 0x80 == 0 && u[1] & 0x0F == op::TERMINATE)
            .collect()
    }
}

/// Checks of one Terminate: its DDP header (untagged, QN 2, MSN 1, MO 0, L)
/// and decodes the RDMAP Terminate header in the form we send (RFC).
pub fn decode_terminate(ulpdu: &[u8]) -> terminate::Repr {
    let h = Header::parse(ulpdu).expect("Terminate's DDP header parses");
    assert!(h.last, "Terminate is one segment (L=1)");
    assert_eq!(h.rdmap_ctrl, ctrl(op::TERMINATE), "RV 01, opcode Terminate");
    match h.addr {
        Addr::Untagged { qn, msn, mo, .. } => {
            assert_eq!((qn, msn, mo), (2, 1, 0), "RDMAP-TRM-01: QN 2, MSN 1, MO 0");
        }
        Addr::Tagged { .. } => panic!("Terminate must be untagged"),
    }
    let repr = terminate::Repr::parse(&ulpdu[ddp::UNTAGGED_HEADER_LEN..], TermWireForm::Rfc)
        .expect("Terminate header parses in RFC form");
    // RDMAP-HDR-12: its length matches its bits.
    assert_eq!(repr.ulpdu_len(), ulpdu.len(), "Terminate length matches M/D/R");
    repr
}

/// A raw peer on one TCP connection.
pub struct RawPeer {
    pub sock: TcpStream,
    pub framer: Framer,
    pub deframer: Deframer,
    pub buf: Vec<u8>,
    pub reply_pd: Vec<u8>,
}

/// How the raw initiator asks.
#[derive(Clone)]
pub struct Ask {
    pub crc: bool,
    pub ird: u16,
    pub ord: u16,
    pub private_data: Vec<u8>,
}

impl Default for Ask {
    fn default() -> Self {
        Ask {
            crc: false,
            ird: 16,
            ord: 16,
            private_data: Vec::new(),
        }
    }
}

impl RawPeer {
    /// Connects and sends an MPA v2 Request; call [`RawPeer::finish`] once
    /// the IUT accepted.
    pub fn start(addr: SocketAddr, ask: &Ask) -> RawPeer {
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_nodelay(true).unwrap();
        sock.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut r = mpa::Repr::enhanced(
            FrameKind::Request,
            EnhancedData {
                ird: ask.ird,
                ord: ask.ord,
                p2p: false,
                rtr: RtrSet::EMPTY,
            },
            &ask.private_data,
        );
        r.crc = ask.crc;
        let mut out = Vec::new();
        r.emit_vec(&mut out).unwrap();
        (&sock).write_all(&out).unwrap();
        RawPeer {
            sock,
            framer: Framer::new(false, false),
            deframer: Deframer::new(DeframerConfig::default()),
            buf: Vec::new(),
            reply_pd: Vec::new(),
        }
    }

    /// Reads the MPA Reply; CRC per its C bit or ours.
    pub fn finish(mut self, ask: &Ask) -> RawPeer {
        let frame = read_mpa_frame(&mut self.sock);
        let rep = mpa::Repr::parse_exact(&frame, mpa::MAX_PRIVATE_DATA).expect("MPA Reply parses");
        assert_eq!(rep.kind, FrameKind::Reply);
        assert!(!rep.reject, "IUT accepted");
        let crc = ask.crc || rep.crc;
        self.framer = Framer::new(crc, false);
        self.deframer = Deframer::new(DeframerConfig {
            crc,
            ..Default::default()
        });
        self.reply_pd = rep.private_data.to_vec();
        self
    }

    /// One FPDU carrying `ulpdu`.
    pub fn fpdu(&mut self, ulpdu: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.framer.emit_vec(ulpdu, &mut out).unwrap();
        out
    }

    pub fn send(&mut self, ulpdu: &[u8]) {
        let f = self.fpdu(ulpdu);
        self.sock.write_all(&f).unwrap();
    }

    /// Several FPDUs in one write (one TCP segment on loopback).
    pub fn send_all(&mut self, ulpdus: &[Vec<u8>]) {
        let mut out = Vec::new();
        for u in ulpdus {
            out.extend(self.fpdu(u));
        }
        self.sock.write_all(&out).unwrap();
    }

    /// Half-closes: a FIN after what was sent.
    pub fn shutdown_write(&mut self) {
        self.sock.shutdown(std::net::Shutdown::Write).unwrap();
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).unwrap();
    }

    /// Reads FPDUs until `pred` matches one (returned) or the stream ends.
    pub fn read_until(&mut self, mut pred: impl FnMut(&[u8]) -> bool) -> Option<Vec<u8>> {
        loop {
            while !self.buf.is_empty() {
                let (used, u) = self.deframer.next_fpdu(&self.buf).expect("IUT's FPDUs deframe");
                let u = u.map(|u| u.to_vec());
                self.buf.drain(..used);
                if let Some(u) = u
                    && pred(&u)
                {
                    return Some(u);
                }
                if used == 0 {
                    break;
                }
            }
            let mut b = [0u8; 65536];
            match self.sock.read(&mut b) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
                Err(e) => panic!("reading from the IUT: {e}"),
            }
        }
    }

    /// Reads everything until the IUT closes (or the read timeout).
    pub fn read_to_end(&mut self) -> Received {
        let mut ulpdus = Vec::new();
        let mut eof = false;
        loop {
            while !self.buf.is_empty() {
                let (used, u) = self.deframer.next_fpdu(&self.buf).expect("IUT's FPDUs deframe");
                if let Some(u) = u {
                    ulpdus.push(u.to_vec());
                }
                self.buf.drain(..used);
                if used == 0 {
                    break;
                }
            }
            let mut b = [0u8; 65536];
            match self.sock.read(&mut b) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => self.buf.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("reading from the IUT: {e}"),
            }
        }
        Received {
            ulpdus,
            eof,
            trailing: self.buf.len(),
        }
    }
}

/// Reads one MPA Request/Reply frame (header, then PD_Length octets).
pub fn read_mpa_frame(sock: &mut TcpStream) -> Vec<u8> {
    let mut f = vec![0u8; mpa::HEADER_LEN];
    sock.read_exact(&mut f).expect("MPA frame header");
    let pd = u16::from_be_bytes([f[18], f[19]]) as usize;
    let mut rest = vec![0u8; pd];
    sock.read_exact(&mut rest).expect("MPA private data");
    f.extend(rest);
    f
}

/// A raw responder: listens; the IUT connects to it.
pub struct RawListener {
    pub l: TcpListener,
}

impl RawListener {
    pub fn new() -> RawListener {
        RawListener {
            l: TcpListener::bind("127.0.0.1:0").unwrap(),
        }
    }
    pub fn addr(&self) -> SocketAddr {
        self.l.local_addr().unwrap()
    }
    /// Accepts one connection and reads its MPA Request.
    pub fn accept_request(&self) -> (TcpStream, Vec<u8>) {
        let (mut s, _) = self.l.accept().unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        let f = read_mpa_frame(&mut s);
        (s, f)
    }
}

/// Reads whatever arrives until EOF or timeout; returns the bytes and
/// whether the peer closed.
pub fn drain(sock: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut all = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match sock.read(&mut b) {
            Ok(0) => return (all, true),
            Ok(n) => all.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (all, true),
            Err(_) => return (all, false),
        }
    }
}
