//! The CM management datagram: the 24-octet common MAD header (IBA vol. 1 §13.4.3) and the
//! CM messages of §12.6 (both numbers unconfirmed) (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP), parsed from
//! and emitted to the 256-octet MAD that rides in a GSI (QP1) UD datagram.
//!
//! Offsets below are octets into the 232-octet CM message that follows the MAD header; a field
//! "at octet N, W bits, bit offset B" starts B bits below the most significant bit of octet N
//! (IBA vol. 1 tables 106-120, confirmed for 106-108, 110-113, 119, 120; Linux names the same positions in `include/rdma/ibta_vol1_c12.h`).
//! Reserved bits are sent as zero and ignored on receipt. Every message has a fixed
//! private-data area with no length field (C1.3): a parsed message carries the whole area, an
//! emitted one is zero-padded to it.
//!
//! ```text
//!  MAD header   0 BaseVersion 1 | 1 MgmtClass 0x07 | 2 ClassVersion 2 | 3 Method (Send 0x03)
//!               4 Status (16)   | 6 ClassSpecific (16)
//!               8 TransactionID (64)
//!              16 AttributeID (16) | 18 reserved (16) | 20 AttributeModifier (32)
//!  CM message  24 .. 256 (232 octets, layout per AttributeID)
//! ```

use core::fmt;

use verbs::{Gid, Mtu};

/// Octets of a MAD on the GSI (IBA vol. 1 §13.4.2 (unconfirmed)).
pub const MAD_LEN: usize = 256;
/// Octets of the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Octets of a CM message (the MAD data).
pub const CM_MSG_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// `BaseVersion` of every MAD.
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// `ClassVersion` of the CM (IBA 1.2+; Linux `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;
/// The only method CM messages use (§12.6.1 (unconfirmed)): Send.
pub const METHOD_SEND: u8 = 0x03;
/// Q_Key of the GSI (QP1), carried in the DETH of every CM datagram.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Private-data capacity of REQ (C1.3, Linux `IB_CM_REQ_PRIVATE_DATA_SIZE`).
pub const REQ_PDATA: usize = 92;
/// Private-data capacity of MRA.
pub const MRA_PDATA: usize = 222;
/// Private-data capacity of REJ.
pub const REJ_PDATA: usize = 148;
/// Additional reject information capacity of REJ.
pub const REJ_ARI: usize = 72;
/// Private-data capacity of REP.
pub const REP_PDATA: usize = 196;
/// Private-data capacity of RTU.
pub const RTU_PDATA: usize = 224;
/// Private-data capacity of DREQ.
pub const DREQ_PDATA: usize = 220;
/// Private-data capacity of DREP.
pub const DREP_PDATA: usize = 224;
/// Private-data capacity of SIDR_REQ.
pub const SIDR_REQ_PDATA: usize = 216;
/// Private-data capacity of SIDR_REP.
pub const SIDR_REP_PDATA: usize = 136;
/// Additional information capacity of SIDR_REP.
pub const SIDR_REP_INFO: usize = 72;

/// Why a MAD could not be parsed or emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// The MAD is not 256 octets (the length given).
    #[error("MAD is {0} octets, a CM MAD is 256")]
    Length(usize),
    /// The MAD BaseVersion is not 1 (the version given).
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    /// The MgmtClass is not the CM's, 0x07 (the class given).
    #[error("management class {0:#04x} is not the CM (0x07)")]
    NotCm(u8),
    /// The CM ClassVersion is not 2 (the version given).
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    /// The Method is not Send, 0x03 (the method given).
    #[error("CM method {0:#04x}, CM messages use Send (0x03)")]
    Method(u8),
    /// The AttributeID is not a message this CM parses (the ID given).
    #[error("CM attribute {0:#06x} is not one this CM handles")]
    Attribute(u16),
    /// A variable-length field (private data, ARI, additional information) is longer than its room in the message.
    #[error("{what}: {len} octets, the field holds {max}")]
    TooLong {
        /// The field ("REQ private data", ...).
        what: &'static str,
        /// Octets given.
        len: usize,
        /// Octets the field holds.
        max: usize,
    },
    /// A value does not fit the bit width of its field.
    #[error("{what} value {value:#x} does not fit its field")]
    Range {
        /// The field.
        what: &'static str,
        /// The value given.
        value: u64,
    },
}

/// The CM attribute IDs (C1.2, IBA vol. 1 table 103 (unconfirmed)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrId {
    /// ClassPortInfo, 0x0001.
    ClassPortInfo,
    /// ConnectRequest (REQ), 0x0010.
    Req,
    /// MsgRcptAck (MRA), 0x0011.
    Mra,
    /// ConnectReject (REJ), 0x0012.
    Rej,
    /// ConnectReply (REP), 0x0013.
    Rep,
    /// ReadyToUse (RTU), 0x0014.
    Rtu,
    /// DisconnectRequest (DREQ), 0x0015.
    Dreq,
    /// DisconnectReply (DREP), 0x0016.
    Drep,
    /// ServiceIDResReq (SIDR_REQ), 0x0017.
    SidrReq,
    /// ServiceIDResReqResp (SIDR_REP), 0x0018.
    SidrRep,
    /// LoadAlternatePath (LAP), 0x0019.
    Lap,
    /// AlternatePathResponse (APR), 0x001a.
    Apr,
    /// Any other value, kept.
    Unknown(u16),
}

impl From<u16> for AttrId {
    fn from(v: u16) -> AttrId {
        match v {
            0x0001 => AttrId::ClassPortInfo,
            0x0010 => AttrId::Req,
            0x0011 => AttrId::Mra,
            0x0012 => AttrId::Rej,
            0x0013 => AttrId::Rep,
            0x0014 => AttrId::Rtu,
            0x0015 => AttrId::Dreq,
            0x0016 => AttrId::Drep,
            0x0017 => AttrId::SidrReq,
            0x0018 => AttrId::SidrRep,
            0x0019 => AttrId::Lap,
            0x001a => AttrId::Apr,
            v => AttrId::Unknown(v),
        }
    }
}

impl From<AttrId> for u16 {
    fn from(a: AttrId) -> u16 {
        match a {
            AttrId::ClassPortInfo => 0x0001,
            AttrId::Req => 0x0010,
            AttrId::Mra => 0x0011,
            AttrId::Rej => 0x0012,
            AttrId::Rep => 0x0013,
            AttrId::Rtu => 0x0014,
            AttrId::Dreq => 0x0015,
            AttrId::Drep => 0x0016,
            AttrId::SidrReq => 0x0017,
            AttrId::SidrRep => 0x0018,
            AttrId::Lap => 0x0019,
            AttrId::Apr => 0x001a,
            AttrId::Unknown(v) => v,
        }
    }
}

/// The common MAD header (C1.1). `AttributeID` is implied by the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    /// Status: 0 in the MADs this CM sends.
    pub status: u16,
    /// ClassSpecific: 0 in the MADs this CM sends.
    pub class_specific: u16,
    /// Transaction ID: a response (REP, RTU, REJ, MRA, DREP) echoes the TID of the message it
    /// answers, as Linux's CM does (lab README, "RoCEv2 from the host").
    pub tid: u64,
    /// AttributeModifier: 0 in the MADs this CM sends.
    pub attr_mod: u32,
}

impl MadHeader {
    /// A header with status 0 and the given TID.
    pub fn with_tid(tid: u64) -> MadHeader {
        MadHeader {
            status: 0,
            class_specific: 0,
            tid,
            attr_mod: 0,
        }
    }
}

/// Which message a REJ rejects or an MRA acknowledges (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgType {
    /// 0: the REQ.
    Req,
    /// 1: the REP.
    Rep,
    /// 2: another message (an RTU, LAP, ...).
    Other,
    /// The reserved value 3, kept.
    Reserved,
}

impl MsgType {
    fn from_bits(b: u8) -> MsgType {
        match b & 3 {
            0 => MsgType::Req,
            1 => MsgType::Rep,
            2 => MsgType::Other,
            _ => MsgType::Reserved,
        }
    }
    fn bits(self) -> u8 {
        match self {
            MsgType::Req => 0,
            MsgType::Rep => 1,
            MsgType::Other => 2,
            MsgType::Reserved => 3,
        }
    }
}

/// REJ reasons (C1.6, IBA vol. 1 table 109, inferred from the REJ table 108 and REP table 110 around
/// it; Linux `enum ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EEC available.
    NoEec,
    /// 3: no resources available.
    NoResources,
    /// 4: the sender timed out waiting for a response; ARI = its CA GUID.
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: nobody listens on the REQ's service ID.
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: the (CA GUID, QPN) of the REQ belongs to a live connection.
    StaleConn,
    /// 11: the RD channel does not exist.
    RdcNotExist,
    /// 12: the REQ's remote port GID is not ours; ARI = a GID of ours.
    InvalidGid,
    /// 13: invalid primary LID.
    InvalidLid,
    /// 14: invalid primary SL.
    InvalidSl,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass,
    /// 16: invalid primary hop limit.
    InvalidHopLimit,
    /// 17: invalid primary packet rate.
    InvalidPacketRate,
    /// 18: invalid alternate GID.
    InvalidAltGid,
    /// 19: invalid alternate LID.
    InvalidAltLid,
    /// 20: invalid alternate SL.
    InvalidAltSl,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate,
    /// 24: port CM redirect.
    PortCmRedirect,
    /// 25: port redirect.
    PortRedirect,
    /// 26
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: the application refused; private data says why.
    ConsumerDefined,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: unsupported CM class version.
    InvalidClassVersion,
    /// 32: invalid primary flow label.
    InvalidFlowLabel,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel,
    /// Linux `IB_CM_REJ_VENDOR_OPTION_NOT_SUPPORTED` (35).
    VendorOptionNotSupported,
    /// Any other code, kept.
    Unknown(u16),
}

const REJ_TABLE: [(u16, RejReason); 34] = [
    (1, RejReason::NoQp),
    (2, RejReason::NoEec),
    (3, RejReason::NoResources),
    (4, RejReason::Timeout),
    (5, RejReason::Unsupported),
    (6, RejReason::InvalidCommId),
    (7, RejReason::InvalidCommInstance),
    (8, RejReason::InvalidServiceId),
    (9, RejReason::InvalidTransportType),
    (10, RejReason::StaleConn),
    (11, RejReason::RdcNotExist),
    (12, RejReason::InvalidGid),
    (13, RejReason::InvalidLid),
    (14, RejReason::InvalidSl),
    (15, RejReason::InvalidTrafficClass),
    (16, RejReason::InvalidHopLimit),
    (17, RejReason::InvalidPacketRate),
    (18, RejReason::InvalidAltGid),
    (19, RejReason::InvalidAltLid),
    (20, RejReason::InvalidAltSl),
    (21, RejReason::InvalidAltTrafficClass),
    (22, RejReason::InvalidAltHopLimit),
    (23, RejReason::InvalidAltPacketRate),
    (24, RejReason::PortCmRedirect),
    (25, RejReason::PortRedirect),
    (26, RejReason::InvalidMtu),
    (27, RejReason::InsufficientRespResources),
    (28, RejReason::ConsumerDefined),
    (29, RejReason::InvalidRnrRetry),
    (30, RejReason::DuplicateLocalCommId),
    (31, RejReason::InvalidClassVersion),
    (32, RejReason::InvalidFlowLabel),
    (33, RejReason::InvalidAltFlowLabel),
    (35, RejReason::VendorOptionNotSupported),
];

impl From<u16> for RejReason {
    fn from(v: u16) -> RejReason {
        REJ_TABLE
            .iter()
            .find(|(c, _)| *c == v)
            .map_or(RejReason::Unknown(v), |(_, r)| *r)
    }
}

impl From<RejReason> for u16 {
    fn from(r: RejReason) -> u16 {
        match r {
            RejReason::Unknown(v) => v,
            r => REJ_TABLE.iter().find(|(_, x)| *x == r).map_or(0, |(c, _)| *c),
        }
    }
}

impl fmt::Display for RejReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", u16::from(*self))
    }
}

/// A path as the REQ carries it (primary at octet 52, alternate at octet 96).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Path {
    /// Local Port LID (0xffff, the permissive LID, on RoCE).
    pub local_lid: u16,
    /// Remote Port LID (0xffff, the permissive LID, on RoCE).
    pub remote_lid: u16,
    /// The REQ sender's port GID.
    pub local_gid: Gid,
    /// The REQ receiver's port GID.
    pub remote_gid: Gid,
    /// 20 bits.
    pub flow_label: u32,
    /// 6 bits.
    pub packet_rate: u8,
    /// Traffic Class of the GRH (the IP DSCP/ECN octet on RoCEv2).
    pub traffic_class: u8,
    /// Hop Limit of the GRH (the IP TTL on RoCEv2).
    pub hop_limit: u8,
    /// 4 bits.
    pub sl: u8,
    /// SubnetLocal: the path stays in the local subnet (no GRH needed on IB).
    pub subnet_local: bool,
    /// 5 bits: 4.096 µs × 2^t.
    pub local_ack_timeout: u8,
}

/// Connection request (IBA vol. 1 table 106).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Local Communication ID: the REQ sender's ID for this connection.
    pub local_comm_id: u32,
    /// ServiceID the REQ is for (rdma_cm: port space and port, see `cma`).
    pub service_id: u64,
    /// Local CA GUID of the REQ sender.
    pub local_ca_guid: u64,
    /// Local Q_Key (not used by RC).
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// Responder Resources: RDMA Reads and atomics the sender accepts outstanding (its IRD).
    pub responder_resources: u8,
    /// 24 bits.
    pub local_eecn: u32,
    /// Initiator Depth: RDMA Reads and atomics the sender keeps outstanding (its ORD).
    pub initiator_depth: u8,
    /// 24 bits.
    pub remote_eecn: u32,
    /// 5 bits: how long the sender waits for the receiver's answer (4.096 µs × 2^t).
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 2 RD.
    pub transport_service_type: u8,
    /// End-to-End Flow Control: the sender's CA implements it (else its ACKs carry invalid credits).
    pub end_to_end_flow_control: bool,
    /// 24 bits. In Linux's CM (and so with rdma_cm peers) this is the PSN the REQ sender
    /// expects to receive, i.e. the receiver's send PSN (lab README, "PSN direction").
    pub starting_psn: u32,
    /// 5 bits: how long the sender takes to answer a REP.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    /// Partition Key of the connection.
    pub pkey: u16,
    /// 4 bits, the `ibv_mtu` code (1 = 256 … 5 = 4096); see [`Req::mtu`].
    pub path_mtu: u8,
    /// RDC Exists (RD only).
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP takes receive WQEs from a shared receive queue.
    pub srq: bool,
    /// 3 bits.
    pub extended_transport_type: u8,
    /// The primary path (octets 52..96).
    pub primary_path: Path,
    /// All zero: no alternate path.
    pub alternate_path: Path,
    /// SAP Supported: the sender supports the alternate path (LAP/APR).
    pub sap_supported: bool,
    /// Up to 92 octets; a parsed REQ has all 92.
    pub private_data: Vec<u8>,
}

impl Req {
    /// The path MTU as a verbs [`Mtu`], if the code is valid.
    pub fn mtu(&self) -> Option<Mtu> {
        mtu_from_code(self.path_mtu)
    }
}

/// The verbs MTU of an `ibv_mtu` code.
pub fn mtu_from_code(c: u8) -> Option<Mtu> {
    Some(match c {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// Message receipt acknowledgement (IBA vol. 1 table 107).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local Communication ID of the MRA sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the peer's ID for the connection.
    pub remote_comm_id: u32,
    /// Message MRAed: which message this acknowledges (REQ, REP or other).
    pub message_mraed: MsgType,
    /// 5 bits: the extra time the sender needs (4.096 µs × 2^t).
    pub service_timeout: u8,
    /// Up to 222 octets (`MRA_PDATA`).
    pub private_data: Vec<u8>,
}

/// Reject (IBA vol. 1 table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local Communication ID of the REJ sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the peer's ID for the connection.
    pub remote_comm_id: u32,
    /// Message Rejected: which message this rejects (REQ, REP or other).
    pub message_rejected: MsgType,
    /// Reason: the 16-bit reject code.
    pub reason: RejReason,
    /// Additional reject information; its length is the 7-bit "Reject Info Length" (≤ 72).
    pub ari: Vec<u8>,
    /// Up to 148 octets (`REJ_PDATA`).
    pub private_data: Vec<u8>,
}

/// Connection reply (IBA vol. 1 table 110).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local Communication ID of the REP sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the REQ's Local Communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key (not used by RC).
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits: the PSN the REP sender expects to receive (the REQ sender's send PSN).
    pub starting_psn: u32,
    /// Responder Resources: RDMA Reads and atomics the REP sender accepts outstanding (its IRD).
    pub responder_resources: u8,
    /// Initiator Depth: RDMA Reads and atomics the REP sender keeps outstanding (its ORD).
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    /// End-to-End Flow Control: the sender's CA implements it (else its ACKs carry invalid credits).
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// SRQ: the sender's QP takes receive WQEs from a shared receive queue.
    pub srq: bool,
    /// Local CA GUID of the REP sender.
    pub local_ca_guid: u64,
    /// Up to 196 octets (`REP_PDATA`).
    pub private_data: Vec<u8>,
}

/// Ready to use (IBA vol. 1 table 111).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// Local Communication ID of the RTU sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the REP sender's ID.
    pub remote_comm_id: u32,
    /// Up to 224 octets (`RTU_PDATA`).
    pub private_data: Vec<u8>,
}

/// Disconnect request (IBA vol. 1 table 112).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// Local Communication ID of the DREQ sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's ID.
    pub remote_comm_id: u32,
    /// 24 bits: the receiver's QPN (Linux drops a DREQ whose QPN is not its own).
    pub remote_qpn: u32,
    /// Up to 220 octets (`DREQ_PDATA`).
    pub private_data: Vec<u8>,
}

/// Disconnect reply (IBA vol. 1 table 113).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// Local Communication ID of the DREP sender.
    pub local_comm_id: u32,
    /// Remote Communication ID: the DREQ sender's ID.
    pub remote_comm_id: u32,
    /// Up to 224 octets (`DREP_PDATA`).
    pub private_data: Vec<u8>,
}

/// The status of a SIDR_REP (its field in IBA vol. 1 table 120; Linux `enum ib_cm_sidr_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Valid,
    /// 1: nobody serves the service ID.
    Unsupported,
    /// 2: the service refused the request (rdma_cm's `rdma_reject` on a UD ID).
    Rejected,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect (the ClassPortInfo says where).
    Redirect,
    /// 5: unsupported CM class version.
    UnsupportedVersion,
    /// Any other value, kept.
    Unknown(u8),
}

impl From<u8> for SidrStatus {
    fn from(v: u8) -> SidrStatus {
        match v {
            0 => SidrStatus::Valid,
            1 => SidrStatus::Unsupported,
            2 => SidrStatus::Rejected,
            3 => SidrStatus::NoQp,
            4 => SidrStatus::Redirect,
            5 => SidrStatus::UnsupportedVersion,
            v => SidrStatus::Unknown(v),
        }
    }
}

impl From<SidrStatus> for u8 {
    fn from(s: SidrStatus) -> u8 {
        match s {
            SidrStatus::Valid => 0,
            SidrStatus::Unsupported => 1,
            SidrStatus::Rejected => 2,
            SidrStatus::NoQp => 3,
            SidrStatus::Redirect => 4,
            SidrStatus::UnsupportedVersion => 5,
            SidrStatus::Unknown(v) => v,
        }
    }
}

impl fmt::Display for SidrStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            SidrStatus::Valid => "valid",
            SidrStatus::Unsupported => "service ID not supported",
            SidrStatus::Rejected => "rejected",
            SidrStatus::NoQp => "no QP",
            SidrStatus::Redirect => "redirect",
            SidrStatus::UnsupportedVersion => "unsupported class version",
            SidrStatus::Unknown(_) => "unknown status",
        };
        write!(f, "SIDR_REP status {} ({what})", u8::from(*self))
    }
}

/// Service ID resolution request (IBA vol. 1 table 119), for UD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID: the SIDR_REP echoes it.
    pub request_id: u32,
    /// Partition Key of the request.
    pub pkey: u16,
    /// ServiceID to resolve.
    pub service_id: u64,
    /// Up to 216 octets (`SIDR_REQ_PDATA`).
    pub private_data: Vec<u8>,
}

/// Service ID resolution reply (IBA vol. 1 table 120), for UD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// Request ID of the SIDR_REQ answered.
    pub request_id: u32,
    /// 0 valid, 1 service ID not supported, 2 rejected, 3 no QP, 4 redirect, 5 class version
    /// ([`SidrStatus`]; kept as the octet so that any value round-trips).
    pub status: u8,
    /// 24 bits.
    pub qpn: u32,
    /// ServiceID resolved.
    pub service_id: u64,
    /// Q_Key of the UD QP.
    pub qkey: u32,
    /// Additional information, length in octet 5 (≤ 72).
    pub additional_info: Vec<u8>,
    /// Up to 136 octets (`SIDR_REP_PDATA`).
    pub private_data: Vec<u8>,
}

/// A CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    /// REQ.
    Req(Req),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Rtu),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Drep),
    /// SIDR_REQ.
    SidrReq(SidrReq),
    /// SIDR_REP.
    SidrRep(SidrRep),
}

impl CmMsg {
    /// The attribute ID this message is sent with.
    pub fn attr_id(&self) -> AttrId {
        match self {
            CmMsg::Req(_) => AttrId::Req,
            CmMsg::Mra(_) => AttrId::Mra,
            CmMsg::Rej(_) => AttrId::Rej,
            CmMsg::Rep(_) => AttrId::Rep,
            CmMsg::Rtu(_) => AttrId::Rtu,
            CmMsg::Dreq(_) => AttrId::Dreq,
            CmMsg::Drep(_) => AttrId::Drep,
            CmMsg::SidrReq(_) => AttrId::SidrReq,
            CmMsg::SidrRep(_) => AttrId::SidrRep,
        }
    }
}

/// A whole CM MAD: header and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mad {
    /// The common MAD header.
    pub hdr: MadHeader,
    /// The CM message (its AttributeID is [`CmMsg::attr_id`]).
    pub msg: CmMsg,
}

/// Field positions (octets into the CM message).
mod field {
    pub mod req {
        pub const LOCAL_COMM_ID: usize = 0;
        pub const SERVICE_ID: usize = 8;
        pub const LOCAL_CA_GUID: usize = 16;
        pub const LOCAL_QKEY: usize = 28;
        pub const LOCAL_QPN: usize = 32;
        pub const RESPONDER_RESOURCES: usize = 35;
        pub const LOCAL_EECN: usize = 36;
        pub const INITIATOR_DEPTH: usize = 39;
        pub const REMOTE_EECN: usize = 40;
        /// remote CM response timeout (5) | transport service type (2) | e2e flow control (1)
        pub const FLAGS43: usize = 43;
        pub const STARTING_PSN: usize = 44;
        /// local CM response timeout (5) | retry count (3)
        pub const FLAGS47: usize = 47;
        pub const PKEY: usize = 48;
        /// path MTU (4) | RDC exists (1) | RNR retry count (3)
        pub const FLAGS50: usize = 50;
        /// max CM retries (4) | SRQ (1) | extended transport type (3)
        pub const FLAGS51: usize = 51;
        pub const PRIMARY_PATH: usize = 52;
        pub const ALTERNATE_PATH: usize = 96;
        pub const PATH_LEN: usize = 44;
        pub const PRIVATE_DATA: usize = 140;
    }
    pub mod rep {
        pub const LOCAL_QKEY: usize = 8;
        pub const LOCAL_QPN: usize = 12;
        pub const LOCAL_EECN: usize = 16;
        pub const STARTING_PSN: usize = 20;
        pub const RESPONDER_RESOURCES: usize = 24;
        pub const INITIATOR_DEPTH: usize = 25;
        /// target ACK delay (5) | failover accepted (2) | e2e flow control (1)
        pub const FLAGS26: usize = 26;
        /// RNR retry count (3) | SRQ (1) | reserved (4)
        pub const FLAGS27: usize = 27;
        pub const LOCAL_CA_GUID: usize = 28;
        pub const PRIVATE_DATA: usize = 36;
    }
    /// Local and remote comm ID of every message but REQ and SIDR.
    pub const LOCAL_COMM_ID: usize = 0;
    pub const REMOTE_COMM_ID: usize = 4;
    pub mod mra {
        pub const MESSAGE_MRAED: usize = 8;
        pub const SERVICE_TIMEOUT: usize = 9;
        pub const PRIVATE_DATA: usize = 10;
    }
    pub mod rej {
        pub const MESSAGE_REJECTED: usize = 8;
        pub const INFO_LENGTH: usize = 9;
        pub const REASON: usize = 10;
        pub const ARI: usize = 12;
        pub const PRIVATE_DATA: usize = 84;
    }
    pub const RTU_PRIVATE_DATA: usize = 8;
    pub const DREQ_REMOTE_QPN: usize = 8;
    pub const DREQ_PRIVATE_DATA: usize = 12;
    pub const DREP_PRIVATE_DATA: usize = 8;
    pub mod sidr_req {
        pub const REQUEST_ID: usize = 0;
        pub const PKEY: usize = 4;
        pub const SERVICE_ID: usize = 8;
        pub const PRIVATE_DATA: usize = 16;
    }
    pub mod sidr_rep {
        pub const REQUEST_ID: usize = 0;
        pub const STATUS: usize = 4;
        pub const INFO_LENGTH: usize = 5;
        pub const QPN: usize = 8;
        pub const SERVICE_ID: usize = 12;
        pub const QKEY: usize = 20;
        pub const INFO: usize = 24;
        pub const PRIVATE_DATA: usize = 96;
    }
}

type Msg = [u8; CM_MSG_LEN];

fn u16_at(b: &Msg, o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn u24_at(b: &Msg, o: usize) -> u32 {
    u32::from_be_bytes([0, b[o], b[o + 1], b[o + 2]])
}
fn u32_at(b: &Msg, o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &Msg, o: usize) -> u64 {
    (u64::from(u32_at(b, o)) << 32) | u64::from(u32_at(b, o + 4))
}
fn gid_at(b: &Msg, o: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[o..o + 16]);
    Gid(g)
}
fn put16(b: &mut Msg, o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put24(b: &mut Msg, o: usize, v: u32) {
    b[o..o + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn put32(b: &mut Msg, o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut Msg, o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

/// Checks that `value` fits in `bits` bits.
fn fits(what: &'static str, value: u64, bits: u32) -> Result<(), MadError> {
    if value >> bits == 0 {
        Ok(())
    } else {
        Err(MadError::Range { what, value })
    }
}

fn put_bytes(b: &mut Msg, o: usize, cap: usize, what: &'static str, v: &[u8]) -> Result<(), MadError> {
    if v.len() > cap {
        return Err(MadError::TooLong {
            what,
            len: v.len(),
            max: cap,
        });
    }
    b[o..o + v.len()].copy_from_slice(v);
    Ok(())
}

fn parse_path(b: &Msg, o: usize) -> Path {
    Path {
        local_lid: u16_at(b, o),
        remote_lid: u16_at(b, o + 2),
        local_gid: gid_at(b, o + 4),
        remote_gid: gid_at(b, o + 20),
        flow_label: u32_at(b, o + 36) >> 12,
        packet_rate: b[o + 39] & 0x3f,
        traffic_class: b[o + 40],
        hop_limit: b[o + 41],
        sl: b[o + 42] >> 4,
        subnet_local: b[o + 42] & 0x08 != 0,
        local_ack_timeout: b[o + 43] >> 3,
    }
}

fn emit_path(b: &mut Msg, o: usize, p: &Path) -> Result<(), MadError> {
    fits("flow label", p.flow_label.into(), 20)?;
    fits("packet rate", p.packet_rate.into(), 6)?;
    fits("SL", p.sl.into(), 4)?;
    fits("local ACK timeout", p.local_ack_timeout.into(), 5)?;
    put16(b, o, p.local_lid);
    put16(b, o + 2, p.remote_lid);
    b[o + 4..o + 20].copy_from_slice(&p.local_gid.0);
    b[o + 20..o + 36].copy_from_slice(&p.remote_gid.0);
    put32(b, o + 36, (p.flow_label << 12) | u32::from(p.packet_rate));
    b[o + 40] = p.traffic_class;
    b[o + 41] = p.hop_limit;
    b[o + 42] = (p.sl << 4) | if p.subnet_local { 0x08 } else { 0 };
    b[o + 43] = p.local_ack_timeout << 3;
    Ok(())
}

impl Req {
    fn parse(b: &Msg) -> Req {
        use field::req::*;
        Req {
            local_comm_id: u32_at(b, LOCAL_COMM_ID),
            service_id: u64_at(b, SERVICE_ID),
            local_ca_guid: u64_at(b, LOCAL_CA_GUID),
            local_qkey: u32_at(b, LOCAL_QKEY),
            local_qpn: u24_at(b, LOCAL_QPN),
            responder_resources: b[RESPONDER_RESOURCES],
            local_eecn: u24_at(b, LOCAL_EECN),
            initiator_depth: b[INITIATOR_DEPTH],
            remote_eecn: u24_at(b, REMOTE_EECN),
            remote_cm_response_timeout: b[FLAGS43] >> 3,
            transport_service_type: (b[FLAGS43] >> 1) & 3,
            end_to_end_flow_control: b[FLAGS43] & 1 != 0,
            starting_psn: u24_at(b, STARTING_PSN),
            local_cm_response_timeout: b[FLAGS47] >> 3,
            retry_count: b[FLAGS47] & 7,
            pkey: u16_at(b, PKEY),
            path_mtu: b[FLAGS50] >> 4,
            rdc_exists: b[FLAGS50] & 0x08 != 0,
            rnr_retry_count: b[FLAGS50] & 7,
            max_cm_retries: b[FLAGS51] >> 4,
            srq: b[FLAGS51] & 0x08 != 0,
            extended_transport_type: b[FLAGS51] & 7,
            primary_path: parse_path(b, PRIMARY_PATH),
            alternate_path: parse_path(b, ALTERNATE_PATH),
            sap_supported: b[ALTERNATE_PATH + PATH_LEN - 1] & 0x04 != 0,
            private_data: b[PRIVATE_DATA..].to_vec(),
        }
    }

    fn emit(&self, b: &mut Msg) -> Result<(), MadError> {
        use field::req::*;
        fits("local QPN", self.local_qpn.into(), 24)?;
        fits("local EECN", self.local_eecn.into(), 24)?;
        fits("remote EECN", self.remote_eecn.into(), 24)?;
        fits("starting PSN", self.starting_psn.into(), 24)?;
        fits("remote CM response timeout", self.remote_cm_response_timeout.into(), 5)?;
        fits("transport service type", self.transport_service_type.into(), 2)?;
        fits("local CM response timeout", self.local_cm_response_timeout.into(), 5)?;
        fits("retry count", self.retry_count.into(), 3)?;
        fits("path MTU", self.path_mtu.into(), 4)?;
        fits("RNR retry count", self.rnr_retry_count.into(), 3)?;
        fits("max CM retries", self.max_cm_retries.into(), 4)?;
        fits("extended transport type", self.extended_transport_type.into(), 3)?;
        put32(b, LOCAL_COMM_ID, self.local_comm_id);
        put64(b, SERVICE_ID, self.service_id);
        put64(b, LOCAL_CA_GUID, self.local_ca_guid);
        put32(b, LOCAL_QKEY, self.local_qkey);
        put24(b, LOCAL_QPN, self.local_qpn);
        b[RESPONDER_RESOURCES] = self.responder_resources;
        put24(b, LOCAL_EECN, self.local_eecn);
        b[INITIATOR_DEPTH] = self.initiator_depth;
        put24(b, REMOTE_EECN, self.remote_eecn);
        b[FLAGS43] = (self.remote_cm_response_timeout << 3)
            | (self.transport_service_type << 1)
            | u8::from(self.end_to_end_flow_control);
        put24(b, STARTING_PSN, self.starting_psn);
        b[FLAGS47] = (self.local_cm_response_timeout << 3) | self.retry_count;
        put16(b, PKEY, self.pkey);
        b[FLAGS50] = (self.path_mtu << 4) | if self.rdc_exists { 0x08 } else { 0 } | self.rnr_retry_count;
        b[FLAGS51] = (self.max_cm_retries << 4) | if self.srq { 0x08 } else { 0 } | self.extended_transport_type;
        emit_path(b, PRIMARY_PATH, &self.primary_path)?;
        emit_path(b, ALTERNATE_PATH, &self.alternate_path)?;
        if self.sap_supported {
            b[ALTERNATE_PATH + PATH_LEN - 1] |= 0x04;
        }
        put_bytes(b, PRIVATE_DATA, REQ_PDATA, "REQ private data", &self.private_data)
    }
}

impl Rep {
    fn parse(b: &Msg) -> Rep {
        use field::rep::*;
        Rep {
            local_comm_id: u32_at(b, field::LOCAL_COMM_ID),
            remote_comm_id: u32_at(b, field::REMOTE_COMM_ID),
            local_qkey: u32_at(b, LOCAL_QKEY),
            local_qpn: u24_at(b, LOCAL_QPN),
            local_eecn: u24_at(b, LOCAL_EECN),
            starting_psn: u24_at(b, STARTING_PSN),
            responder_resources: b[RESPONDER_RESOURCES],
            initiator_depth: b[INITIATOR_DEPTH],
            target_ack_delay: b[FLAGS26] >> 3,
            failover_accepted: (b[FLAGS26] >> 1) & 3,
            end_to_end_flow_control: b[FLAGS26] & 1 != 0,
            rnr_retry_count: b[FLAGS27] >> 5,
            srq: b[FLAGS27] & 0x10 != 0,
            local_ca_guid: u64_at(b, LOCAL_CA_GUID),
            private_data: b[PRIVATE_DATA..].to_vec(),
        }
    }

    fn emit(&self, b: &mut Msg) -> Result<(), MadError> {
        use field::rep::*;
        fits("local QPN", self.local_qpn.into(), 24)?;
        fits("local EECN", self.local_eecn.into(), 24)?;
        fits("starting PSN", self.starting_psn.into(), 24)?;
        fits("target ACK delay", self.target_ack_delay.into(), 5)?;
        fits("failover accepted", self.failover_accepted.into(), 2)?;
        fits("RNR retry count", self.rnr_retry_count.into(), 3)?;
        put32(b, field::LOCAL_COMM_ID, self.local_comm_id);
        put32(b, field::REMOTE_COMM_ID, self.remote_comm_id);
        put32(b, LOCAL_QKEY, self.local_qkey);
        put24(b, LOCAL_QPN, self.local_qpn);
        put24(b, LOCAL_EECN, self.local_eecn);
        put24(b, STARTING_PSN, self.starting_psn);
        b[RESPONDER_RESOURCES] = self.responder_resources;
        b[INITIATOR_DEPTH] = self.initiator_depth;
        b[FLAGS26] =
            (self.target_ack_delay << 3) | (self.failover_accepted << 1) | u8::from(self.end_to_end_flow_control);
        b[FLAGS27] = (self.rnr_retry_count << 5) | if self.srq { 0x10 } else { 0 };
        put64(b, LOCAL_CA_GUID, self.local_ca_guid);
        put_bytes(b, PRIVATE_DATA, REP_PDATA, "REP private data", &self.private_data)
    }
}

impl Mad {
    /// Parses a 256-octet CM MAD (C1.1). Peer input: never panics.
    pub fn parse(buf: &[u8]) -> Result<Mad, MadError> {
        if buf.len() != MAD_LEN {
            return Err(MadError::Length(buf.len()));
        }
        if buf[0] != BASE_VERSION {
            return Err(MadError::BaseVersion(buf[0]));
        }
        if buf[1] != MGMT_CLASS_CM {
            return Err(MadError::NotCm(buf[1]));
        }
        if buf[2] != CM_CLASS_VERSION {
            return Err(MadError::ClassVersion(buf[2]));
        }
        if buf[3] != METHOD_SEND {
            return Err(MadError::Method(buf[3]));
        }
        let hdr = MadHeader {
            status: u16::from_be_bytes([buf[4], buf[5]]),
            class_specific: u16::from_be_bytes([buf[6], buf[7]]),
            tid: u64::from_be_bytes([buf[8], buf[9], buf[10], buf[11], buf[12], buf[13], buf[14], buf[15]]),
            attr_mod: u32::from_be_bytes([buf[20], buf[21], buf[22], buf[23]]),
        };
        let attr = u16::from_be_bytes([buf[16], buf[17]]);
        let mut b: Msg = [0; CM_MSG_LEN];
        b.copy_from_slice(&buf[MAD_HDR_LEN..]);
        let b = &b;
        let ids = (u32_at(b, field::LOCAL_COMM_ID), u32_at(b, field::REMOTE_COMM_ID));
        let msg = match AttrId::from(attr) {
            AttrId::Req => CmMsg::Req(Req::parse(b)),
            AttrId::Rep => CmMsg::Rep(Rep::parse(b)),
            AttrId::Mra => {
                use field::mra::*;
                CmMsg::Mra(Mra {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_mraed: MsgType::from_bits(b[MESSAGE_MRAED] >> 6),
                    service_timeout: b[SERVICE_TIMEOUT] >> 3,
                    private_data: b[PRIVATE_DATA..].to_vec(),
                })
            }
            AttrId::Rej => {
                use field::rej::*;
                let ari_len = usize::from(b[INFO_LENGTH] >> 1);
                if ari_len > REJ_ARI {
                    return Err(MadError::TooLong {
                        what: "REJ reject info",
                        len: ari_len,
                        max: REJ_ARI,
                    });
                }
                CmMsg::Rej(Rej {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_rejected: MsgType::from_bits(b[MESSAGE_REJECTED] >> 6),
                    reason: RejReason::from(u16_at(b, REASON)),
                    ari: b[ARI..ARI + ari_len].to_vec(),
                    private_data: b[PRIVATE_DATA..].to_vec(),
                })
            }
            AttrId::Rtu => CmMsg::Rtu(Rtu {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                private_data: b[field::RTU_PRIVATE_DATA..].to_vec(),
            }),
            AttrId::Dreq => CmMsg::Dreq(Dreq {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                remote_qpn: u24_at(b, field::DREQ_REMOTE_QPN),
                private_data: b[field::DREQ_PRIVATE_DATA..].to_vec(),
            }),
            AttrId::Drep => CmMsg::Drep(Drep {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                private_data: b[field::DREP_PRIVATE_DATA..].to_vec(),
            }),
            AttrId::SidrReq => {
                use field::sidr_req::*;
                CmMsg::SidrReq(SidrReq {
                    request_id: u32_at(b, REQUEST_ID),
                    pkey: u16_at(b, PKEY),
                    service_id: u64_at(b, SERVICE_ID),
                    private_data: b[PRIVATE_DATA..].to_vec(),
                })
            }
            AttrId::SidrRep => {
                use field::sidr_rep::*;
                let info_len = usize::from(b[INFO_LENGTH]);
                if info_len > SIDR_REP_INFO {
                    return Err(MadError::TooLong {
                        what: "SIDR_REP additional information",
                        len: info_len,
                        max: SIDR_REP_INFO,
                    });
                }
                CmMsg::SidrRep(SidrRep {
                    request_id: u32_at(b, REQUEST_ID),
                    status: b[STATUS],
                    qpn: u24_at(b, QPN),
                    service_id: u64_at(b, SERVICE_ID),
                    qkey: u32_at(b, QKEY),
                    additional_info: b[INFO..INFO + info_len].to_vec(),
                    private_data: b[PRIVATE_DATA..].to_vec(),
                })
            }
            _ => return Err(MadError::Attribute(attr)),
        };
        Ok(Mad { hdr, msg })
    }

    /// Emits the 256-octet MAD. Fails if a field does not fit (a private data area too long,
    /// a 24-bit number above 2^24, …); nothing is partially written then.
    pub fn emit(&self) -> Result<[u8; MAD_LEN], MadError> {
        let mut b: Msg = [0; CM_MSG_LEN];
        match &self.msg {
            CmMsg::Req(m) => m.emit(&mut b)?,
            CmMsg::Rep(m) => m.emit(&mut b)?,
            CmMsg::Mra(m) => {
                use field::mra::*;
                fits("service timeout", m.service_timeout.into(), 5)?;
                put32(&mut b, field::LOCAL_COMM_ID, m.local_comm_id);
                put32(&mut b, field::REMOTE_COMM_ID, m.remote_comm_id);
                b[MESSAGE_MRAED] = m.message_mraed.bits() << 6;
                b[SERVICE_TIMEOUT] = m.service_timeout << 3;
                put_bytes(&mut b, PRIVATE_DATA, MRA_PDATA, "MRA private data", &m.private_data)?;
            }
            CmMsg::Rej(m) => {
                use field::rej::*;
                put32(&mut b, field::LOCAL_COMM_ID, m.local_comm_id);
                put32(&mut b, field::REMOTE_COMM_ID, m.remote_comm_id);
                b[MESSAGE_REJECTED] = m.message_rejected.bits() << 6;
                put_bytes(&mut b, ARI, REJ_ARI, "REJ reject info", &m.ari)?;
                // ari.len() <= 72 < 128 after the check above.
                b[INFO_LENGTH] = (m.ari.len() as u8) << 1;
                put16(&mut b, REASON, m.reason.into());
                put_bytes(&mut b, PRIVATE_DATA, REJ_PDATA, "REJ private data", &m.private_data)?;
            }
            CmMsg::Rtu(m) => {
                put32(&mut b, field::LOCAL_COMM_ID, m.local_comm_id);
                put32(&mut b, field::REMOTE_COMM_ID, m.remote_comm_id);
                put_bytes(
                    &mut b,
                    field::RTU_PRIVATE_DATA,
                    RTU_PDATA,
                    "RTU private data",
                    &m.private_data,
                )?;
            }
            CmMsg::Dreq(m) => {
                fits("DREQ remote QPN", m.remote_qpn.into(), 24)?;
                put32(&mut b, field::LOCAL_COMM_ID, m.local_comm_id);
                put32(&mut b, field::REMOTE_COMM_ID, m.remote_comm_id);
                put24(&mut b, field::DREQ_REMOTE_QPN, m.remote_qpn);
                put_bytes(
                    &mut b,
                    field::DREQ_PRIVATE_DATA,
                    DREQ_PDATA,
                    "DREQ private data",
                    &m.private_data,
                )?;
            }
            CmMsg::Drep(m) => {
                put32(&mut b, field::LOCAL_COMM_ID, m.local_comm_id);
                put32(&mut b, field::REMOTE_COMM_ID, m.remote_comm_id);
                put_bytes(
                    &mut b,
                    field::DREP_PRIVATE_DATA,
                    DREP_PDATA,
                    "DREP private data",
                    &m.private_data,
                )?;
            }
            CmMsg::SidrReq(m) => {
                use field::sidr_req::*;
                put32(&mut b, REQUEST_ID, m.request_id);
                put16(&mut b, PKEY, m.pkey);
                put64(&mut b, SERVICE_ID, m.service_id);
                put_bytes(
                    &mut b,
                    PRIVATE_DATA,
                    SIDR_REQ_PDATA,
                    "SIDR_REQ private data",
                    &m.private_data,
                )?;
            }
            CmMsg::SidrRep(m) => {
                use field::sidr_rep::*;
                fits("SIDR_REP QPN", m.qpn.into(), 24)?;
                put32(&mut b, REQUEST_ID, m.request_id);
                b[STATUS] = m.status;
                put_bytes(
                    &mut b,
                    INFO,
                    SIDR_REP_INFO,
                    "SIDR_REP additional information",
                    &m.additional_info,
                )?;
                b[INFO_LENGTH] = m.additional_info.len() as u8;
                put24(&mut b, QPN, m.qpn);
                put64(&mut b, SERVICE_ID, m.service_id);
                put32(&mut b, QKEY, m.qkey);
                put_bytes(
                    &mut b,
                    PRIVATE_DATA,
                    SIDR_REP_PDATA,
                    "SIDR_REP private data",
                    &m.private_data,
                )?;
            }
        }
        let mut out = [0u8; MAD_LEN];
        out[0] = BASE_VERSION;
        out[1] = MGMT_CLASS_CM;
        out[2] = CM_CLASS_VERSION;
        out[3] = METHOD_SEND;
        out[4..6].copy_from_slice(&self.hdr.status.to_be_bytes());
        out[6..8].copy_from_slice(&self.hdr.class_specific.to_be_bytes());
        out[8..16].copy_from_slice(&self.hdr.tid.to_be_bytes());
        out[16..18].copy_from_slice(&u16::from(self.msg.attr_id()).to_be_bytes());
        out[20..24].copy_from_slice(&self.hdr.attr_mod.to_be_bytes());
        out[MAD_HDR_LEN..].copy_from_slice(&b);
        Ok(out)
    }
}
