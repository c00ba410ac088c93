//! Queue pair types, attributes and the state-transition rules of `ibv_modify_qp`.
//!
//! A QP is created in RESET and moved through INIT, RTR (ready to receive) and
//! RTS (ready to send) by `modify_qp` calls, each naming the attributes the
//! InfiniBand Architecture (vol. 1, §10.3 and §11.2.5, "Modify Queue Pair")
//! requires or allows for that transition and QP type. [`check_modify`] is that
//! table: the same rules as Linux's `ib_modify_qp_is_ok` (the kernel's
//! `qp_state_table` in drivers/infiniband/core/verbs.c), so a program that
//! works against a kernel provider makes the same calls here, and a call the
//! kernel would refuse is refused with an error naming the missing or
//! unexpected attributes.
//!
//! The attributes are typed: [`QpAttr`] holds an `Option` per attribute, and
//! the attribute mask (`IBV_QP_*`) is derived from which are set, so a mask can
//! never disagree with the values. Values are range-checked (PSNs and QP numbers
//! are 24 bits, retry counts 3 bits, timers 5 bits).
//!
//! A provider may refuse a legal transition its transport cannot do: iWARP QPs
//! are moved to RTR/RTS by their connection manager (MPA), as with the kernel's
//! iw_cm, so the iWARP provider refuses a manual RTR/RTS with
//! [`Error::NotSupported`](crate::Error::NotSupported).

pub use crate::ah::{AhAttr, Gid};
use crate::types::{Access, QpState};
use bitflags::bitflags;

/// Transport service of a queue pair (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected (`IBV_QPT_RC`).
    Rc,
    /// Unreliable connected (`IBV_QPT_UC`).
    Uc,
    /// Unreliable datagram (`IBV_QPT_UD`).
    Ud,
    /// The general services interface, QP1 (`IB_QPT_GSI`): carries the
    /// management datagrams of the IB connection manager.
    Gsi,
}

impl QpType {
    /// Every type, for exhaustive tests and listings.
    pub const ALL: [QpType; 4] = [QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi];

    /// Whether the type is connected (one remote QP) rather than datagram.
    pub fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc)
    }
}

impl QpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];
}

bitflags! {
    /// Which attributes a `modify_qp` call sets (`ibv_qp_attr_mask`, same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`: `qp_state`.
        const STATE = 1;
        /// `IBV_QP_CUR_STATE`: `cur_qp_state`.
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`: `en_sqd_async_notify`.
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`: `qp_access_flags`.
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`: `pkey_index`.
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`: `port_num`.
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`: `qkey`.
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`: `ah_attr` (the primary path).
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`: `path_mtu`.
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`: `timeout`.
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`: `retry_cnt`.
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`: `rnr_retry`.
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`: `rq_psn`.
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`: `max_rd_atomic`.
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`: the alternate path.
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`: `min_rnr_timer`.
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`: `sq_psn`.
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`: `max_dest_rd_atomic`.
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`: the path migration state.
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`: queue capacities.
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`: `dest_qp_num`.
        const DEST_QPN = 1 << 20;
    }
}

/// Path MTU (`ibv_mtu`): the largest payload of one packet on the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 octets.
    Mtu256 = 1,
    /// 512 octets.
    Mtu512 = 2,
    /// 1024 octets.
    Mtu1024 = 3,
    /// 2048 octets.
    Mtu2048 = 4,
    /// 4096 octets.
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in octets.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// The largest IB MTU not above `bytes` (None below 256).
    pub fn at_most(bytes: u32) -> Option<Mtu> {
        [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512, Mtu::Mtu256]
            .into_iter()
            .find(|m| m.bytes() <= bytes)
    }
}

/// Attributes of a `modify_qp` call (`ibv_qp_attr`); the mask is derived from
/// which fields are set. `qp_state` is the state to move to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// The state to move to.
    pub qp_state: Option<QpState>,
    /// The state the caller believes the QP is in (checked).
    pub cur_qp_state: Option<QpState>,
    /// Raise `IBV_EVENT_SQ_DRAINED` when a move to SQD completes.
    pub en_sqd_async_notify: Option<bool>,
    /// Remote rights the QP grants (`IBV_ACCESS_REMOTE_*`).
    pub qp_access_flags: Option<Access>,
    /// Index into the port's P_Key table.
    pub pkey_index: Option<u16>,
    /// The port (from 1).
    pub port_num: Option<u8>,
    /// Q_Key of a UD QP.
    pub qkey: Option<u32>,
    /// Primary path (address vector).
    pub ah_attr: Option<AhAttr>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0: infinite).
    pub timeout: Option<u8>,
    /// Transport retries (0..=7).
    pub retry_cnt: Option<u8>,
    /// Receiver-not-ready retries (0..=7; 7 means infinite).
    pub rnr_retry: Option<u8>,
    /// First PSN expected from the peer (24 bits).
    pub rq_psn: Option<u32>,
    /// Outstanding RDMA Reads/atomics we may issue (initiator depth, ORD).
    pub max_rd_atomic: Option<u8>,
    /// Minimum RNR NAK timer code (0..=31).
    pub min_rnr_timer: Option<u8>,
    /// First PSN we send (24 bits).
    pub sq_psn: Option<u32>,
    /// Inbound RDMA Reads/atomics we accept at once (responder resources, IRD).
    pub max_dest_rd_atomic: Option<u8>,
    /// The remote QP number (24 bits).
    pub dest_qp_num: Option<u32>,
}

/// The attributes of an RC/UC move to RTR: where the peer is and how to receive from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// Where the peer is (its address vector).
    pub ah_attr: AhAttr,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// The remote QP number.
    pub dest_qp_num: u32,
    /// First PSN expected from the peer.
    pub rq_psn: u32,
    /// Inbound RDMA Reads/atomics accepted at once (IRD).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code.
    pub min_rnr_timer: u8,
}

/// The attributes of an RC move to RTS: how to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// First PSN we send.
    pub sq_psn: u32,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0: infinite).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7: infinite).
    pub rnr_retry: u8,
    /// Outstanding RDMA Reads/atomics we may issue (ORD).
    pub max_rd_atomic: u8,
}

impl QpAttr {
    /// RESET -> INIT of a connected QP: port, P_Key index and remote access rights.
    pub fn init(port_num: u8, pkey_index: u16, access: Access) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Init),
            port_num: Some(port_num),
            pkey_index: Some(pkey_index),
            qp_access_flags: Some(access),
            ..QpAttr::default()
        }
    }
    /// RESET -> INIT of a UD or GSI QP: port, P_Key index and Q_Key (GSI: no port).
    pub fn init_ud(port_num: u8, pkey_index: u16, qkey: u32) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Init),
            port_num: Some(port_num),
            pkey_index: Some(pkey_index),
            qkey: Some(qkey),
            ..QpAttr::default()
        }
    }
    /// INIT -> RTR of an RC QP.
    pub fn rtr(a: RtrAttr) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Rtr),
            ah_attr: Some(a.ah_attr),
            path_mtu: Some(a.path_mtu),
            dest_qp_num: Some(a.dest_qp_num),
            rq_psn: Some(a.rq_psn),
            max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
            min_rnr_timer: Some(a.min_rnr_timer),
            ..QpAttr::default()
        }
    }
    /// RTR -> RTS of an RC QP.
    pub fn rts(a: RtsAttr) -> QpAttr {
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: Some(a.sq_psn),
            timeout: Some(a.timeout),
            retry_cnt: Some(a.retry_cnt),
            rnr_retry: Some(a.rnr_retry),
            max_rd_atomic: Some(a.max_rd_atomic),
            ..QpAttr::default()
        }
    }
    /// A move to `state` with no other attribute (RESET, ERR, SQD, RTR/RTS of UD).
    pub fn state(state: QpState) -> QpAttr {
        QpAttr {
            qp_state: Some(state),
            ..QpAttr::default()
        }
    }

    /// The `ibv_qp_attr_mask` these attributes stand for.
    pub fn mask(&self) -> QpAttrMask {
        let mut m = QpAttrMask::empty();
        let mut set = |on: bool, bit: QpAttrMask| {
            if on {
                m |= bit;
            }
        };
        set(self.qp_state.is_some(), QpAttrMask::STATE);
        set(self.cur_qp_state.is_some(), QpAttrMask::CUR_STATE);
        set(self.en_sqd_async_notify.is_some(), QpAttrMask::EN_SQD_ASYNC_NOTIFY);
        set(self.qp_access_flags.is_some(), QpAttrMask::ACCESS_FLAGS);
        set(self.pkey_index.is_some(), QpAttrMask::PKEY_INDEX);
        set(self.port_num.is_some(), QpAttrMask::PORT);
        set(self.qkey.is_some(), QpAttrMask::QKEY);
        set(self.ah_attr.is_some(), QpAttrMask::AV);
        set(self.path_mtu.is_some(), QpAttrMask::PATH_MTU);
        set(self.timeout.is_some(), QpAttrMask::TIMEOUT);
        set(self.retry_cnt.is_some(), QpAttrMask::RETRY_CNT);
        set(self.rnr_retry.is_some(), QpAttrMask::RNR_RETRY);
        set(self.rq_psn.is_some(), QpAttrMask::RQ_PSN);
        set(self.max_rd_atomic.is_some(), QpAttrMask::MAX_QP_RD_ATOMIC);
        set(self.min_rnr_timer.is_some(), QpAttrMask::MIN_RNR_TIMER);
        set(self.sq_psn.is_some(), QpAttrMask::SQ_PSN);
        set(self.max_dest_rd_atomic.is_some(), QpAttrMask::MAX_DEST_RD_ATOMIC);
        set(self.dest_qp_num.is_some(), QpAttrMask::DEST_QPN);
        m
    }

    /// Range checks of the values that are set.
    fn check_values(&self) -> Result<(), ModifyQpError> {
        const PSN_MAX: u32 = (1 << 24) - 1;
        let bad = |what: &'static str, max: u32| ModifyQpError::ValueOutOfRange { attribute: what, max };
        let within = |v: Option<u32>, max: u32, what: &'static str| match v {
            Some(x) if x > max => Err(bad(what, max)),
            _ => Ok(()),
        };
        within(self.rq_psn, PSN_MAX, "rq_psn")?;
        within(self.sq_psn, PSN_MAX, "sq_psn")?;
        within(self.dest_qp_num, PSN_MAX, "dest_qp_num")?;
        within(self.retry_cnt.map(u32::from), 7, "retry_cnt")?;
        within(self.rnr_retry.map(u32::from), 7, "rnr_retry")?;
        within(self.timeout.map(u32::from), 31, "timeout")?;
        within(self.min_rnr_timer.map(u32::from), 31, "min_rnr_timer")?;
        within(self.ah_attr.map(|a| a.flow_label), (1 << 20) - 1, "flow_label")?;
        within(self.ah_attr.map(|a| u32::from(a.sl)), 15, "sl")?;
        Ok(())
    }
}

/// Why a `modify_qp` call was refused by the transition rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModifyQpError {
    /// No `qp_state` was given.
    #[error("modify_qp needs the target state (qp_state)")]
    NoTargetState,
    /// The IBTA allows no such transition for this QP type.
    #[error("{qp_type:?} QP cannot move from {from:?} to {to:?}")]
    IllegalTransition {
        /// The QP type.
        qp_type: QpType,
        /// The state the QP is in.
        from: QpState,
        /// The state asked for.
        to: QpState,
    },
    /// Required attributes are missing.
    #[error("{qp_type:?} QP {from:?} -> {to:?} needs {missing:?}")]
    MissingAttributes {
        /// The QP type.
        qp_type: QpType,
        /// The state the QP is in.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// The required attributes that were not given.
        missing: QpAttrMask,
    },
    /// Attributes that this transition does not take.
    #[error("{qp_type:?} QP {from:?} -> {to:?} does not take {unexpected:?}")]
    UnexpectedAttributes {
        /// The QP type.
        qp_type: QpType,
        /// The state the QP is in.
        from: QpState,
        /// The state asked for.
        to: QpState,
        /// The attributes given that this transition does not take.
        unexpected: QpAttrMask,
    },
    /// `cur_qp_state` disagrees with the QP's state, or was given where it may not be.
    #[error("cur_qp_state {claimed:?} but the QP is in {actual:?}")]
    CurStateMismatch {
        /// The `cur_qp_state` given.
        claimed: QpState,
        /// The QP's real state.
        actual: QpState,
    },
    /// A value does not fit its field.
    #[error("{attribute} out of range (max {max})")]
    ValueOutOfRange {
        /// The attribute whose value is too large.
        attribute: &'static str,
        /// The limit.
        max: u32,
    },
}

/// Required and optional attributes of one legal transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes the transition must have.
    pub required: QpAttrMask,
    /// Attributes it may have.
    pub optional: QpAttrMask,
}

/// The IBTA transition table (as Linux's `qp_state_table`): `None` when
/// `from -> to` is illegal for `qp_type`.
pub fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    use QpAttrMask as M;
    use QpState::*;
    use QpType::*;
    let rule = |required: M, optional: M| Some(TransitionRule { required, optional });
    let none = M::empty();
    match (from, to) {
        // Any state may go to RESET; any but RESET to ERR.
        (_, Reset) => rule(none, none),
        (Reset, Err) => None,
        (_, Err) => rule(none, none),
        (Reset, Init) => match qp_type {
            Rc | Uc => rule(M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
            Ud => rule(M::PKEY_INDEX | M::PORT | M::QKEY, none),
            Gsi => rule(M::PKEY_INDEX | M::QKEY, none),
        },
        (Init, Init) => match qp_type {
            Rc | Uc => rule(none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
            Ud => rule(none, M::PKEY_INDEX | M::PORT | M::QKEY),
            Gsi => rule(none, M::PKEY_INDEX | M::QKEY),
        },
        (Init, Rtr) => match qp_type {
            Rc => rule(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Uc => rule(
                M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
            ),
            Ud | Gsi => rule(none, M::PKEY_INDEX | M::QKEY),
        },
        (Rtr, Rts) => match qp_type {
            Rc => rule(
                M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
            ),
            Uc => rule(
                M::SQ_PSN,
                M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE,
            ),
            Ud | Gsi => rule(M::SQ_PSN, M::CUR_STATE | M::QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => match qp_type {
            Rc => rule(
                none,
                M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
            ),
            Uc => rule(none, M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE),
            Ud | Gsi => rule(none, M::CUR_STATE | M::QKEY),
        },
        (Rts, Sqd) => rule(none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => match qp_type {
            Rc => rule(
                none,
                M::PORT
                    | M::AV
                    | M::TIMEOUT
                    | M::RETRY_CNT
                    | M::RNR_RETRY
                    | M::MAX_QP_RD_ATOMIC
                    | M::MAX_DEST_RD_ATOMIC
                    | M::ALT_PATH
                    | M::ACCESS_FLAGS
                    | M::PKEY_INDEX
                    | M::MIN_RNR_TIMER
                    | M::PATH_MIG_STATE,
            ),
            Uc => rule(
                none,
                M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE,
            ),
            Ud | Gsi => rule(none, M::PKEY_INDEX | M::QKEY),
        },
        // Send queue error: only the unreliable types recover from it.
        (Sqe, Rts) => match qp_type {
            Rc => None,
            Uc => rule(none, M::CUR_STATE | M::ACCESS_FLAGS),
            Ud | Gsi => rule(none, M::CUR_STATE | M::QKEY),
        },
        _ => None,
    }
}

/// Checks a `modify_qp` call against the transition table and the value
/// ranges: `Ok` when a QP of `qp_type` in state `cur` may take `attr`.
pub fn check_modify(qp_type: QpType, cur: QpState, attr: &QpAttr) -> Result<(), ModifyQpError> {
    let to = attr.qp_state.ok_or(ModifyQpError::NoTargetState)?;
    if let Some(claimed) = attr.cur_qp_state {
        // As the kernel: CUR_STATE only from RTR, RTS, SQD or SQE, and it must be right.
        if claimed != cur || !matches!(cur, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            return Err(ModifyQpError::CurStateMismatch { claimed, actual: cur });
        }
    }
    let rule = transition_rule(qp_type, cur, to).ok_or(ModifyQpError::IllegalTransition { qp_type, from: cur, to })?;
    let mask = attr.mask();
    let missing = rule.required - mask;
    if !missing.is_empty() {
        return Err(ModifyQpError::MissingAttributes {
            qp_type,
            from: cur,
            to,
            missing,
        });
    }
    let unexpected = mask - (rule.required | rule.optional | QpAttrMask::STATE);
    if !unexpected.is_empty() {
        return Err(ModifyQpError::UnexpectedAttributes {
            qp_type,
            from: cur,
            to,
            unexpected,
        });
    }
    attr.check_values()
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    use std::net::{IpAddr, Ipv4Addr};
    const ERR: QpState = QpState::Err;

    /// The legal (from, to) pairs per type, written out independently of the
    /// match in `transition_rule`, so the two must agree.
    fn legal(t: QpType, from: QpState, to: QpState) -> bool {
        let any_to_reset = to == Reset;
        let any_to_err = to == ERR && from != Reset;
        let forward = matches!(
            (from, to),
            (Reset, Init) | (Init, Init) | (Init, Rtr) | (Rtr, Rts) | (Rts, Rts) | (Rts, Sqd) | (Sqd, Rts) | (Sqd, Sqd)
        );
        let sqe = from == Sqe && to == Rts && t != QpType::Rc;
        any_to_reset || any_to_err || forward || sqe
    }

    /// The attributes that give a QP of `t` the required set of `from -> to`, built
    /// through the typed constructors (so they are what a caller would write).
    fn minimal(t: QpType, from: QpState, to: QpState) -> QpAttr {
        let ah = AhAttr::to_gid(Gid::from_ipv4(Ipv4Addr::new(192, 0, 2, 1)));
        match (from, to, t) {
            (Reset, Init, QpType::Rc | QpType::Uc) => QpAttr::init(1, 0, Access::REMOTE_WRITE),
            (Reset, Init, QpType::Ud) => QpAttr::init_ud(1, 0, 0x1111_1111),
            (Reset, Init, QpType::Gsi) => QpAttr {
                port_num: None,
                ..QpAttr::init_ud(1, 0, 0x8001_0000)
            },
            (Init, Rtr, QpType::Rc) => QpAttr::rtr(RtrAttr {
                ah_attr: ah,
                path_mtu: Mtu::Mtu1024,
                dest_qp_num: 0x12,
                rq_psn: 0xabcdef,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
            }),
            (Init, Rtr, QpType::Uc) => QpAttr {
                max_dest_rd_atomic: None,
                min_rnr_timer: None,
                ..minimal(QpType::Rc, Init, Rtr)
            },
            (Rtr, Rts, QpType::Rc) => QpAttr::rts(RtsAttr {
                sq_psn: 7,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 16,
            }),
            (Rtr, Rts, _) => QpAttr {
                sq_psn: Some(0),
                ..QpAttr::state(Rts)
            },
            _ => QpAttr::state(to),
        }
    }

    #[test]
    fn every_pair_of_every_type_follows_the_table() {
        let mut legal_pairs = 0;
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let attr = minimal(t, from, to);
                    let got = check_modify(t, from, &attr);
                    if legal(t, from, to) {
                        legal_pairs += 1;
                        assert_eq!(got, Ok(()), "{t:?} {from:?}->{to:?}");
                        let rule = transition_rule(t, from, to).unwrap();
                        // Dropping any one required attribute is refused, naming it.
                        for bit in rule.required.iter() {
                            let mut partial = attr.clone();
                            clear(&mut partial, bit);
                            assert_eq!(
                                check_modify(t, from, &partial),
                                Err(ModifyQpError::MissingAttributes {
                                    qp_type: t,
                                    from,
                                    to,
                                    missing: bit
                                }),
                                "{t:?} {from:?}->{to:?} without {bit:?}"
                            );
                        }
                    } else {
                        assert_eq!(
                            got,
                            Err(ModifyQpError::IllegalTransition { qp_type: t, from, to }),
                            "{t:?} {from:?}->{to:?}"
                        );
                        assert!(transition_rule(t, from, to).is_none());
                    }
                }
            }
        }
        // 4 types x (7 to RESET + 6 to ERR + 8 forward) + 3 types with SQE -> RTS.
        assert_eq!(legal_pairs, 4 * (7 + 6 + 8) + 3);
    }

    /// Sets the field of `bit` to a valid value (ALT_PATH, PATH_MIG_STATE and
    /// CAP have no field: alternate paths and resizing are not offered).
    fn set(a: &mut QpAttr, bit: QpAttrMask, from: QpState) {
        let ah = AhAttr::to_gid(Gid::from_ipv4(Ipv4Addr::new(192, 0, 2, 2)));
        match bit {
            QpAttrMask::CUR_STATE => a.cur_qp_state = Some(from),
            QpAttrMask::EN_SQD_ASYNC_NOTIFY => a.en_sqd_async_notify = Some(true),
            QpAttrMask::ACCESS_FLAGS => a.qp_access_flags = Some(Access::REMOTE_READ),
            QpAttrMask::PKEY_INDEX => a.pkey_index = Some(0),
            QpAttrMask::PORT => a.port_num = Some(1),
            QpAttrMask::QKEY => a.qkey = Some(0x1111_1111),
            QpAttrMask::AV => a.ah_attr = Some(ah),
            QpAttrMask::PATH_MTU => a.path_mtu = Some(Mtu::Mtu4096),
            QpAttrMask::TIMEOUT => a.timeout = Some(14),
            QpAttrMask::RETRY_CNT => a.retry_cnt = Some(7),
            QpAttrMask::RNR_RETRY => a.rnr_retry = Some(7),
            QpAttrMask::RQ_PSN => a.rq_psn = Some(1),
            QpAttrMask::MAX_QP_RD_ATOMIC => a.max_rd_atomic = Some(4),
            QpAttrMask::MIN_RNR_TIMER => a.min_rnr_timer = Some(12),
            QpAttrMask::SQ_PSN => a.sq_psn = Some(1),
            QpAttrMask::MAX_DEST_RD_ATOMIC => a.max_dest_rd_atomic = Some(4),
            QpAttrMask::DEST_QPN => a.dest_qp_num = Some(0x12),
            other => panic!("no field for {other:?}"),
        }
    }

    /// The attributes a caller can set (every `ibv_qp_attr_mask` bit with a field).
    const SETTABLE: QpAttrMask = QpAttrMask::all()
        .difference(QpAttrMask::STATE)
        .difference(QpAttrMask::ALT_PATH)
        .difference(QpAttrMask::PATH_MIG_STATE)
        .difference(QpAttrMask::CAP);

    /// The masks, attribute by attribute: for every legal pair of every type,
    /// each settable attribute added to the required ones is taken when the
    /// table lists it as required or optional (rdma-core's / the kernel's
    /// `ib_modify_qp_is_ok`) and refused, named, otherwise. CUR_STATE outside
    /// RTR/RTS/SQD/SQE is refused as the kernel does, before the mask.
    #[test]
    fn every_attribute_of_every_legal_pair_is_taken_or_named() {
        let mut checked = 0;
        for t in QpType::ALL {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    let Some(rule) = transition_rule(t, from, to) else {
                        continue;
                    };
                    let base = minimal(t, from, to);
                    for bit in SETTABLE.iter() {
                        if rule.required.contains(bit) {
                            continue;
                        }
                        let mut a = base.clone();
                        set(&mut a, bit, from);
                        let got = check_modify(t, from, &a);
                        checked += 1;
                        let cur_refused = bit == QpAttrMask::CUR_STATE && !matches!(from, Rtr | Rts | Sqd | Sqe);
                        if cur_refused {
                            assert_eq!(
                                got,
                                Err(ModifyQpError::CurStateMismatch {
                                    claimed: from,
                                    actual: from
                                }),
                                "{t:?} {from:?}->{to:?} + CUR_STATE"
                            );
                        } else if rule.optional.contains(bit) {
                            assert_eq!(got, Ok(()), "{t:?} {from:?}->{to:?} + {bit:?}");
                        } else {
                            assert_eq!(
                                got,
                                Err(ModifyQpError::UnexpectedAttributes {
                                    qp_type: t,
                                    from,
                                    to,
                                    unexpected: bit
                                }),
                                "{t:?} {from:?}->{to:?} + {bit:?}"
                            );
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    /// Spot checks of the table against rdma-core's documentation of
    /// `ibv_modify_qp` (the man page's table of required and optional
    /// attributes), written out independently of `transition_rule`.
    #[test]
    fn rc_and_ud_rules_match_ibv_modify_qp() {
        use QpAttrMask as M;
        let rc = |from, to| transition_rule(QpType::Rc, from, to).unwrap();
        let ud = |from, to| transition_rule(QpType::Ud, from, to).unwrap();
        assert_eq!(rc(Reset, Init).required, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
        assert_eq!(
            rc(Init, Rtr).required,
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER
        );
        assert_eq!(
            rc(Rtr, Rts).required,
            M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
        );
        assert_eq!(ud(Reset, Init).required, M::PKEY_INDEX | M::PORT | M::QKEY);
        assert_eq!(ud(Init, Rtr).required, M::empty());
        assert_eq!(ud(Rtr, Rts).required, M::SQ_PSN);
        assert_eq!(rc(Rts, Sqd).optional, M::EN_SQD_ASYNC_NOTIFY);
        assert_eq!(
            rc(Rts, ERR),
            TransitionRule {
                required: M::empty(),
                optional: M::empty()
            }
        );
        assert!(transition_rule(QpType::Rc, Sqe, Rts).is_none());
        assert!(transition_rule(QpType::Ud, Reset, ERR).is_none());
    }

    fn clear(a: &mut QpAttr, bit: QpAttrMask) {
        match bit {
            QpAttrMask::ACCESS_FLAGS => a.qp_access_flags = None,
            QpAttrMask::PKEY_INDEX => a.pkey_index = None,
            QpAttrMask::PORT => a.port_num = None,
            QpAttrMask::QKEY => a.qkey = None,
            QpAttrMask::AV => a.ah_attr = None,
            QpAttrMask::PATH_MTU => a.path_mtu = None,
            QpAttrMask::TIMEOUT => a.timeout = None,
            QpAttrMask::RETRY_CNT => a.retry_cnt = None,
            QpAttrMask::RNR_RETRY => a.rnr_retry = None,
            QpAttrMask::RQ_PSN => a.rq_psn = None,
            QpAttrMask::MAX_QP_RD_ATOMIC => a.max_rd_atomic = None,
            QpAttrMask::MIN_RNR_TIMER => a.min_rnr_timer = None,
            QpAttrMask::SQ_PSN => a.sq_psn = None,
            QpAttrMask::MAX_DEST_RD_ATOMIC => a.max_dest_rd_atomic = None,
            QpAttrMask::DEST_QPN => a.dest_qp_num = None,
            other => panic!("no field for {other:?}"),
        }
    }

    #[test]
    fn unexpected_attributes_are_named() {
        // A Q_Key on an RC QP's INIT, and RTR attributes on the way to INIT.
        let mut a = QpAttr::init(1, 0, Access::REMOTE_READ);
        a.qkey = Some(1);
        a.rq_psn = Some(1);
        assert_eq!(
            check_modify(QpType::Rc, Reset, &a),
            Err(ModifyQpError::UnexpectedAttributes {
                qp_type: QpType::Rc,
                from: Reset,
                to: Init,
                unexpected: QpAttrMask::QKEY | QpAttrMask::RQ_PSN
            })
        );
        // ERR takes no attributes.
        let mut e = QpAttr::state(ERR);
        e.sq_psn = Some(1);
        assert!(matches!(
            check_modify(QpType::Ud, Rts, &e),
            Err(ModifyQpError::UnexpectedAttributes { .. })
        ));
    }

    #[test]
    fn values_are_range_checked() {
        let mut a = minimal(QpType::Rc, Init, Rtr);
        a.rq_psn = Some(1 << 24);
        assert_eq!(
            check_modify(QpType::Rc, Init, &a),
            Err(ModifyQpError::ValueOutOfRange {
                attribute: "rq_psn",
                max: (1 << 24) - 1
            })
        );
        let mut r = minimal(QpType::Rc, Rtr, Rts);
        r.rnr_retry = Some(8);
        assert!(matches!(
            check_modify(QpType::Rc, Rtr, &r),
            Err(ModifyQpError::ValueOutOfRange {
                attribute: "rnr_retry",
                ..
            })
        ));
        r.rnr_retry = Some(7); // 7: retry forever.
        assert_eq!(check_modify(QpType::Rc, Rtr, &r), Ok(()));
    }

    #[test]
    fn cur_state_is_checked() {
        let mut a = QpAttr::state(Rts);
        a.cur_qp_state = Some(Rts);
        assert_eq!(check_modify(QpType::Rc, Rts, &a), Ok(()));
        a.cur_qp_state = Some(Sqd);
        assert_eq!(
            check_modify(QpType::Rc, Rts, &a),
            Err(ModifyQpError::CurStateMismatch {
                claimed: Sqd,
                actual: Rts
            })
        );
        assert_eq!(
            check_modify(QpType::Rc, Rts, &QpAttr::default()),
            Err(ModifyQpError::NoTargetState)
        );
    }

    #[test]
    fn mask_bits_are_rdma_cores() {
        // Values of enum ibv_qp_attr_mask in <infiniband/verbs.h>.
        assert_eq!(QpAttrMask::STATE.bits(), 1);
        assert_eq!(QpAttrMask::AV.bits(), 128);
        assert_eq!(QpAttrMask::SQ_PSN.bits(), 65536);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(
            minimal(QpType::Rc, Rtr, Rts).mask().bits(),
            1 | 512 | 1024 | 2048 | 8192 | 65536
        );
    }

    #[test]
    fn gid_and_mtu() {
        let g = Gid::from_ipv4(Ipv4Addr::new(192, 168, 77, 2));
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:c0a8:4d02");
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(192, 168, 77, 2)));
        assert!(!g.is_multicast());
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::at_most(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::at_most(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::at_most(255), None);
    }
}
