//! The iWARP QP as the verbs see it ([`verbs::provider::QpOps`]): made in
//! RESET by `create_qp`, moved to INIT by `modify_qp`, given receives in
//! INIT, then bound to an MPA-negotiated TCP stream by the provider's
//! connection manager ([`crate::engine::cm`]), which starts the data path
//! ([`IwarpQp`]) with the receives posted so far and moves the QP to RTS.
//!
//! iWARP QPs reach RTR and RTS only through the connection manager, as with
//! the kernel's iw_cm: a manual `modify_qp` to RTR, RTS, SQD or SQE is
//! refused with `NotSupported`. RESET, INIT and ERR work before a
//! connection; once connected only ERR is left to the application.
//!
//! The send and receive paths of a connected QP cost one atomic load here
//! (the [`OnceLock`] holding the data path) on top of the data path's own.

use super::{IwarpQp, wc};
use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock};
use verbs::mem::MemTable;
use verbs::notify::EventQueue;
use verbs::provider::{CqProviderExt, QpCreate, QpOps};
use verbs::{
    Access, CmEvent, CompletionQueue, Error, InvalidArg, QpAttr, QpInitAttr, QpState, RecvWr, Result, SendWr, WcOpcode,
    WcStatus, WrError,
};

/// What the data path needs from `create_qp`.
pub(crate) struct QpSetup {
    pub pd_id: u32,
    pub mem: Arc<MemTable>,
    pub send_cq: CompletionQueue,
    pub recv_cq: CompletionQueue,
    pub attr: QpInitAttr,
    pub events: Arc<EventQueue<CmEvent>>,
}

/// Before a connection: the state the application set and the receives it posted.
struct Unbound {
    state: QpState,
    access: Access,
    recvs: Vec<RecvWr>,
}

/// An iWARP RC queue pair.
pub struct QpHandle {
    qpn: u32,
    setup: QpSetup,
    unbound: Mutex<Unbound>,
    conn: OnceLock<Arc<IwarpQp>>,
}

/// The refusal of a transition only the connection manager makes.
fn cm_driven(to: QpState) -> Error {
    Error::NotSupported(format!(
        "iWARP: modify_qp to {to:?}; the connection manager (MPA) moves the QP to RTR and RTS, as the kernel's iw_cm does"
    ))
}

impl QpHandle {
    pub(crate) fn new(qpn: u32, req: QpCreate) -> Self {
        let mut attr = req.attr;
        attr.max_send_wr = attr.max_send_wr.max(1);
        attr.max_recv_wr = attr.max_recv_wr.max(1);
        QpHandle {
            qpn,
            setup: QpSetup {
                pd_id: req.pd_id,
                mem: req.mem,
                send_cq: req.send_cq,
                recv_cq: req.recv_cq,
                attr,
                events: req.events,
            },
            unbound: Mutex::new(Unbound {
                state: QpState::Reset,
                access: Access::empty(),
                recvs: Vec::new(),
            }),
            conn: OnceLock::new(),
        }
    }

    /// The provider's QP behind a verbs QP, if it is one of ours.
    pub(crate) fn of(qp: &Arc<dyn QpOps>) -> Result<&QpHandle> {
        qp.as_any()
            .downcast_ref::<QpHandle>()
            .ok_or_else(|| InvalidArg::OtherDevice.into())
    }

    pub(crate) fn connected(&self) -> Option<&Arc<IwarpQp>> {
        self.conn.get()
    }

    /// Whether a connection may be bound now: in INIT and not connected.
    pub(crate) fn check_bindable(&self) -> Result<()> {
        if self.conn.get().is_some() {
            return Err(InvalidArg::AlreadyConnected(self.qpn).into());
        }
        match self.unbound.lock().unwrap().state {
            QpState::Init => Ok(()),
            s => Err(Error::InvalidState(s)),
        }
    }

    /// Binds the QP to a connection: `start` gets the setup, the QP number
    /// and the receives posted in INIT, and returns the running data path.
    pub(crate) fn bind(
        &self,
        start: impl FnOnce(&QpSetup, u32, Vec<RecvWr>) -> std::io::Result<Arc<IwarpQp>>,
    ) -> Result<()> {
        let mut u = self.unbound.lock().unwrap();
        if u.state != QpState::Init || self.conn.get().is_some() {
            return Err(Error::InvalidState(u.state));
        }
        let recvs = std::mem::take(&mut u.recvs);
        let qp = start(&self.setup, self.qpn, recvs)?;
        let _ = self.conn.set(qp);
        Ok(())
    }

    /// Completes `wrs` with `WrFlushErr` on `cq` (posting to a QP in ERR).
    fn flush(&self, cq: &CompletionQueue, ids: impl Iterator<Item = u64>, opcode: WcOpcode) {
        for id in ids {
            if cq.push(wc(id, WcStatus::WrFlushErr, opcode, self.qpn)).is_err() {
                tracing::debug!("QP {}: CQ full while flushing", self.qpn);
                return;
            }
        }
    }
}

impl QpOps for QpHandle {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        match self.conn.get() {
            Some(c) => c.state(),
            None => self.unbound.lock().unwrap().state,
        }
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<()> {
        if let Some(c) = self.conn.get() {
            return c.post_send(wrs);
        }
        match self.unbound.lock().unwrap().state {
            QpState::Err => {
                self.flush(&self.setup.send_cq, wrs.iter().map(|w| w.wr_id), WcOpcode::Send);
                Ok(())
            }
            s => Err(Error::InvalidState(s)),
        }
    }

    fn post_send_owned(&self, wr: SendWr) -> Result<()> {
        match self.conn.get() {
            Some(c) => c.post_send_owned(wr),
            None => self.post_send(std::slice::from_ref(&wr)),
        }
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<()> {
        if let Some(c) = self.conn.get() {
            return c.post_recv(wrs);
        }
        let mut u = self.unbound.lock().unwrap();
        // The data path may have started while we waited for the lock.
        if let Some(c) = self.conn.get() {
            drop(u);
            return c.post_recv(wrs);
        }
        match u.state {
            QpState::Init => {
                for (index, wr) in wrs.iter().enumerate() {
                    let bad = |error: WrError| Error::BadWr { index, error };
                    let attr = &self.setup.attr;
                    if u.recvs.len() >= attr.max_recv_wr as usize {
                        return Err(bad(WrError::RecvQueueFull { max: attr.max_recv_wr }));
                    }
                    if wr.sg_list.len() > attr.max_recv_sge.max(1) as usize {
                        return Err(bad(WrError::TooManySges {
                            sges: wr.sg_list.len(),
                            max: attr.max_recv_sge.max(1),
                        }));
                    }
                    u.recvs.push(wr.clone());
                }
                Ok(())
            }
            QpState::Err => {
                drop(u);
                self.flush(&self.setup.recv_cq, wrs.iter().map(|w| w.wr_id), WcOpcode::Recv);
                Ok(())
            }
            s => Err(Error::InvalidState(s)),
        }
    }

    fn modify_qp(&self, attr: &QpAttr) -> Result<()> {
        if let Some(c) = self.conn.get() {
            return match attr.qp_state {
                Some(QpState::Err) => {
                    c.set_error();
                    Ok(())
                }
                Some(to) => Err(cm_driven(to)),
                None => Err(Error::NotSupported(
                    "iWARP: the attributes of a connected QP are the connection manager's".into(),
                )),
            };
        }
        let mut u = self.unbound.lock().unwrap();
        match attr.qp_state {
            Some(QpState::Init) | None if matches!(u.state, QpState::Reset | QpState::Init) => {
                if let Some(a) = attr.qp_access_flags {
                    u.access = a;
                }
                if attr.qp_state.is_some() {
                    u.state = QpState::Init;
                }
                Ok(())
            }
            Some(QpState::Reset) => {
                u.state = QpState::Reset;
                u.recvs.clear();
                Ok(())
            }
            Some(QpState::Err) => {
                u.state = QpState::Err;
                let recvs = std::mem::take(&mut u.recvs);
                drop(u);
                self.flush(&self.setup.recv_cq, recvs.iter().map(|w| w.wr_id), WcOpcode::Recv);
                Ok(())
            }
            Some(to) => Err(cm_driven(to)),
            None => Ok(()),
        }
    }

    fn query_qp(&self) -> QpAttr {
        let u = self.unbound.lock().unwrap();
        let mut a = QpAttr::init(1, 0, u.access);
        drop(u);
        a.qp_state = Some(self.state());
        if let Some(c) = self.conn.get() {
            let clamp = |v: u32| v.min(u8::MAX as u32) as u8;
            a.max_rd_atomic = Some(clamp(c.ord()));
            a.max_dest_rd_atomic = Some(clamp(c.ird()));
        }
        a
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        // ibv_destroy_qp: a connected QP's stream ends with it.
        if let Some(c) = self.conn.get() {
            c.disconnect();
        }
    }
}
