//! An ONC RPC program served and called over RPC-over-RDMA (RFC 8166).
//!
//! ```sh
//! cargo run --release -p softrdma --example rpc_rdma -- server 127.0.0.1:20049
//! cargo run --release -p softrdma --example rpc_rdma -- client 127.0.0.1:20049
//! ```
//!
//! The program (number 0x2000_5a5a, version 1) has NULL and one procedure,
//! UPPER, which takes a text and returns it in upper case. Argument and
//! result are DDP-eligible opaques (RFC 8166 §6): a short text travels inline
//! in the Send, a long one the client leaves in a registered region for the
//! server to pull with RDMA Read (a Read chunk), and the server places the
//! long result straight into the client's memory with RDMA Write (a Write
//! chunk). The rpcrdma crate does all of that, the registrations, the chunk
//! lists, credits and inline thresholds; the program only encodes and decodes
//! XDR and marks which items are eligible.
//!
//! The server answers until it has sent `--replies N` replies (default: run
//! until killed), then prints its counters.

use rpcrdma::client::{Call, RpcError};
use rpcrdma::server::{CallContext, ProcError, Registry as Programs};
use rpcrdma::transport::{RdmaClient, RdmaConfig, RdmaServer};
use rpcrdma::xdr::{Decoder, Encoder, ReplySizing, roundup_u32};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use verbs::{Device, DeviceOptions};

const PROGRAM: u32 = 0x2000_5a5a;
const VERSION: u32 = 1;
const NULL: u32 = 0;
const UPPER: u32 = 1;
/// The largest text either side accepts (`opaque text<MAX_TEXT>`).
const MAX_TEXT: usize = 1 << 20;

/// Opens a device by name from the providers this program links: the one
/// place that names a provider crate (the RPC layer takes any `verbs::Device`).
fn open_device() -> verbs::Result<Device> {
    verbs::Registry::new()
        .with(Arc::new(iwarp::IwarpFactory))
        .open("siw_soft0", &DeviceOptions::new())
}

/// The server side of UPPER: decode the argument, encode the result. The
/// decoder hands out the text wherever it came from (inline or a Read chunk).
fn upper(_: &CallContext, args: &mut Decoder<'_>, res: &mut Encoder<Vec<u8>>) -> Result<(), ProcError> {
    let text = args.get_opaque_ddp(MAX_TEXT)?;
    res.put_opaque_ddp(&text.to_ascii_uppercase(), MAX_TEXT)?;
    Ok(())
}

fn server(addr: SocketAddr, replies: Option<u64>) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let mut programs = Programs::new();
    programs
        .register_null(PROGRAM, VERSION)
        .register(PROGRAM, VERSION, UPPER, upper);
    // Worker threads serve the connections; the server stops when dropped.
    let srv = RdmaServer::spawn(&dev, addr, Arc::new(programs), RdmaConfig::default())?;
    println!("listening on {}", srv.local_addr());
    let Some(want) = replies else {
        loop {
            std::thread::park();
        }
    };
    while srv.snapshot().replies < want {
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = srv.snapshot();
    println!(
        "{} replies; calls: {} short, {} with Read chunks, {} long; replies through Write chunks: {}",
        s.replies, s.calls_short, s.calls_chunked, s.calls_long, s.replies_write_chunks
    );
    Ok(())
}

/// The client side of UPPER. `ReplySizing` tells the transport how large the
/// results can get, so that it can register a Write chunk for a long result
/// before sending the Call (RFC 8166 §3.4.5: the requester provisions).
fn call_upper(client: &RdmaClient, text: &[u8]) -> Result<Vec<u8>, RpcError> {
    let args = |e: &mut Encoder<Vec<u8>>| e.put_opaque_ddp(text, MAX_TEXT);
    let sizing = ReplySizing {
        max_results: 4 + roundup_u32(text.len() as u32).unwrap_or(u32::MAX),
        ddp_results: vec![text.len() as u32],
    };
    let call = Call::new(PROGRAM, VERSION, UPPER, &args, sizing);
    client.call(&call, |d| Ok(d.get_opaque_ddp(MAX_TEXT)?.to_vec()))
}

fn client(addr: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let dev = open_device()?;
    let pd = dev.alloc_pd()?;
    // Connects at once (with RFC 8797 private data giving the inline thresholds);
    // reconnects and retransmits by itself if the connection is lost.
    let client = RdmaClient::connect(&pd, addr, RdmaConfig::default())?;
    if let Some(n) = client.negotiated() {
        println!(
            "connected; inline thresholds: call {} reply {} bytes",
            n.thresholds.call, n.thresholds.reply
        );
    }
    client.call(
        &Call::new(PROGRAM, VERSION, NULL, &|_| Ok(()), ReplySizing::default()),
        |_| Ok(()),
    )?;
    println!("NULL answered");

    let short = call_upper(&client, b"hello, rpc over rdma")?;
    println!("UPPER: {}", String::from_utf8_lossy(&short));

    // 256 KiB: far above the inline threshold, so it goes by RDMA Read and Write.
    let long: Vec<u8> = (0..256 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    let back = call_upper(&client, &long)?;
    if back != long.to_ascii_uppercase() {
        return Err("the long UPPER came back wrong".into());
    }
    println!("UPPER of {} bytes: matches", back.len());
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [r, a] if r == "server" => server(a.parse()?, None),
        [r, a, flag, n] if r == "server" && flag == "--replies" => server(a.parse()?, Some(n.parse()?)),
        [r, a] if r == "client" => client(a.parse()?),
        _ => Err("usage: rpc_rdma server ADDR:PORT [--replies N] | rpc_rdma client ADDR:PORT".into()),
    }
}
