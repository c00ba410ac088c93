//! What the bench client and server tell each other: the [`Hello`] in the connect
//! request's private data, the [`Reply`] in the accept's, the [`Report`] the client writes
//! at the end of a test, the buffer layout and the limits on `--qps`/`--depth`.

use super::*;

pub(super) const T: Duration = Duration::from_secs(10);
const HELLO_MAGIC: &[u8; 4] = b"SRBN";
const REPLY_MAGIC: &[u8; 4] = b"SRBA";
/// 2: the client writes its [`Report`] into the server's buffer before it ends a test.
const VERSION: u8 = 2;
pub(super) const FLAG_LAT: u8 = 1;
pub(super) const FLAG_LAST: u8 = 2;
pub(super) const FLAG_BASELINE: u8 = 4;
pub(super) const FLAG_EVENTS: u8 = 8;
/// The client runs a UDP baseline after the test (the server waits for its end datagram).
pub(super) const FLAG_BASELINE_UDP: u8 = 16;
/// The ORD/IRD we ask for (the device's maximum).
pub(super) const RD_ATOMIC: u8 = 128;

/// Client -> server, in the connect request's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) op: Op,
    pub(super) flags: u8,
    pub(super) test_id: u32,
    pub(super) qp_index: u16,
    pub(super) qps: u16,
    pub(super) depth: u32,
    pub(super) size: u64,
    pub(super) client_addr: u64,
    pub(super) client_rkey: u32,
    /// Drawn at random by the client, the same for all its tests: how the server tells
    /// the client it serves from a second one.
    pub(super) session: u32,
}

/// A session id for [`Hello::session`]: random, never 0.
pub(super) fn new_session_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    (h.finish() as u32).max(1)
}

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(48);
        b.extend_from_slice(HELLO_MAGIC);
        b.extend_from_slice(&[VERSION, self.op.code(), self.flags, 0]);
        b.extend_from_slice(&self.test_id.to_le_bytes());
        b.extend_from_slice(&self.qp_index.to_le_bytes());
        b.extend_from_slice(&self.qps.to_le_bytes());
        b.extend_from_slice(&self.depth.to_le_bytes());
        b.extend_from_slice(&self.session.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.client_addr.to_le_bytes());
        b.extend_from_slice(&self.client_rkey.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8]) -> Result<Hello> {
        if b.len() < 48 || &b[..4] != HELLO_MAGIC {
            bail!("not a softrdma bench client ({} bytes of private data)", b.len());
        }
        if b[4] != VERSION {
            bail!("bench protocol version {} (we speak {VERSION})", b[4]);
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Ok(Hello {
            op: Op::from_code(b[5]).ok_or_else(|| anyhow!("unknown operation {}", b[5]))?,
            flags: b[6],
            test_id: u32_at(8),
            qp_index: u16_at(12),
            qps: u16_at(14),
            depth: u32_at(16),
            session: u32_at(20),
            size: u64_at(24),
            client_addr: u64_at(32),
            client_rkey: u32_at(40),
        })
    }
    pub(super) fn lat(&self) -> bool {
        self.flags & FLAG_LAT != 0
    }
}

/// Server -> client, in the accept's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) addr: u64,
    pub(super) rkey: u32,
    /// Send bandwidth: receives the server keeps posted (the client's initial credits).
    pub(super) credits: u32,
    /// Send bandwidth: each credit message from the server grants this many Sends.
    pub(super) grant: u32,
    /// Port of the server's plain-TCP baseline listener (0: none).
    pub(super) tcp_port: u16,
}

impl Reply {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(REPLY_MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.rkey.to_le_bytes());
        b.extend_from_slice(&self.credits.to_le_bytes());
        b.extend_from_slice(&self.grant.to_le_bytes());
        b.extend_from_slice(&self.tcp_port.to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b
    }
    pub(super) fn decode(b: &[u8]) -> Result<Reply> {
        if b.len() < 32 || &b[..4] != REPLY_MAGIC || b[4] != VERSION {
            bail!("the peer is not a softrdma bench server of our version");
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Ok(Reply {
            addr: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            rkey: u32_at(16),
            credits: u32_at(20),
            grant: u32_at(24),
            tcp_port: u16::from_le_bytes([b[28], b[29]]),
        })
    }
}

/// Send bandwidth: receives the server keeps posted and how many it grants per credit message.
pub(super) fn send_credits(depth: u32) -> (u32, u32) {
    let credits = (depth * 2).clamp(4, 8192);
    (credits, (credits / 4).max(1))
}

/// One message buffer (at least 64 bytes so the 8-byte atomics and credit messages fit).
pub(super) fn buffer_len(size: u64) -> usize {
    size.max(64) as usize
}

/// The client's region: `[0, L)` messages out and in, `[L, 2L)` the Write
/// ping-pong's echo target, then one "ready" byte per QP that the server
/// sets with an RDMA Write once its receives are posted (Send tests only:
/// iWARP has no receiver-not-ready retry, so a Send that beats the server's
/// `post_recv` would end the connection).
pub(super) fn client_layout(size: u64, qps: u16) -> (usize, usize, usize) {
    let l = buffer_len(size);
    (l, 2 * l, 2 * l + qps as usize)
}

/// The value of the ready byte.
pub(super) const READY: u8 = 0xa5;

/// Where in the server's buffer (`buffer_len(size) + 64` bytes) the client's [`Report`]
/// goes: after the messages and the READY source byte.
pub(super) fn done_offset(size: u64) -> usize {
    buffer_len(size) + 8
}

/// What the client measured in one test, RDMA-Written into the server's buffer at
/// [`done_offset`] when the test is over (one Write per QP, before the disconnect): the
/// server prints it (perftest's server shows the client's figures too), and a disconnect
/// without it is a client that died.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Report {
    pub(super) messages: u64,
    pub(super) secs: f64,
    pub(super) peak_gbit: f64,
    /// Latency tests: the median in nanoseconds (0 for bandwidth).
    pub(super) p50_ns: u64,
}

impl Report {
    pub(super) const LEN: usize = 40;
    const MAGIC: u64 = u64::from_le_bytes(*b"SRBDONE\0");

    pub(super) fn of(o: &Outcome) -> Report {
        Report {
            messages: o.messages,
            secs: o.secs,
            peak_gbit: o.peak_gbit,
            p50_ns: o.hist.as_ref().map_or(0, |h| h.value_at_quantile(0.5)),
        }
    }
    pub(super) fn encode(&self) -> [u8; Report::LEN] {
        let mut b = [0u8; Report::LEN];
        b[..8].copy_from_slice(&self.messages.to_le_bytes());
        b[8..16].copy_from_slice(&self.secs.to_le_bytes());
        b[16..24].copy_from_slice(&self.peak_gbit.to_le_bytes());
        b[24..32].copy_from_slice(&self.p50_ns.to_le_bytes());
        b[32..].copy_from_slice(&Report::MAGIC.to_le_bytes());
        b
    }
    /// `None` unless the magic is there (the client did not finish its test).
    pub(super) fn decode(b: &[u8; Report::LEN]) -> Option<Report> {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (u(32) == Report::MAGIC).then(|| Report {
            messages: u(0),
            secs: f64::from_bits(u(8)),
            peak_gbit: f64::from_bits(u(16)),
            p50_ns: u(24),
        })
    }
}

/// `--qps` at most.
pub(super) const MAX_QPS: u16 = 1024;
/// `--depth` at most (the device allows 32768 WRs per queue).
pub(super) const MAX_DEPTH: u32 = 16384;
/// Completion-queue entries the device allows per CQ.
pub(super) const MAX_CQE: usize = 1 << 20;

/// The client's CQ size for `qps` QPs of send depth `depth`: every QP's sends, the credit
/// messages of a Send test, and room to spare.
pub(super) fn client_cqe(qps: u16, depth: u32) -> usize {
    let (credits, grant) = send_credits(depth);
    let grant_recvs = (credits / grant + 2) as usize;
    qps as usize * (depth as usize + grant_recvs + 8) + 64
}

pub(super) fn qp_attr(send: u32, recv: u32) -> QpInitAttr {
    QpInitAttr {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..Default::default()
    }
}
