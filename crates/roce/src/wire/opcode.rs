//! The BTH opcodes softrdma speaks, as one table of data (IBA vol. 1 §9.2 "OpCode" table
//! and §9.3 "Header layouts per opcode"; Linux rxe keeps the same facts in `rxe_opcode.c`).
//!
//! For every opcode the table says which extension headers follow the BTH (in the IBA
//! order DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH), the packet's position in
//! its message (FIRST/MIDDLE/LAST/ONLY), whether it carries payload, whether it is a request
//! or a response, and what the responder answers it with. [`super::Packet`] parses and
//! builds packets from this table; [`sequence_ok`] and [`super::segment`] run the receive
//! checks from it.
//!
//! Covered: the RC opcodes (C3: SEND 0x00..0x05, RDMA WRITE 0x06..0x0B, RDMA READ request
//! 0x0C and responses 0x0D..0x10, ACK 0x11, ATOMIC ACK 0x12, CMP_SWAP 0x13, FETCH_ADD 0x14,
//! SEND with invalidate 0x16/0x17), UD SEND_ONLY 0x64 and SEND_ONLY with immediate 0x65, and
//! the RoCEv2 congestion notification packet 0x81 (annex A17 §A17.9.3, figure 6: BTH, 16 reserved octets).

use core::fmt;

bitflags::bitflags! {
    /// The extension headers that follow the BTH.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct HeaderSet: u8 {
        /// Datagram ETH (UD).
        const DETH = 1 << 0;
        /// RDMA ETH (RDMA WRITE FIRST/ONLY, RDMA READ REQUEST).
        const RETH = 1 << 1;
        /// Atomic ETH (COMPARE_SWAP, FETCH_ADD).
        const ATOMIC_ETH = 1 << 2;
        /// ACK ETH (ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ RESPONSE FIRST/LAST/ONLY).
        const AETH = 1 << 3;
        /// Atomic ACK ETH (ATOMIC ACKNOWLEDGE).
        const ATOMIC_ACK_ETH = 1 << 4;
        /// Immediate data (the "with immediate" LAST/ONLY opcodes).
        const IMM_DT = 1 << 5;
        /// Invalidate ETH (SEND LAST/ONLY with invalidate).
        const IETH = 1 << 6;
        /// The 16 reserved octets of a RoCEv2 CNP (annex A17 §A17.9.3).
        const CNP_RESERVED = 1 << 7;
    }
}

/// Length of the reserved field after the BTH of a CNP.
pub const CNP_RESERVED_LEN: usize = 16;

impl HeaderSet {
    /// Octets of these headers together (BTH not included).
    pub const fn octets(self) -> usize {
        use super::headers::{AtomicAckEth, AtomicEth, Deth, Ieth, ImmDt, Reth};
        let b = self.bits();
        let mut n = 0;
        if b & Self::DETH.bits() != 0 {
            n += Deth::LEN;
        }
        if b & Self::RETH.bits() != 0 {
            n += Reth::LEN;
        }
        if b & Self::ATOMIC_ETH.bits() != 0 {
            n += AtomicEth::LEN;
        }
        if b & Self::AETH.bits() != 0 {
            n += super::headers::Aeth::LEN;
        }
        if b & Self::ATOMIC_ACK_ETH.bits() != 0 {
            n += AtomicAckEth::LEN;
        }
        if b & Self::IMM_DT.bits() != 0 {
            n += ImmDt::LEN;
        }
        if b & Self::IETH.bits() != 0 {
            n += Ieth::LEN;
        }
        if b & Self::CNP_RESERVED.bits() != 0 {
            n += CNP_RESERVED_LEN;
        }
        n
    }
}

/// A BTH OpCode octet. Known values have constants in rdma-core's naming
/// (`IBV_OPCODE_RC_SEND_FIRST` is [`Opcode::RC_SEND_FIRST`]); [`Opcode::info`] looks one up
/// in the table. Unknown values are kept (for counters and error reports).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RC SEND FIRST, `IBV_OPCODE_RC_SEND_FIRST`.
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND MIDDLE, `IBV_OPCODE_RC_SEND_MIDDLE`.
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND LAST, `IBV_OPCODE_RC_SEND_LAST`.
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND LAST with immediate, `IBV_OPCODE_RC_SEND_LAST_WITH_IMMEDIATE`.
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// RC SEND ONLY, `IBV_OPCODE_RC_SEND_ONLY`.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND ONLY with immediate, `IBV_OPCODE_RC_SEND_ONLY_WITH_IMMEDIATE`.
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE FIRST, `IBV_OPCODE_RC_RDMA_WRITE_FIRST`.
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE MIDDLE, `IBV_OPCODE_RC_RDMA_WRITE_MIDDLE`.
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE LAST, `IBV_OPCODE_RC_RDMA_WRITE_LAST`.
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE LAST with immediate, `IBV_OPCODE_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE`.
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE ONLY, `IBV_OPCODE_RC_RDMA_WRITE_ONLY`.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// RC RDMA WRITE ONLY with immediate, `IBV_OPCODE_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE`.
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    /// RC RDMA READ REQUEST, `IBV_OPCODE_RC_RDMA_READ_REQUEST`.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC RDMA READ RESPONSE FIRST, `IBV_OPCODE_RC_RDMA_READ_RESPONSE_FIRST`.
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// RC RDMA READ RESPONSE MIDDLE, `IBV_OPCODE_RC_RDMA_READ_RESPONSE_MIDDLE`.
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// RC RDMA READ RESPONSE LAST, `IBV_OPCODE_RC_RDMA_READ_RESPONSE_LAST`.
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// RC RDMA READ RESPONSE ONLY, `IBV_OPCODE_RC_RDMA_READ_RESPONSE_ONLY`.
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC ACKNOWLEDGE, `IBV_OPCODE_RC_ACKNOWLEDGE`.
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC ATOMIC ACKNOWLEDGE, `IBV_OPCODE_RC_ATOMIC_ACKNOWLEDGE`.
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC COMPARE_SWAP, `IBV_OPCODE_RC_COMPARE_SWAP`.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FETCH_ADD, `IBV_OPCODE_RC_FETCH_ADD`.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND LAST with invalidate, `IBV_OPCODE_RC_SEND_LAST_WITH_INVALIDATE`.
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// RC SEND ONLY with invalidate, `IBV_OPCODE_RC_SEND_ONLY_WITH_INVALIDATE`.
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// UD SEND ONLY, `IBV_OPCODE_UD_SEND_ONLY`.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND ONLY with immediate, `IBV_OPCODE_UD_SEND_ONLY_WITH_IMMEDIATE`.
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    /// RoCEv2 congestion notification packet (annex A17 §A17.9.3).
    pub const CNP: Opcode = Opcode(0x81);

    /// The table entry, `None` for opcodes softrdma does not implement (UC, RD, XRC,
    /// reserved, manufacturer-specific).
    pub fn info(self) -> Option<&'static OpInfo> {
        match INDEX[usize::from(self.0)] {
            NONE => None,
            i => Some(&TABLE[usize::from(i)]),
        }
    }

    /// The RC opcode for one packet of a message of `kind` at `position` (the FIRST and
    /// MIDDLE packets of the "with immediate" and "with invalidate" forms are the plain
    /// ones; a Read response carries no immediate). Looked up in the table.
    pub fn rc_segment(kind: MessageKind, position: Position) -> Opcode {
        let (op, extra) = match kind {
            MessageKind::Send => (Operation::Send, HeaderSet::empty()),
            MessageKind::SendWithImm => (Operation::Send, HeaderSet::IMM_DT),
            MessageKind::SendWithInv => (Operation::Send, HeaderSet::IETH),
            MessageKind::RdmaWrite => (Operation::RdmaWrite, HeaderSet::empty()),
            MessageKind::RdmaWriteWithImm => (Operation::RdmaWrite, HeaderSet::IMM_DT),
            MessageKind::RdmaReadResponse => (Operation::RdmaReadResponse, HeaderSet::empty()),
        };
        let extra = match position {
            Position::First | Position::Middle => HeaderSet::empty(),
            Position::Last | Position::Only => extra,
        };
        TABLE
            .iter()
            .find(|i| {
                i.transport == Transport::Rc
                    && i.operation == op
                    && i.position == position
                    && i.headers & (HeaderSet::IMM_DT | HeaderSet::IETH) == extra
            })
            .map(|i| i.opcode)
            .expect("the table has every RC segment opcode (unit test `every_rc_segment`)")
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => write!(f, "{}({:#04x})", i.name, self.0),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The transport service (the top three bits of the opcode; CNP is RoCEv2's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connection, 000b.
    Rc,
    /// Unreliable datagram, 011b.
    Ud,
    /// RoCEv2 congestion notification packet, 0x81.
    Cnp,
}

/// What the packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND: a message into the responder's receive queue.
    Send,
    /// RDMA WRITE into a remote region.
    RdmaWrite,
    /// RDMA READ REQUEST for a remote region.
    RdmaReadRequest,
    /// RDMA READ RESPONSE carrying the data read.
    RdmaReadResponse,
    /// ACKNOWLEDGE (an ACK or a NAK in the AETH syndrome).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE carrying the original remote data.
    AtomicAcknowledge,
    /// COMPARE_SWAP on an 8-octet remote operand.
    CompareSwap,
    /// FETCH_ADD on an 8-octet remote operand.
    FetchAdd,
    /// RoCEv2 congestion notification.
    Cnp,
}

/// The packet's place in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// FIRST: the first packet of a multi-packet message.
    First,
    /// MIDDLE: neither first nor last.
    Middle,
    /// LAST: the last packet of a multi-packet message.
    Last,
    /// ONLY: the whole message in one packet.
    Only,
}

impl Position {
    /// The first packet of a message (FIRST or ONLY).
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// The last packet of a message (LAST or ONLY).
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// What a responder answers a request with (IBA vol. 1 §9.7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    /// Nothing: a response, a UD datagram, a CNP.
    None,
    /// ACKNOWLEDGE (may be coalesced: one ACK covers every earlier PSN).
    Ack,
    /// RDMA READ RESPONSE packets (FIRST/MIDDLE/LAST or ONLY).
    ReadResponse,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAck,
}

/// The message kinds that RC segments into several packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// SEND.
    Send,
    /// SEND with immediate (ImmDt on the LAST/ONLY packet).
    SendWithImm,
    /// SEND with invalidate (IETH on the LAST/ONLY packet).
    SendWithInv,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate (ImmDt on the LAST/ONLY packet).
    RdmaWriteWithImm,
    /// RDMA READ RESPONSE, segmented by the responder.
    RdmaReadResponse,
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// The BTH OpCode value.
    pub opcode: Opcode,
    /// rdma-core's name without the `IBV_OPCODE_` prefix.
    pub name: &'static str,
    /// The transport service.
    pub transport: Transport,
    /// The operation.
    pub operation: Operation,
    /// The packet's place in its message.
    pub position: Position,
    /// The extension headers after the BTH.
    pub headers: HeaderSet,
    /// The packet carries payload (possibly 0 octets for ONLY packets).
    pub payload: bool,
    /// Sent by a requester (else by a responder, or a CNP).
    pub request: bool,
    /// What the responder answers with.
    pub reply: Reply,
    /// The message consumes a receive WQE at the responder (SEND*, WRITE with immediate;
    /// rxe's `RXE_RWR_MASK`): without one the responder answers RNR NAK.
    pub consumes_recv: bool,
}

impl OpInfo {
    /// The ImmDt header is present.
    pub const fn immediate(&self) -> bool {
        self.headers.contains(HeaderSet::IMM_DT)
    }
    /// The IETH header is present (SEND with invalidate).
    pub const fn invalidate(&self) -> bool {
        self.headers.contains(HeaderSet::IETH)
    }
    /// Octets from the start of the BTH to the payload.
    pub const fn header_len(&self) -> usize {
        super::headers::Bth::LEN + self.headers.octets()
    }
    /// The requester must eventually get an answer for it (RC requests; the requester sets
    /// AckReq at least on the last packet of a message).
    pub const fn needs_ack(&self) -> bool {
        !matches!(self.reply, Reply::None)
    }
}

const fn row(
    opcode: u8,
    name: &'static str,
    transport: Transport,
    operation: Operation,
    position: Position,
    headers: HeaderSet,
    payload: bool,
) -> OpInfo {
    let request = matches!(
        operation,
        Operation::Send
            | Operation::RdmaWrite
            | Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd
    );
    let reply = match (transport, operation) {
        (Transport::Rc, Operation::Send | Operation::RdmaWrite) => Reply::Ack,
        (Transport::Rc, Operation::RdmaReadRequest) => Reply::ReadResponse,
        (Transport::Rc, Operation::CompareSwap | Operation::FetchAdd) => Reply::AtomicAck,
        _ => Reply::None,
    };
    let consumes_recv = matches!(operation, Operation::Send)
        || (matches!(operation, Operation::RdmaWrite) && headers.contains(HeaderSet::IMM_DT));
    OpInfo {
        opcode: Opcode(opcode),
        name,
        transport,
        operation,
        position,
        headers,
        payload,
        request,
        reply,
        consumes_recv,
    }
}

use HeaderSet as H;
use Operation as O;
use Position as P;
use Transport as T;

const NO: HeaderSet = HeaderSet::empty();

/// The table, in opcode order.
pub const TABLE: [OpInfo; 26] = [
    row(0x00, "RC_SEND_FIRST", T::Rc, O::Send, P::First, NO, true),
    row(0x01, "RC_SEND_MIDDLE", T::Rc, O::Send, P::Middle, NO, true),
    row(0x02, "RC_SEND_LAST", T::Rc, O::Send, P::Last, NO, true),
    row(
        0x03,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        P::Last,
        H::IMM_DT,
        true,
    ),
    row(0x04, "RC_SEND_ONLY", T::Rc, O::Send, P::Only, NO, true),
    row(
        0x05,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        P::Only,
        H::IMM_DT,
        true,
    ),
    row(
        0x06,
        "RC_RDMA_WRITE_FIRST",
        T::Rc,
        O::RdmaWrite,
        P::First,
        H::RETH,
        true,
    ),
    row(0x07, "RC_RDMA_WRITE_MIDDLE", T::Rc, O::RdmaWrite, P::Middle, NO, true),
    row(0x08, "RC_RDMA_WRITE_LAST", T::Rc, O::RdmaWrite, P::Last, NO, true),
    row(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::RdmaWrite,
        P::Last,
        H::IMM_DT,
        true,
    ),
    row(0x0a, "RC_RDMA_WRITE_ONLY", T::Rc, O::RdmaWrite, P::Only, H::RETH, true),
    row(
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::RdmaWrite,
        P::Only,
        H::RETH.union(H::IMM_DT),
        true,
    ),
    row(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        T::Rc,
        O::RdmaReadRequest,
        P::Only,
        H::RETH,
        false,
    ),
    row(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        T::Rc,
        O::RdmaReadResponse,
        P::First,
        H::AETH,
        true,
    ),
    row(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        T::Rc,
        O::RdmaReadResponse,
        P::Middle,
        NO,
        true,
    ),
    row(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        T::Rc,
        O::RdmaReadResponse,
        P::Last,
        H::AETH,
        true,
    ),
    row(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        T::Rc,
        O::RdmaReadResponse,
        P::Only,
        H::AETH,
        true,
    ),
    row(0x11, "RC_ACKNOWLEDGE", T::Rc, O::Acknowledge, P::Only, H::AETH, false),
    row(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        T::Rc,
        O::AtomicAcknowledge,
        P::Only,
        H::AETH.union(H::ATOMIC_ACK_ETH),
        false,
    ),
    row(
        0x13,
        "RC_COMPARE_SWAP",
        T::Rc,
        O::CompareSwap,
        P::Only,
        H::ATOMIC_ETH,
        false,
    ),
    row(0x14, "RC_FETCH_ADD", T::Rc, O::FetchAdd, P::Only, H::ATOMIC_ETH, false),
    row(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Last,
        H::IETH,
        true,
    ),
    row(
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Only,
        H::IETH,
        true,
    ),
    row(0x64, "UD_SEND_ONLY", T::Ud, O::Send, P::Only, H::DETH, true),
    row(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        T::Ud,
        O::Send,
        P::Only,
        H::DETH.union(H::IMM_DT),
        true,
    ),
    row(0x81, "CNP", T::Cnp, O::Cnp, P::Only, H::CNP_RESERVED, false),
];

const NONE: u8 = u8::MAX;

/// Opcode octet -> index in [`TABLE`] (NONE: not in the table), built at compile time.
const INDEX: [u8; 256] = {
    let mut idx = [NONE; 256];
    let mut i = 0;
    while i < TABLE.len() {
        idx[TABLE[i].opcode.0 as usize] = i as u8;
        i += 1;
    }
    idx
};

/// The opcode sequence check of a receiver (IBA vol. 1 §9.7.4.1 for requests at the
/// responder, §9.7.6 for Read responses at the requester; rxe's `check_op_seq`): while a multi-packet message is in
/// progress (`prev` is its FIRST or a MIDDLE) the next in-sequence packet must be a MIDDLE or
/// LAST of the same operation; otherwise (`prev` ended a message, or nothing was received
/// yet: `None`) it must start one (FIRST or ONLY). A violation is an invalid request
/// (NAK code 1) at a responder.
pub fn sequence_ok(prev: Option<&OpInfo>, next: &OpInfo) -> bool {
    match prev {
        Some(p) if !p.position.ends() => next.operation == p.operation && !next.position.starts(),
        _ => next.position.starts(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_indexed() {
        assert!(TABLE.windows(2).all(|w| w[0].opcode < w[1].opcode));
        for i in &TABLE {
            assert_eq!(i.opcode.info(), Some(i));
            assert!(i.name.starts_with(match i.transport {
                Transport::Rc => "RC_",
                Transport::Ud => "UD_",
                Transport::Cnp => "CNP",
            }));
        }
        let known = (0..=255u8).filter(|&o| Opcode(o).info().is_some()).count();
        assert_eq!(known, TABLE.len());
        assert!(Opcode(0x15).info().is_none()); // reserved
        assert!(Opcode(0x20).info().is_none()); // UC: not implemented
        assert_eq!(format!("{:?}", Opcode(0x11)), "RC_ACKNOWLEDGE(0x11)");
        assert_eq!(format!("{:?}", Opcode(0x15)), "Opcode(0x15)");
    }

    #[test]
    fn rc_opcode_values_c3() {
        // C3: SEND first 0x00, middle 0x01, last 0x02, only 0x04 (imm: last 0x03, only 0x05);
        // WRITE first 0x06, middle 0x07, last 0x08, only 0x0A (imm: last 0x09, only 0x0B);
        // READ request 0x0C; ACK 0x11; UD SEND only 0x64.
        let info = |o: Opcode| *o.info().unwrap();
        let s = info(Opcode(0x00));
        assert_eq!(
            (s.operation, s.position, s.headers),
            (Operation::Send, Position::First, NO)
        );
        assert_eq!(info(Opcode(0x03)).headers, H::IMM_DT);
        assert_eq!(info(Opcode(0x05)).position, Position::Only);
        assert_eq!(info(Opcode(0x06)).headers, H::RETH);
        assert_eq!(info(Opcode(0x07)).headers, NO);
        assert_eq!(info(Opcode(0x0b)).headers, H::RETH | H::IMM_DT);
        assert_eq!(info(Opcode(0x0b)).header_len(), 12 + 16 + 4);
        let rr = info(Opcode(0x0c));
        assert!(!rr.payload && rr.request && rr.reply == Reply::ReadResponse);
        assert_eq!(info(Opcode(0x0e)).headers, NO); // READ RESPONSE MIDDLE: no AETH
        let ack = info(Opcode(0x11));
        assert!(!ack.request && !ack.payload && ack.headers == H::AETH);
        assert_eq!(info(Opcode(0x12)).header_len(), 12 + 4 + 8);
        assert_eq!(info(Opcode(0x13)).header_len(), 12 + 28);
        assert_eq!(info(Opcode(0x13)).reply, Reply::AtomicAck);
        assert!(info(Opcode(0x17)).invalidate());
        let ud = info(Opcode(0x64));
        assert_eq!(
            (ud.transport, ud.headers, ud.reply),
            (Transport::Ud, H::DETH, Reply::None)
        );
        assert_eq!(info(Opcode(0x65)).header_len(), 12 + 8 + 4);
        assert_eq!(info(Opcode::CNP).header_len(), 12 + 16);
    }

    #[test]
    fn receive_wqe_consumers() {
        let consumers: Vec<u8> = TABLE.iter().filter(|i| i.consumes_recv).map(|i| i.opcode.0).collect();
        assert_eq!(
            consumers,
            [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x09, 0x0b, 0x16, 0x17, 0x64, 0x65]
        );
    }

    #[test]
    fn every_rc_segment() {
        use MessageKind as K;
        use Position::*;
        let cases = [
            (K::Send, [0x00, 0x01, 0x02, 0x04]),
            (K::SendWithImm, [0x00, 0x01, 0x03, 0x05]),
            (K::SendWithInv, [0x00, 0x01, 0x16, 0x17]),
            (K::RdmaWrite, [0x06, 0x07, 0x08, 0x0a]),
            (K::RdmaWriteWithImm, [0x06, 0x07, 0x09, 0x0b]),
            (K::RdmaReadResponse, [0x0d, 0x0e, 0x0f, 0x10]),
        ];
        for (kind, ops) in cases {
            for (pos, op) in [First, Middle, Last, Only].into_iter().zip(ops) {
                assert_eq!(Opcode::rc_segment(kind, pos), Opcode(op), "{kind:?} {pos:?}");
            }
        }
    }

    #[test]
    fn opcode_sequences() {
        let i = |o: Opcode| o.info().unwrap();
        use Opcode as Op;
        // a message may start after nothing or after a completed message
        assert!(sequence_ok(None, i(Op::RC_SEND_FIRST)));
        assert!(sequence_ok(None, i(Op::RC_RDMA_WRITE_ONLY)));
        assert!(!sequence_ok(None, i(Op::RC_SEND_MIDDLE)));
        assert!(!sequence_ok(None, i(Op::RC_RDMA_WRITE_LAST)));
        assert!(sequence_ok(Some(i(Op::RC_SEND_LAST)), i(Op::RC_RDMA_READ_REQUEST)));
        // within a Send only its MIDDLE/LAST forms
        let first = Some(i(Op::RC_SEND_FIRST));
        assert!(sequence_ok(first, i(Op::RC_SEND_MIDDLE)));
        assert!(sequence_ok(first, i(Op::RC_SEND_LAST_WITH_INVALIDATE)));
        assert!(!sequence_ok(first, i(Op::RC_SEND_ONLY)));
        assert!(!sequence_ok(first, i(Op::RC_RDMA_WRITE_MIDDLE)));
        assert!(!sequence_ok(first, i(Op::RC_RDMA_READ_REQUEST)));
        let mid = Some(i(Op::RC_RDMA_WRITE_MIDDLE));
        assert!(sequence_ok(mid, i(Op::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE)));
        assert!(!sequence_ok(mid, i(Op::RC_SEND_LAST)));
        // Read responses at the requester
        let rf = Some(i(Op::RC_RDMA_READ_RESPONSE_FIRST));
        assert!(sequence_ok(rf, i(Op::RC_RDMA_READ_RESPONSE_LAST)));
        assert!(!sequence_ok(rf, i(Op::RC_RDMA_READ_RESPONSE_ONLY)));
    }
}
