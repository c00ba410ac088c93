//! `softrdma nfs probe`: how an NFS/RDMA server handles chunks it cannot use (RFC 8166 §4.5).
//!
//! Each case makes one deliberately broken RPC on a working RPC-over-RDMA connection, reports
//! what the server answered and checks that the client still works after it:
//!
//! | case | the call | RFC 8166 |
//! |---|---|---|
//! | `short-write-chunk` | READ of `--count` bytes with a 4 KiB Write chunk | §4.5.3: too small a chunk; the Responder may detect it before writing: ERR_CHUNK |
//! | `short-reply-chunk` | READ of `--count` bytes, no Write list, an 8 KiB Reply chunk | §4.5.3 third bullet: ERR_CHUNK (or a Remote Access Error) |
//! | `stale-write-handle` | READ whose Write chunk names an invalid STag | §4.5.3 first bullet: the Responder's RDMA Write meets our Terminate and the connection ends; after the reconnect the retransmission gets ERR_CHUNK (SHOULD) or is executed again |
//! | `stale-read-handle` | WRITE (to `--scratch DIR`) whose Read chunk names an invalid STag | the same through the Responder's RDMA Read |
//!
//! The stale-handle faults apply to the first transmission only ([`ChunkFault`]).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use rpcrdma::client::{Call, RpcError};
use rpcrdma::nfs3::{self, Fh, Ftype, ReadArgs, ReadRes, Res, Stable, WriteArgs, WriteRes, procs};
use rpcrdma::transport::{ChunkFault, RdmaClient};
use rpcrdma::wire::ErrorBody;
use rpcrdma::xdr::{ReplySizing, XdrDecode, XdrEncode};
use serde_json::json;

use super::{Client, Opts, Session};

/// What one case saw.
struct Outcome {
    case: &'static str,
    rfc: &'static str,
    observed: String,
    /// The answer is one RFC 8166 §4.5 allows for this case.
    as_rfc: bool,
    /// The client made a plain call successfully afterwards (and the data matched, where checked).
    client_ok: bool,
    reconnects: u32,
    elapsed: Duration,
}

/// How a call ended, in the vocabulary of RFC 8166 and RFC 5531.
fn describe<T>(r: &Result<T, RpcError>, reconnects: u32) -> String {
    let after = if reconnects > 0 {
        format!(" (after {reconnects} reconnect(s): the connection was lost and the call retransmitted)")
    } else {
        String::new()
    };
    match r {
        Ok(_) => format!("completed{after}"),
        Err(RpcError::RdmaError(ErrorBody::Chunk)) => format!("RDMA_ERROR ERR_CHUNK{after}"),
        Err(RpcError::RdmaError(ErrorBody::Vers { low, high })) => format!("RDMA_ERROR ERR_VERS {low}..{high}{after}"),
        Err(RpcError::Accepted(s)) => format!("RPC reply, accept_stat {s:?}{after}"),
        Err(e) => format!("{e}{after}"),
    }
}

fn is_err_chunk<T>(r: &Result<T, RpcError>) -> bool {
    matches!(r, Err(RpcError::RdmaError(ErrorBody::Chunk)))
}

/// READ `count` bytes at 0 with `sizing` (and `fault`): the data, or the NFS status as an error.
fn read(
    c: &RdmaClient,
    auth: &rpcrdma::client::Auth,
    fh: &Fh,
    count: u32,
    sizing: ReplySizing,
    fault: Option<ChunkFault>,
) -> Result<Result<Vec<u8>, nfs3::NfsStat>, RpcError> {
    let args = ReadArgs {
        file: fh.clone(),
        offset: 0,
        count,
    };
    let enc = |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>| args.encode(e);
    let call = Call::new(nfs3::PROGRAM, nfs3::VERSION, procs::READ, &enc, sizing).with_auth(auth);
    let decode = |d: &mut rpcrdma::xdr::Decoder<'_>| {
        Ok(match ReadRes::<&[u8]>::decode(d)? {
            Res::Ok(o) => Ok(o.data.to_vec()),
            Res::Fail(s, _) => Err(s),
        })
    };
    match fault {
        Some(f) => c.call_with_fault(&call, decode, f),
        None => c.call(&call, decode),
    }
}

/// Run the cases against the file `s.rest` (and, for a WRITE, a new file in `scratch`).
pub(super) fn run(o: &Opts, s: &Session, count: u32, scratch: Option<&str>) -> Result<bool> {
    let Client::Rdma(c) = s.nfs.rpc() else {
        bail!("nfs probe needs --transport rdma (the cases are about RDMA chunks)");
    };
    let auth = s.nfs.auth().clone();
    let (fh, a) = s.nfs.lookup_path(&s.root, &s.rest)?;
    if a.ftype != Ftype::Reg {
        bail!("{} is a {}, not a regular file", s.rest, a.ftype.name());
    }
    let count = count.min(u32::try_from(a.size).unwrap_or(u32::MAX));
    if count < 16 << 10 {
        bail!(
            "the file has {} bytes; the probe needs at least 16 KiB to outgrow a 4 KiB chunk",
            a.size
        );
    }
    // the reference: a plain READ
    let want = match read(c, &auth, &fh, count, nfs3::sizing::read(count), None)? {
        Ok(d) => d,
        Err(st) => bail!("the reference READ failed: {st}"),
    };
    let healthy = || s.nfs.null().is_ok();
    let mut out = Vec::new();
    let mut case = |case: &'static str, rfc: &'static str, f: &mut dyn FnMut() -> (String, bool, bool)| {
        let before = c.connects();
        let t = Instant::now();
        let (observed, as_rfc, data_ok) = f();
        let elapsed = t.elapsed();
        let reconnects = c.connects() - before;
        let client_ok = data_ok && healthy();
        tracing::info!(case, %observed, as_rfc, client_ok, "nfs probe");
        out.push(Outcome {
            case,
            rfc,
            observed,
            as_rfc,
            client_ok,
            reconnects,
            elapsed,
        });
    };

    let small_write = ReplySizing {
        max_results: nfs3::sizing::read(4096).max_results,
        ddp_results: vec![4096],
    };
    case(
        "short-write-chunk",
        "ERR_CHUNK, or an RPC-level error reply; the connection stays (§4.5.2/§4.5.3)",
        &mut || {
            let before = c.connects();
            let r = read(c, &auth, &fh, count, small_write.clone(), None);
            let rfc = (is_err_chunk(&r) || matches!(r, Err(RpcError::Accepted(_)))) && c.connects() == before;
            (describe(&r, c.connects() - before), rfc, true)
        },
    );
    let small_reply = ReplySizing {
        max_results: 8 << 10,
        ddp_results: vec![],
    };
    case(
        "short-reply-chunk",
        "ERR_CHUNK; the connection stays (§4.5.3: the Responder detects it before writing)",
        &mut || {
            let before = c.connects();
            let r = read(c, &auth, &fh, count, small_reply.clone(), None);
            (
                describe(&r, c.connects() - before),
                is_err_chunk(&r) && c.connects() == before,
                true,
            )
        },
    );
    case(
        "stale-write-handle",
        "the connection ends (Terminate); the retransmission gets ERR_CHUNK (SHOULD) or its reply (§4.5.3)",
        &mut || {
            let before = c.connects();
            let r = read(
                c,
                &auth,
                &fh,
                count,
                nfs3::sizing::read(count),
                Some(ChunkFault::StaleWriteHandles),
            );
            let lost = c.connects() > before;
            let data_ok = match &r {
                Ok(Ok(d)) => *d == want,
                _ => true,
            };
            let rfc = lost && (is_err_chunk(&r) || matches!(&r, Ok(Ok(d)) if *d == want));
            (describe(&r, c.connects() - before), rfc, data_ok)
        },
    );
    if let Some(dir) = scratch {
        case(
            "stale-read-handle",
            "the connection ends (Terminate); the retransmission gets ERR_CHUNK (SHOULD) or its reply (§4.5.3)",
            &mut || match stale_read(s, c, &auth, dir, &want) {
                Ok(r) => r,
                Err(e) => (format!("setup failed: {e:#}"), false, false),
            },
        );
    }

    let all_ok = out.iter().all(|x| x.as_rfc && x.client_ok);
    if o.json {
        let v: Vec<_> = out
            .iter()
            .map(|x| {
                json!({"case": x.case, "observed": x.observed, "rfc_8166": x.rfc, "as_rfc": x.as_rfc,
                       "client_ok": x.client_ok, "reconnects": x.reconnects, "ms": x.elapsed.as_secs_f64() * 1e3})
            })
            .collect();
        println!(
            "{}",
            json!({"server": s.info, "file": s.rest, "count": count, "cases": v, "ok": all_ok})
        );
    } else {
        println!("probing {} with READs of {count} bytes of {}", s.info, s.rest);
        for x in &out {
            println!(
                "{:<19} {}  [{}; client {}; {:.0} ms]",
                x.case,
                x.observed,
                if x.as_rfc { "as RFC 8166" } else { "NOT as RFC 8166" },
                if x.client_ok { "fine" } else { "BROKEN" },
                x.elapsed.as_secs_f64() * 1e3
            );
            println!("{:<19} RFC 8166: {}", "", x.rfc);
        }
    }
    Ok(all_ok)
}

/// CREATE `probe-<pid>` in `dir`, WRITE the reference bytes through a stale Read chunk, read
/// them back.
fn stale_read(
    s: &Session,
    c: &RdmaClient,
    auth: &rpcrdma::client::Auth,
    dir: &str,
    data: &[u8],
) -> Result<(String, bool, bool)> {
    let (dfh, da) = s.nfs.lookup_path(&s.root, dir)?;
    if da.ftype != Ftype::Dir {
        return Err(anyhow!("--scratch {dir} is not a directory"));
    }
    let name = format!("softrdma-probe-{}", std::process::id());
    let fh = super::create_empty(&s.nfs, &dfh, &name)?;
    let args = WriteArgs {
        file: fh.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: Stable::FileSync,
        data,
    };
    let enc = |e: &mut rpcrdma::xdr::Encoder<Vec<u8>>| args.encode(e);
    let call = Call::new(nfs3::PROGRAM, nfs3::VERSION, procs::WRITE, &enc, nfs3::sizing::write()).with_auth(auth);
    let before = c.connects();
    let r = c.call_with_fault(
        &call,
        #[allow(clippy::redundant_closure)] // a fn item is not general enough over the lifetime
        |d| WriteRes::decode(d),
        ChunkFault::StaleReadHandles,
    );
    let lost = c.connects() > before;
    let written = matches!(&r, Ok(Res::Ok(w)) if w.count as usize == data.len());
    // what the server has now: the whole data after a completed retransmission, else nothing
    let back = read(
        c,
        auth,
        &fh,
        data.len() as u32,
        nfs3::sizing::read(data.len() as u32),
        None,
    )?;
    let data_ok = match &back {
        Ok(b) if written => b == data,
        Ok(b) => b.is_empty() || b == data,
        Err(_) => false,
    };
    let rfc = lost && (is_err_chunk(&r) || written);
    Ok((
        format!("{} (file {dir}/{name})", describe(&r, c.connects() - before)),
        rfc,
        data_ok,
    ))
}
