//! The IPoIB link machine, sans-I/O: plain structs, events in, [`Action`]s out, a clock
//! passed in (`now`, a [`Duration`] since any fixed origin). The daemon feeds it packets
//! from the kernel (the TUN, a NOARP L3 device), UD and RC receives and CM events, and
//! carries out what it asks for.
//!
//! What it does (requirements B2, B4, C2, D3):
//! - the neighbour table ([`neigh`]): IP → 20-octet link address, RC-capable or not,
//!   states and timeouts, a bounded queue of packets waiting for resolution;
//! - ARP (RFC 4391 §9.2) and ND (§9.3) over the broadcast group / solicited-node groups:
//!   it answers requests for our addresses and resolves on demand, always over UD
//!   (IPCM-16); multicast and broadcast IP always over UD (IPCM-2);
//! - connected mode (RFC 4755): an RC connection opened on demand towards RC-capable
//!   neighbours, the §3.3 crossing rule (exactly one connection per pair, IPCM-9), REQ
//!   validation (service ID IPCM-10, private data IPCM-14, Receive MTU IPCM-12/13), REJ
//!   with private data (IPCM-8), idle teardown (IPCM-S2), peer-restart detection, UD
//!   fallback after CM failures (IPCM-S7);
//! - per-destination MTU (connection MTU to connected peers, the UD MTU otherwise) and the
//!   ICMP "fragmentation needed" / ICMPv6 "packet too big" for an oversize packet.

mod machine;
pub mod neigh;

pub use machine::{
    Action, ConnId, ConnState, ConnView, Link, LinkConfig, LinkCounters, Mode, NeighView, REJ_CONSUMER,
    REJ_INVALID_SERVICE_ID, REJ_NO_QP, Role, UdDest,
};

use std::time::Duration;

/// Default timings and bounds (Linux ipoib and neighbour-table defaults where they exist).
pub mod defaults {
    use super::Duration;
    /// Interval between ARP/NS retransmissions for an unresolved neighbour.
    pub const RESOLVE_RETRY: Duration = Duration::from_secs(1);
    /// ARP/NS transmissions before the neighbour is given up (Linux `mcast_solicit` 3).
    pub const RESOLVE_ATTEMPTS: u32 = 3;
    /// A resolved neighbour is re-validated after this (RFC 4391 §9.4 recommends
    /// periodic revalidation because QPNs change on restart).
    pub const REACHABLE_TIME: Duration = Duration::from_secs(30);
    /// Packets queued per unresolved neighbour or pending connection (Linux ipoib:
    /// `IPOIB_MAX_PATH_REC_QUEUE` 3; we keep a few more for bursts).
    pub const QUEUE_LEN: usize = 16;
    /// Neighbour table size.
    pub const MAX_NEIGH: usize = 1024;
    /// Idle connections are torn down after this (Linux `IPOIB_CM_RX_TIMEOUT` is 512 s;
    /// shorter here so tests and small hosts see it).
    pub const CONN_IDLE: Duration = Duration::from_secs(120);
    /// A connection not established after this is abandoned.
    pub const CONN_SETUP: Duration = Duration::from_secs(5);
    /// After a failed connection attempt, the neighbour is reached over UD for this long
    /// before connected mode is tried again (IPCM-S7).
    pub const CM_BACKOFF: Duration = Duration::from_secs(10);
    /// Connections (active + passive) per interface (Linux `max_nonsrq_conn_qp` 128).
    pub const MAX_CONNS: usize = 128;
}
