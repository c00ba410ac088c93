//! The neighbour table: IP address → IPoIB link address, with the resolution state and a
//! bounded queue of packets waiting for it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use crate::wire::LinkAddr;

/// Resolution state of a neighbour (after Linux's NUD states, reduced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighState {
    /// ARP/NS sent, no answer yet; packets are queued.
    Incomplete {
        /// Requests sent so far.
        attempts: u32,
        /// When the next request goes out.
        next_retry: Duration,
    },
    /// Resolved and confirmed within the reachable time.
    Reachable,
    /// Resolved, reachable time over: still used, re-validated by a new request.
    Stale,
}

/// One neighbour.
#[derive(Debug, Clone)]
pub struct Neigh {
    /// State.
    pub state: NeighState,
    /// Its link address once resolved.
    pub lla: Option<LinkAddr>,
    /// When it was last confirmed (ARP/ND answer or request from it).
    pub confirmed: Duration,
    /// Packets waiting for resolution (bounded by the link's queue length).
    pub queue: VecDeque<Vec<u8>>,
    /// Connected mode is not tried before this time (set after a CM failure).
    pub cm_backoff_until: Option<Duration>,
}

/// The table, bounded in size.
#[derive(Debug, Clone, Default)]
pub struct NeighTable {
    pub(crate) map: HashMap<IpAddr, Neigh>,
}

impl NeighTable {
    /// The entry for `ip`.
    pub fn get(&self, ip: &IpAddr) -> Option<&Neigh> {
        self.map.get(ip)
    }

    /// Entries.
    pub fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Neigh)> {
        self.map.iter()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The table is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
