//! Which completions and CM events mark a chunk as refused (RPCR-MEM-05, issue 17).

use super::*;

/// Issue 17: a connection reset under a WRITE's RDMA Read (or a READ's RDMA Writes) flushes
/// them; the Call's retransmission must run, not get ERR_CHUNK (RPCR-MEM-05 is about the
/// Requester refusing the chunk).
#[test]
fn a_flush_by_a_broken_connection_is_not_a_refused_chunk() {
    let reset = CmEvent::ConnectionError("Connection reset by peer".into());
    assert!(!chunk_refused(Some(WcStatus::WrFlushErr), Some(&reset)));
    assert!(!chunk_refused(Some(WcStatus::WrFlushErr), Some(&CmEvent::Disconnected)));
    assert!(!chunk_refused(Some(WcStatus::WrFlushErr), None));
    assert!(!chunk_refused(Some(WcStatus::RetryExcErr), None));
    assert!(!chunk_refused(None, None));
}

/// RPCR-MEM-05: the Requester's Terminate, or the completion status it gives the operation
/// it names, marks the chunk as refused.
#[test]
fn a_terminate_or_remote_access_error_is_a_refused_chunk() {
    let term = CmEvent::ErrorReceived(verbs::cm::ErrorDetail::new(
        "layer 1, type 1, code 0: invalid STag".to_string(),
    ));
    assert!(chunk_refused(Some(WcStatus::WrFlushErr), Some(&term)));
    assert!(chunk_refused(Some(WcStatus::RemAccessErr), None));
    assert!(chunk_refused(Some(WcStatus::RemOpErr), Some(&CmEvent::Disconnected)));
    assert!(chunk_refused(Some(WcStatus::RemInvReqErr), None));
}
