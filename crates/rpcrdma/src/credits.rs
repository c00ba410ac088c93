//! RPC-over-RDMA credits (RFC 8166 §3.3.1, §3.3.3; requirements B.2.2, B.4.4).
//!
//! Credits are absolute limits, not deltas (RPCR-CRD-03). A Requester starts
//! with one credit and learns the real grant from the first Reply (RPCR-CRD-07);
//! a granted value is never zero (RPCR-CRD-02).
//!
//! **Responder overrun detection.** The Responder cannot know which of its grants
//! the Requester had seen when it sent a Call. It can still bound the Calls it may
//! legitimately hold unanswered: if `g_j` is the grant in the j-th Reply (with
//! `g_0 = 1`, the initial assumption) and `n` Replies were sent, then
//! `L(n) = max over j <= n of (g_j - (n - j))`, because a Requester that had seen
//! Reply `j` had at most `g_j` Calls out, `n - j` of which have since been answered.
//! The recurrence `L(n+1) = max(L(n) - 1, g_(n+1))` keeps this O(1). A Call that
//! makes the unanswered count exceed `L` is a credit overrun.

/// Credit accounting errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    /// The Requester has no credit left for another Call (local misuse).
    #[error("no credit: {in_flight} calls in flight, limit {limit}")]
    Exhausted {
        /// Calls in flight.
        in_flight: u32,
        /// Current limit.
        limit: u32,
    },
    /// A Reply arrived with no Call in flight.
    #[error("reply with no call in flight")]
    NoCallInFlight,
    /// The peer sent more Calls than any grant allowed.
    #[error("credit overrun: {outstanding} unanswered calls, limit {limit}")]
    Overrun {
        /// Unanswered Calls, including the new one.
        outstanding: u32,
        /// The largest limit the Requester could be using.
        limit: u32,
    },
    /// The Responder has no Call to answer (RPCR-CRD-06: no unsolicited messages).
    #[error("no call to answer")]
    NoCallToAnswer,
    /// A grant of at least one needs a posted Receive: post one first.
    #[error("no receive buffer posted for the minimum grant of one")]
    NoReceiveBuffers,
}

/// The Requester's view (RPCR-CRD-01, -03, -05, -07).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterCredits {
    requested: u32,
    granted: u32,
    in_flight: u32,
}

impl RequesterCredits {
    /// A new connection: `requested` credits asked for in every Call, one credit
    /// assumed until the first Reply (RPCR-CRD-07).
    pub fn new(requested: u32) -> Self {
        RequesterCredits {
            requested: requested.max(1),
            granted: 1,
            in_flight: 0,
        }
    }

    /// Value for rdma_credit in Calls.
    pub fn requested(&self) -> u32 {
        self.requested
    }

    /// Latest grant (1 until the first Reply).
    pub fn granted(&self) -> u32 {
        self.granted
    }

    /// Calls in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// `min(requested, granted)` (RFC 8166 §3.3.1).
    pub fn limit(&self) -> u32 {
        self.requested.min(self.granted)
    }

    /// New Calls allowed now: limit minus Calls in flight.
    pub fn available(&self) -> u32 {
        self.limit().saturating_sub(self.in_flight)
    }

    /// Take a credit for a Call about to be sent (after its Receive is posted,
    /// RPCR-CRD-05).
    pub fn on_send(&mut self) -> Result<(), CreditError> {
        if self.available() == 0 {
            return Err(CreditError::Exhausted {
                in_flight: self.in_flight,
                limit: self.limit(),
            });
        }
        self.in_flight += 1;
        Ok(())
    }

    /// A valid Reply or RDMA_ERROR (B.5 #2) for a Call in flight arrived carrying
    /// `credit`: it replaces the grant (absolute, not a delta), 0 read as 1
    /// (RPCR-CRD-02, as Linux does), and frees one credit.
    pub fn on_reply(&mut self, credit: u32) -> Result<(), CreditError> {
        if self.in_flight == 0 {
            return Err(CreditError::NoCallInFlight);
        }
        self.in_flight -= 1;
        self.granted = credit.max(1);
        Ok(())
    }

    /// Connection lost: back to the initial state (B.4.1); Calls to retransmit
    /// will take credits again on the new connection.
    pub fn reset(&mut self) {
        self.granted = 1;
        self.in_flight = 0;
    }
}

/// The Responder's view (RPCR-CRD-02, -04, -06, B.4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponderCredits {
    max_grant: u32,
    unanswered: u32,
    limit: u32,
}

impl ResponderCredits {
    /// `max_grant`: the most credits this Responder will offer (at least 1).
    pub fn new(max_grant: u32) -> Self {
        ResponderCredits {
            max_grant: max_grant.max(1),
            unanswered: 0,
            limit: 1,
        }
    }

    /// Calls received and not yet answered.
    pub fn unanswered(&self) -> u32 {
        self.unanswered
    }

    /// The largest number of unanswered Calls the Requester may legitimately have.
    pub fn overrun_limit(&self) -> u32 {
        self.limit
    }

    /// A Call (a message that will be answered) arrived. `Err(Overrun)` when the
    /// Requester exceeded every grant it could have seen.
    pub fn on_call(&mut self) -> Result<(), CreditError> {
        let outstanding = self.unanswered.saturating_add(1);
        if outstanding > self.limit {
            return Err(CreditError::Overrun {
                outstanding,
                limit: self.limit,
            });
        }
        self.unanswered = outstanding;
        Ok(())
    }

    /// The grant to put in the Reply (or RDMA_ERROR) about to be sent, and record
    /// it. `posted_receives`: Receives posted and not yet consumed. The grant
    /// never exceeds what those Receives can absorb (RPCR-CRD-04) nor
    /// `max_grant`, and is never 0 (RPCR-CRD-02).
    pub fn on_reply(&mut self, posted_receives: u32) -> Result<u32, CreditError> {
        if self.unanswered == 0 {
            return Err(CreditError::NoCallToAnswer);
        }
        let after = self.unanswered - 1;
        let grant = self.max_grant.min(posted_receives.saturating_add(after));
        if grant == 0 {
            return Err(CreditError::NoReceiveBuffers);
        }
        self.unanswered = after;
        self.limit = self.limit.saturating_sub(1).max(grant);
        Ok(grant)
    }

    /// A Call whose RPC was abandoned without a Reply (the connection will be
    /// closed, RFC 8166 §4.5.4): forget it.
    pub fn on_call_dropped(&mut self) {
        self.unanswered = self.unanswered.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RPCR-CRD-01: never more Calls in flight than the grant (grant 4, 100 tries).
    #[test]
    fn crd01_in_flight_never_exceeds_grant() {
        let mut c = RequesterCredits::new(128);
        c.on_send().unwrap();
        c.on_reply(4).unwrap();
        let mut sent = 0;
        for _ in 0..100 {
            if c.on_send().is_ok() {
                sent += 1;
            }
            assert!(c.in_flight() <= 4);
        }
        assert_eq!(sent, 4);
        assert_eq!(c.on_send(), Err(CreditError::Exhausted { in_flight: 4, limit: 4 }));
    }

    /// RPCR-CRD-02: a received grant of 0 is read as 1; a Responder never grants 0.
    #[test]
    fn crd02_grant_never_zero() {
        let mut c = RequesterCredits::new(8);
        c.on_send().unwrap();
        c.on_reply(0).unwrap();
        assert_eq!(c.granted(), 1);
        assert_eq!(c.available(), 1);

        let mut r = ResponderCredits::new(0);
        r.on_call().unwrap();
        assert_eq!(r.on_reply(0), Err(CreditError::NoReceiveBuffers));
        assert_eq!(r.on_reply(1), Ok(1));
    }

    /// RPCR-CRD-03: grants are absolute; the Requester follows the latest value
    /// (8, 8, 2, 8) and the limit is min(requested, granted).
    #[test]
    fn crd03_grants_are_absolute_limits() {
        let mut c = RequesterCredits::new(6);
        for g in [8, 8, 2, 8] {
            c.on_send().unwrap();
            c.on_reply(g).unwrap();
            assert_eq!(c.granted(), g);
            assert_eq!(c.limit(), g.min(6));
            assert_eq!(c.available(), g.min(6));
        }
        // starting or finishing RPCs does not change the advertised values
        c.on_send().unwrap();
        assert_eq!(c.limit(), 6);
        assert_eq!(c.available(), 5);
    }

    /// RPCR-CRD-04: the grant never exceeds the Receives already posted (plus the
    /// Calls already received, which need no new Receive).
    #[test]
    fn crd04_grant_bounded_by_posted_receives() {
        let mut r = ResponderCredits::new(64);
        r.on_call().unwrap();
        assert_eq!(r.on_reply(10), Ok(10));
        for _ in 0..3 {
            r.on_call().unwrap();
        }
        // answering one of three: two still held, 5 Receives posted -> 7
        assert_eq!(r.on_reply(5), Ok(7));
        assert_eq!(r.on_reply(100), Ok(64));
    }

    /// RPCR-CRD-05: a Requester sends only with a credit, after which it must
    /// hold a Receive for the Reply; the credit is given back by the Reply.
    #[test]
    fn crd05_one_receive_per_outstanding_call() {
        let mut c = RequesterCredits::new(2);
        c.on_send().unwrap();
        assert_eq!(c.in_flight(), 1); // = Receives the Requester must have posted
        c.on_reply(2).unwrap();
        assert_eq!(c.in_flight(), 0);
        assert_eq!(c.on_reply(2), Err(CreditError::NoCallInFlight));
    }

    /// RPCR-CRD-06: the Responder emits exactly one message per Call, never an
    /// unsolicited one.
    #[test]
    fn crd06_no_unsolicited_replies() {
        let mut r = ResponderCredits::new(4);
        assert_eq!(r.on_reply(4), Err(CreditError::NoCallToAnswer));
        r.on_call().unwrap();
        r.on_reply(4).unwrap();
        assert_eq!(r.on_reply(4), Err(CreditError::NoCallToAnswer));
    }

    /// RPCR-CRD-07: one credit until the first valid Reply; a second Call before
    /// it is refused. The Responder flags a second unanswered Call as overrun.
    #[test]
    fn crd07_one_credit_until_first_reply() {
        let mut c = RequesterCredits::new(128);
        assert_eq!(c.limit(), 1);
        c.on_send().unwrap();
        assert!(c.on_send().is_err());
        c.on_reply(32).unwrap();
        assert_eq!(c.available(), 32);
        c.reset();
        assert_eq!(c.limit(), 1);

        let mut r = ResponderCredits::new(64);
        r.on_call().unwrap();
        assert_eq!(
            r.on_call(),
            Err(CreditError::Overrun {
                outstanding: 2,
                limit: 1
            })
        );
    }

    /// RPCR-CRD-08: a Responder MAY offer more than one credit from the start
    /// (its first Reply carries the full grant).
    #[test]
    fn crd08_responder_may_offer_more_at_start() {
        let mut r = ResponderCredits::new(64);
        r.on_call().unwrap();
        assert_eq!(r.on_reply(64), Ok(64));
        for _ in 0..64 {
            r.on_call().unwrap();
        }
        assert!(r.on_call().is_err());
    }

    /// B.4.4: lowering the grant is enforced only as far as Replies prove it: the
    /// Requester may still be using the older, larger grant.
    #[test]
    fn overrun_limit_after_lowered_grant() {
        let mut r = ResponderCredits::new(8);
        r.on_call().unwrap();
        assert_eq!(r.on_reply(8), Ok(8));
        // Requester sends 8 Calls; the Responder lowers to 2 on its first Reply
        for _ in 0..8 {
            r.on_call().unwrap();
        }
        r.max_grant = 2;
        assert_eq!(r.on_reply(8), Ok(2));
        assert_eq!(r.overrun_limit(), 7); // 8 - 1 answered
        // the 7 left are legitimate; an 8th unanswered one is not
        assert!(r.on_call().is_err());
        // as Replies go out the limit decays towards the new grant
        for want in [6, 5, 4, 3, 2, 2] {
            r.on_reply(8).unwrap();
            assert_eq!(r.overrun_limit(), want);
        }
        r.on_call_dropped();
        assert_eq!(r.unanswered(), 0);
    }
}
