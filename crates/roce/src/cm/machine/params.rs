//! What the application hands the CM and what it gets back: per-port settings, the
//! parameters of a REQ and a REP, the QP attributes a connection ends with, and the
//! requests delivered to a listener.

use std::time::Duration;

use verbs::{Gid, Mtu, RtrAttr, RtsAttr};

use crate::cm::cma::{CmaError, CmaHdr};
use crate::cm::mad::{Req, SidrReq};

/// Per-port settings of the CM.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// Our CA (node) GUID, sent in REQ/REP and as the ARI of a REJ "timeout".
    pub ca_guid: u64,
    /// Our port GID (RoCEv2: the IPv4-mapped or IPv6 address the device is bound to).
    pub local_gid: Gid,
    /// The P_Key our REQs carry (0xffff by default).
    pub pkey: u16,
    /// The CM response timeout we announce and assume of peers (rdma_cm: 20, ≈ 4.3 s).
    pub cm_response_timeout: u8,
    /// Max CM retries we put into our REQs (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// The path's packet life time code; twice it is added to every CM timeout (Linux
    /// `cm_convert_to_ms(packet_life_time) * 2`; rdma_cm on RoCE uses 16 ≈ 268 ms).
    pub packet_life_time: u8,
    /// The service timeout we announce in an MRA (rdma_cm: 24 ≈ 69 s).
    pub mra_service_timeout: u8,
    /// How long a connection stays in time-wait after DREQ/DREP.
    pub time_wait: Duration,
    /// Seed of the comm ID and TID generator (tests use a fixed one).
    pub seed: u64,
}

impl CmConfig {
    /// rdma_cm's defaults for a port with GID `local_gid`.
    pub fn new(ca_guid: u64, local_gid: Gid, seed: u64) -> CmConfig {
        CmConfig {
            ca_guid,
            local_gid,
            pkey: 0xffff,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 16,
            mra_service_timeout: 24,
            time_wait: Duration::from_secs(1),
            seed,
        }
    }
}

/// A connection: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub u32);

/// What [`Cm::connect`](super::Cm::connect) sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The peer's port GID (REQ primary remote GID, and where the MAD goes).
    pub remote_gid: Gid,
    /// The ServiceID the REQ is for (rdma_cm: port space and port).
    pub service_id: u64,
    /// Our RC QP.
    pub qpn: u32,
    /// The PSN our QP expects to receive first (the peer's send PSN).
    pub starting_psn: u32,
    /// Inbound RDMA Reads/atomics we accept (our max_dest_rd_atomic).
    pub responder_resources: u8,
    /// RDMA Reads/atomics we issue at once (our max_rd_atomic).
    pub initiator_depth: u8,
    /// The path MTU for both QPs (the REQ's 4-bit Path MTU).
    pub path_mtu: Mtu,
    /// Transport retries (3 bits) for both QPs.
    pub retry_count: u8,
    /// RNR retries the peer should use towards us (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Local ACK timeout code for both QPs (5 bits).
    pub local_ack_timeout: u8,
    /// Hop Limit of the primary path (the IP TTL on RoCEv2).
    pub hop_limit: u8,
    /// Traffic Class of the primary path (the IP DSCP/ECN octet on RoCEv2).
    pub traffic_class: u8,
    /// Flow Label of the primary path (20 bits).
    pub flow_label: u32,
    /// Our QP takes receive WQEs from a shared receive queue (the REQ's SRQ bit).
    pub srq: bool,
    /// Up to 92 octets (for an rdma_cm peer: [`CmaHdr::req_private_data`]).
    pub private_data: Vec<u8>,
}

impl ConnectParams {
    /// An rdma_cm-style connect: service ID of `dst`'s port in RDMA_PS_TCP, the rdma_cm header
    /// from `src` and `dst`, then `ulp` (≤ 56 octets). Path MTU 1024, retries 7, RNR retries 7,
    /// local ACK timeout 18, hop limit 64, responder resources and initiator depth 1 (what the
    /// Linux REQ in the lab capture carries).
    pub fn rdma_cm(
        src: std::net::SocketAddr,
        dst: std::net::SocketAddr,
        qpn: u32,
        starting_psn: u32,
        ulp: &[u8],
    ) -> Result<ConnectParams, CmaError> {
        let hdr = CmaHdr { src, dst: dst.ip() };
        Ok(ConnectParams::ib_service(
            Gid::from_ip(dst.ip()),
            crate::cm::cma::service_id(crate::cm::cma::PortSpace::Tcp, dst.port()),
            qpn,
            starting_psn,
            &hdr.req_private_data(ulp)?,
        ))
    }

    /// A REQ to a raw IB service ID (no rdma_cm header): `private_data` goes as given (at
    /// most 92 octets), the other fields as [`ConnectParams::rdma_cm`] sets them. IPoIB
    /// connected mode (RFC 4755 §3.1) connects this way.
    pub fn ib_service(
        remote_gid: Gid,
        service_id: u64,
        qpn: u32,
        starting_psn: u32,
        private_data: &[u8],
    ) -> ConnectParams {
        ConnectParams {
            remote_gid,
            service_id,
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: Mtu::Mtu1024,
            retry_count: 7,
            rnr_retry_count: 7,
            local_ack_timeout: 18,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            srq: false,
            private_data: private_data.to_vec(),
        }
    }
}

/// What [`Cm::accept`](super::Cm::accept) answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our RC QP (24 bits; the REP's Local QPN).
    pub qpn: u32,
    /// The PSN our QP expects to receive first.
    pub starting_psn: u32,
    /// Inbound Reads/atomics we accept (≤ the REQ's initiator depth is sensible).
    pub responder_resources: u8,
    /// Reads/atomics we issue (≤ the REQ's responder resources).
    pub initiator_depth: u8,
    /// RNR retries the peer should use towards us (3 bits).
    pub rnr_retry_count: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// Our QP takes receive WQEs from a shared receive queue (the REP's SRQ bit).
    pub srq: bool,
    /// Our QP's minimum RNR NAK timer code (local, not on the wire).
    pub min_rnr_timer: u8,
    /// Up to 196 octets.
    pub private_data: Vec<u8>,
}

/// Everything the provider needs to move its QP INIT → RTR → RTS for this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpParams {
    /// The INIT → RTR attributes (path, path MTU, remote QPN, receive PSN, responder resources, RNR timer).
    pub rtr: RtrAttr,
    /// The RTR → RTS attributes (send PSN, ACK timeout, retries, RNR retries, initiator depth).
    pub rts: RtsAttr,
    /// Our port GID, the source of the QP's path.
    pub local_gid: Gid,
    /// The connection's P_Key.
    pub pkey: u16,
}

/// A REQ delivered to a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The passive side's ID for the connection.
    pub id: CmId,
    /// Where the REQ came from (the address answers go to).
    pub from: Gid,
    /// The ServiceID the REQ is for.
    pub service_id: u64,
    /// The REQ as received (remote QPN, PSN, MTU, path, private data, …).
    pub req: Req,
    /// The rdma_cm header in its private data, if it has a valid one.
    pub cma: Option<CmaHdr>,
}

/// A SIDR exchange: the request ID of the SIDR_REQ we sent (active), or our own handle of a
/// SIDR_REQ received (passive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SidrId(pub u32);

/// Requests received and not yet answered, at most (more are dropped; the requester retries).
pub const MAX_SIDR_PENDING: usize = 1024;
/// Answered requests remembered to answer a repeat, at most (the oldest go first).
pub const MAX_SIDR_ANSWERED: usize = 4096;

/// A SIDR_REQ delivered to a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRequest {
    /// Our handle for the answer ([`Cm::sidr_reply`](super::Cm::sidr_reply)).
    pub id: SidrId,
    /// Where the SIDR_REQ came from (the SIDR_REP goes there).
    pub from: Gid,
    /// The SIDR_REQ as received (request ID, P_Key, service ID, 216 octets of private data).
    pub req: SidrReq,
    /// The rdma_cm header at the start of its private data, if it has a valid one.
    pub cma: Option<CmaHdr>,
}
