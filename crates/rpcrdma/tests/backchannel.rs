//! RFC 8167 reverse-direction calls over real loopback iWARP: the Responder calls the
//! Requester on the same connection while forward calls run (credits accounted apart, §4.1;
//! extra receives on both sides, §4.3), inline thresholds swapped (§4.2), a Requester that did
//! not offer a backchannel drops reverse Calls and keeps the connection (§6).

use std::sync::Arc;
use std::time::Duration;

use rpcrdma::client::{Call, LocalError, RpcError};
use rpcrdma::demo;
use rpcrdma::rpc::AcceptStat;
use rpcrdma::server::{ProcError, Registry};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::xdr::{Encoder, ReplySizing};

const CB_PROG: u32 = 0x4000_0001;

fn callbacks() -> Registry {
    let mut r = Registry::new();
    r.register_null(CB_PROG, 1);
    r.register(CB_PROG, 1, 1, |_, d, e| {
        let x = d.get_u32()?;
        e.put_u32(x.wrapping_add(1))?;
        Ok(())
    });
    // results larger than the forward call threshold (1024): SYSTEM_ERR instead
    r.register(CB_PROG, 1, 2, |_, d, e| {
        let n = d.get_u32()? as usize;
        if n > 1 << 20 {
            return Err(ProcError::SystemErr);
        }
        e.put_opaque(&vec![7u8; n], 1 << 20)?;
        Ok(())
    });
    r
}

fn bump(bc: &rpcrdma::transport::Backchannel, x: u32) -> Result<u32, RpcError> {
    let args = move |e: &mut Encoder<Vec<u8>>| e.put_u32(x);
    let call = Call::new(CB_PROG, 1, 1, &args, ReplySizing::default());
    bc.call(&call, Duration::from_secs(10), |d| d.get_u32())
}

fn setup(backchannel: bool) -> (verbs::Device, RdmaServer, RdmaClient) {
    let dev = iwarp::open_device(iwarp::IwarpConfig::default()).unwrap();
    let srv = RdmaServer::spawn(
        &dev,
        "127.0.0.1:0".parse().unwrap(),
        Arc::new(demo::registry()),
        RdmaConfig::default(),
    )
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let c = if backchannel {
        RdmaClient::connect_with_backchannel(&pd, srv.local_addr(), RdmaConfig::default(), Arc::new(callbacks()))
    } else {
        RdmaClient::connect(&pd, srv.local_addr(), RdmaConfig::default())
    }
    .unwrap();
    demo::null(&c).unwrap();
    (dev, srv, c)
}

#[test]
fn reverse_calls_alongside_forward_calls() {
    let (_dev, srv, c) = setup(true);
    let bcs = srv.backchannels();
    assert_eq!(bcs.len(), 1);
    let bc = &bcs[0];
    assert!(bc.is_open());
    assert_eq!(bump(bc, 41).unwrap(), 42);
    // NULL in the reverse direction
    let null = Call::new(CB_PROG, 1, 0, &|_| Ok(()), ReplySizing::default());
    bc.call(&null, Duration::from_secs(5), |_| Ok(())).unwrap();
    // reverse calls from many threads (more than BC_CREDITS at once) while the client makes
    // forward calls with chunks on the same connection
    std::thread::scope(|s| {
        for t in 0..12u32 {
            let bc = bc.clone();
            s.spawn(move || {
                for i in 0..10 {
                    let x = t * 1000 + i;
                    assert_eq!(bump(&bc, x).unwrap(), x + 1);
                }
            });
        }
        for i in 0..4u32 {
            let c = &c;
            s.spawn(move || {
                for j in 0..10 {
                    let n = 3000 + 977 * (i + j) as usize;
                    assert_eq!(demo::read(c, n, j).unwrap(), demo::pattern(n, j));
                }
            });
        }
    });
    // RFC 8167 §4.2: a reverse Reply larger than the forward call threshold becomes SYSTEM_ERR;
    // a reverse Call larger than the forward reply threshold is refused before sending
    let args = |e: &mut Encoder<Vec<u8>>| e.put_u32(2000);
    let big = Call::new(CB_PROG, 1, 2, &args, ReplySizing::default());
    assert_eq!(
        bc.call(&big, Duration::from_secs(5), |_| Ok(())),
        Err(RpcError::Accepted(AcceptStat::SystemErr))
    );
    let small = |e: &mut Encoder<Vec<u8>>| e.put_u32(100);
    let ok = Call::new(CB_PROG, 1, 2, &small, ReplySizing::default());
    assert_eq!(
        bc.call(&ok, Duration::from_secs(5), |d| Ok(d.get_opaque(200)?.len()))
            .unwrap(),
        100
    );
    let huge_args = |e: &mut Encoder<Vec<u8>>| e.put_opaque(&[1u8; 2000], 4096);
    let huge = Call::new(CB_PROG, 1, 1, &huge_args, ReplySizing::default());
    assert!(matches!(
        bc.call(&huge, Duration::from_secs(5), |_| Ok(())),
        Err(RpcError::Local(LocalError::ReverseCallTooLarge { .. }))
    ));
    let st = srv.snapshot();
    assert_eq!((st.fatal, st.rdma_errors, st.dropped), (0, 0, 0), "{st:?}");
    // the connection still works forward
    demo::null(&c).unwrap();
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!bc.is_open());
    assert!(matches!(
        bump(bc, 1),
        Err(RpcError::Disconnected(_)) | Err(RpcError::Timeout)
    ));
}

/// RFC 8167 §6: a client that offered no backchannel drops the reverse Call; the connection
/// survives and forward calls go on.
#[test]
fn reverse_call_to_a_client_without_backchannel_is_dropped() {
    let (_dev, srv, c) = setup(false);
    let bc = srv.backchannels().pop().unwrap();
    let args = |e: &mut Encoder<Vec<u8>>| e.put_u32(1);
    let call = Call::new(CB_PROG, 1, 1, &args, ReplySizing::default());
    assert_eq!(
        bc.call(&call, Duration::from_millis(500), |d| d.get_u32()),
        Err(RpcError::Timeout)
    );
    assert_eq!(demo::read(&c, 50_000, 1).unwrap(), demo::pattern(50_000, 1));
    assert_eq!(c.connects(), 1);
    assert_eq!(srv.snapshot().fatal, 0);
}
