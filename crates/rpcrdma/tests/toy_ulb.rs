//! End-to-end, sans-I/O: a toy RPC program with one DDP-eligible argument
//! (WRITE data) and one DDP-eligible result (READ data), carried between a
//! Requester and a Responder through every module of the crate, with RDMA Read
//! and Write simulated on a map of registered regions (requirements E.6).
//! Sizes 0, 1, 1023, 1024, 1025, 4 KiB, 1 MiB; thresholds 1024 and 4096; Short,
//! Chunked and Long Calls and Replies; RPCSEC_GSS-style "no reduction" mode.

use std::collections::HashMap;

use rpcrdma::credits::{RequesterCredits, ResponderCredits};
use rpcrdma::inline::{
    CallForm, CallOptions, ReplyForm, Thresholds, max_rpc_reply_header, plan_call, plan_reply, plan_reply_resources,
};
use rpcrdma::rpc::{AcceptStat, CallHeader, OpaqueAuth, ReplyHeader, RpcMessage};
use rpcrdma::validate::{
    CallPayload, FailedXids, RequesterDecision, ResponderDecision, ResponderPolicy, check_payload_xid, validate_call,
    validate_reply,
};
use rpcrdma::wire::chunks::position_zero_read_list;
use rpcrdma::wire::{Body, ChunkLists, Header, Limits, ReadSegment, Segment, WriteChunk};
use rpcrdma::xdr::{
    ChunkSource, Decoder, Encoder, InsertedChunk, ProcedureBinding, ReplySizing, ReturnedWriteChunk, Sink, XdrDecode,
    XdrEncode, XdrError,
};

const PROG: u32 = 0x2000_0099;
const MAX_DATA: usize = 1 << 20;

/// Arguments of both toy procedures.
enum Args {
    /// proc 1: store `data` (eligible), returns its length.
    Write(Vec<u8>),
    /// proc 2: return `len` bytes (eligible result) and a trailing u32.
    Read(u32),
}

impl XdrEncode for Args {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        match self {
            Args::Write(d) => {
                e.put_u32(0xfeed)?;
                e.put_opaque_ddp(d, MAX_DATA)
            }
            Args::Read(n) => e.put_u32(*n),
        }
    }
}

struct Toy;
impl ProcedureBinding for Toy {
    const PROGRAM: u32 = PROG;
    const VERSION: u32 = 1;
    const PROCEDURE: u32 = 0; // per call below
    type Args = Args;
    fn reply_sizing(args: &Args) -> ReplySizing {
        match args {
            Args::Write(_) => ReplySizing {
                max_results: 4,
                ddp_results: vec![],
            },
            Args::Read(n) => ReplySizing {
                max_results: 4 + 4 + rpcrdma::xdr::roundup_u32(*n).unwrap() + 4,
                ddp_results: vec![*n],
            },
        }
    }
}

#[derive(Default)]
struct Mem {
    regions: HashMap<u32, Vec<u8>>,
    next: u32,
}

impl Mem {
    fn register(&mut self, bytes: Vec<u8>) -> Segment {
        self.next += 1;
        let handle = 0x1000 + self.next;
        let length = bytes.len() as u32;
        self.regions.insert(handle, bytes);
        Segment {
            handle,
            length,
            offset: 0,
        }
    }
    fn read(&self, s: &Segment) -> &[u8] {
        &self.regions[&s.handle][s.offset as usize..][..s.length as usize]
    }
    fn write(&mut self, handle: u32, offset: u64, data: &[u8]) {
        let r = self.regions.get_mut(&handle).expect("registered");
        r[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }
}

struct Outcome {
    result: Vec<u8>,
    call_form: &'static str,
    reply_form: ReplyForm,
    used_write_chunk: bool,
}

fn one(_: usize) -> usize {
    1
}

fn run(args: Args, th: Thresholds, opts: CallOptions) -> Outcome {
    let xid = 0x4242;
    let proc_ = match args {
        Args::Write(_) => 1,
        Args::Read(_) => 2,
    };
    let mut mem = Mem::default();
    let mut rq = RequesterCredits::new(32);
    let mut rs = ResponderCredits::new(16);

    // ---- Requester: encode, provision, choose the form
    rq.on_send().unwrap();
    let mut e = Encoder::new(Vec::new());
    CallHeader {
        xid,
        rpcvers: 2,
        prog: Toy::PROGRAM,
        vers: Toy::VERSION,
        proc_,
        cred: OpaqueAuth::NONE,
        verf: OpaqueAuth::NONE,
    }
    .encode(&mut e)
    .unwrap();
    args.encode(&mut e).unwrap();
    let (stream, items) = e.finish();
    let sizing = Toy::reply_sizing(&args);
    let res = plan_reply_resources(
        &th,
        max_rpc_reply_header(0) + sizing.max_results,
        &sizing.ddp_results,
        one,
        opts,
    );
    let mut provisioned = ChunkLists::default();
    for cap in &res.write_chunks {
        let s = mem.register(vec![0xee; *cap as usize]);
        provisioned.writes.push(WriteChunk { segments: vec![s] });
    }
    if let Some(cap) = res.reply_chunk {
        let s = mem.register(vec![0xee; cap as usize]);
        provisioned.reply = Some(WriteChunk { segments: vec![s] });
    }
    let plan = plan_call(&th, &stream, &items, &provisioned, one, opts).unwrap();
    let (body, payload, call_form) = match plan.form {
        CallForm::Short => (Body::Msg(provisioned.clone()), stream.clone(), "short"),
        CallForm::Chunked(r) => {
            let mut l = provisioned.clone();
            for it in &r.items {
                let s = mem.register(stream[it.range.clone()].to_vec());
                l.reads.push(ReadSegment {
                    position: it.position,
                    target: s,
                });
            }
            (Body::Msg(l), r.payload, "chunked")
        }
        CallForm::Long => {
            let mut l = provisioned.clone();
            l.reads = position_zero_read_list(&[mem.register(stream.clone())]);
            (Body::NoMsg(l), Vec::new(), "long")
        }
    };
    let mut call_msg = Header::new(xid, rq.requested(), body).to_vec().unwrap();
    call_msg.extend_from_slice(&payload);
    assert!(call_msg.len() <= th.call as usize, "call fits its Send");
    assert_eq!(call_msg.len(), plan.send_len);

    // ---- Responder: validate, pull, decode, execute, reply
    let ResponderDecision::Process(vc) = validate_call(&call_msg, &ResponderPolicy::default(), &FailedXids::new(4))
    else {
        panic!("call rejected")
    };
    rs.on_call().unwrap();
    let pulled: Vec<Vec<u8>> = vc
        .read_chunks
        .iter()
        .map(|c| c.segments.iter().flat_map(|s| mem.read(s).to_vec()).collect())
        .collect();
    let p0: Vec<u8>;
    let base: &[u8] = match &vc.payload {
        CallPayload::Inline(p) => p,
        CallPayload::PositionZero(c) => {
            p0 = c.segments.iter().flat_map(|s| mem.read(s).to_vec()).collect();
            check_payload_xid(xid, &p0).unwrap();
            &p0
        }
    };
    let inserted: Vec<InsertedChunk<'_>> = vc
        .read_chunks
        .iter()
        .zip(&pulled)
        .map(|(c, d)| InsertedChunk {
            position: c.position,
            data: d,
        })
        .collect();
    let mut d = Decoder::with_chunks(base, ChunkSource::Read(&inserted));
    let RpcMessage::Call(ch) = RpcMessage::decode(&mut d).unwrap() else {
        panic!()
    };
    let mut out = Encoder::new(Vec::new());
    ReplyHeader::accepted(ch.xid, AcceptStat::Success)
        .encode(&mut out)
        .unwrap();
    match ch.proc_ {
        1 => {
            assert_eq!(d.get_u32().unwrap(), 0xfeed);
            let data = d.get_opaque_ddp(MAX_DATA).unwrap();
            out.put_u32(data.len() as u32).unwrap();
        }
        2 => {
            let n = d.get_u32().unwrap() as usize;
            out.put_u32(0).unwrap();
            out.put_opaque_ddp(&pattern(n), MAX_DATA).unwrap();
            out.put_u32(0xcafe).unwrap();
        }
        _ => unreachable!(),
    }
    d.finish_exact().unwrap();
    let (rstream, ritems) = out.finish();
    let grant = rs.on_reply(32).unwrap();
    let pr = plan_reply(&th, xid, grant, &rstream, &ritems, vc.lists()).unwrap();
    for w in &pr.item_writes {
        mem.write(w.handle, w.remote_offset, &rstream[w.src.clone()]);
    }
    for w in &pr.payload_writes {
        mem.write(w.handle, w.remote_offset, &pr.payload[w.src.clone()]);
    }
    let mut reply_msg = pr.header.to_vec().unwrap();
    if pr.form == ReplyForm::Short {
        reply_msg.extend_from_slice(&pr.payload);
    }
    assert!(reply_msg.len() <= th.reply as usize, "reply fits its Send");

    // ---- Requester: validate, re-insert, decode
    let RequesterDecision::Process(vr) =
        validate_reply(&reply_msg, &Limits::default(), |x| (x == xid).then_some(&provisioned))
    else {
        panic!("reply dropped")
    };
    rq.on_reply(vr.header.credit).unwrap();
    assert_eq!(rq.granted(), 16);
    let lists = vr.header.body.lists().unwrap();
    let gather = |c: &WriteChunk| -> Vec<u8> { c.segments.iter().flat_map(|s| mem.read(s).to_vec()).collect() };
    let written: Vec<Vec<u8>> = lists.writes.iter().map(gather).collect();
    let returned: Vec<ReturnedWriteChunk<'_>> = lists
        .writes
        .iter()
        .zip(&written)
        .map(|(c, d)| {
            if c.is_empty_chunk() {
                ReturnedWriteChunk::Empty
            } else {
                ReturnedWriteChunk::Data(d)
            }
        })
        .collect();
    let long_payload;
    let payload: &[u8] = match vr.payload {
        Some(p) => p,
        None => {
            long_payload = gather(lists.reply.as_ref().unwrap());
            &long_payload
        }
    };
    let mut d = Decoder::with_chunks(payload, ChunkSource::Write(&returned));
    let RpcMessage::Reply(_) = RpcMessage::decode(&mut d).unwrap() else {
        panic!()
    };
    let result = match proc_ {
        1 => d.get_u32().unwrap().to_be_bytes().to_vec(),
        _ => {
            assert_eq!(d.get_u32().unwrap(), 0);
            let data = d.get_opaque_ddp(MAX_DATA).unwrap().to_vec();
            assert_eq!(d.get_u32().unwrap(), 0xcafe);
            data
        }
    };
    d.finish_exact().unwrap();
    Outcome {
        result,
        call_form,
        reply_form: pr.form,
        used_write_chunk: lists.writes.iter().any(|w| w.total_len() > 0),
    }
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

const SIZES: [usize; 7] = [0, 1, 1023, 1024, 1025, 4096, 1 << 20];

#[test]
fn write_all_sizes_both_thresholds() {
    for th in [
        Thresholds::default(),
        Thresholds {
            call: 4096,
            reply: 4096,
        },
    ] {
        for n in SIZES {
            let o = run(Args::Write(pattern(n)), th, CallOptions::default());
            assert_eq!(o.result, (n as u32).to_be_bytes(), "size {n}");
            // the Call header (28) + RPC header (40) + tag + length word + data
            let short = 28 + 40 + 8 + rpcrdma::xdr::roundup(n).unwrap() <= th.call as usize;
            assert_eq!(o.call_form, if short { "short" } else { "chunked" }, "size {n}");
        }
    }
}

#[test]
fn read_all_sizes_both_thresholds() {
    for th in [
        Thresholds::default(),
        Thresholds {
            call: 4096,
            reply: 4096,
        },
    ] {
        for n in SIZES {
            let o = run(Args::Read(n as u32), th, CallOptions::default());
            assert_eq!(o.result, pattern(n), "size {n}");
            assert_eq!(o.reply_form, ReplyForm::Short);
            let max_reply = 28 + 24 + 8 + rpcrdma::xdr::roundup(n).unwrap() + 4;
            assert_eq!(o.used_write_chunk, max_reply > th.reply as usize && n > 0, "size {n}");
        }
    }
}

/// RPCR-LNG-03 and RPCR-DDP-10: forced Long Calls, and no reduction at all
/// (Long Call + Long Reply through the Reply chunk).
#[test]
fn long_call_and_long_reply() {
    let force = CallOptions {
        force_long: true,
        ..Default::default()
    };
    let o = run(Args::Write(pattern(5)), Thresholds::default(), force);
    assert_eq!(o.call_form, "long");
    let gss = CallOptions {
        no_reduction: true,
        ..Default::default()
    };
    for n in [1025usize, 4093, 1 << 16] {
        let o = run(Args::Write(pattern(n)), Thresholds::default(), gss);
        assert_eq!(o.call_form, "long");
        let o = run(Args::Read(n as u32), Thresholds::default(), gss);
        assert_eq!(o.result, pattern(n));
        assert_eq!(o.reply_form, ReplyForm::Long);
        assert!(!o.used_write_chunk);
    }
}

#[test]
fn toy_args_decode_errors_are_typed() {
    let mut d = Decoder::new(&[0, 0, 0xfe, 0xed, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(d.get_u32().unwrap(), 0xfeed);
    assert!(matches!(d.get_opaque_ddp(MAX_DATA), Err(XdrError::TooLong { .. })));
    let _ = <u32 as XdrDecode>::decode(&mut Decoder::new(&[1, 2, 3, 4])).unwrap();
}
