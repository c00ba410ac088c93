//! Our encoders against an independent decoder: a pcap of complete iWARP
//! exchanges, built only from `iwarp::wire` (MPA Request/Reply `mpa::Repr`,
//! FPDU `fpdu::Framer`, DDP `ddp::Header` / `ddp::segment_len`,
//! RDMAP `rdmap::Message`, Terminate `terminate::Repr`), decoded by the real
//! `tshark` and compared field by field with what we meant to send.
//!
//! Requirement IDs (catalogue `shared/requirements/rdmap-rpcrdma.md`):
//! RDMAP-HDR-01 (control words of every opcode), RDMAP-HDR-02 (Invalidate
//! STag of Send with Invalidate), RDMAP-HDR-03 (T/STag/TO/QN per opcode on
//! the wire), RDMAP-HDR-04 (RV = 01b), RDMAP-HDR-08 (Read Request header),
//! RDMAP-HDR-09 (Read Response carries SinkSTag/SinkTO), RDMAP-HDR-10 (the
//! four Terminate size classes 22/38/42/70), RDMAP-HDR-12 (Terminate length
//! matches M/D/R), RDMAP-LLP-02 (a multi-segment message: same STag, TO
//! advancing, L only on the last), RDMAP-RD-02 (Read Request QN 1, MSN from
//! 1), RDMAP-SND-01 (Send family QN 0), RDMAP-TRM-01 (Terminate QN 2),
//! RDMAP-STR-01 (after the MPA exchange every octet is an FPDU), and MPA
//! catalogue C.2.2 (Request/Reply frame), C.2.4 (FPDU length and pad), C.2.5
//! (CRC32c, as Wireshark checks it) and C.3 (RFC 6581 IRD/ORD block).
//!
//! Facts about tshark 4.0.17 this test relies on (peers file §5; checked
//! here by running it):
//! * MPA is found by the `iwarp_mpa_tcp` heuristic only when the capture
//!   holds the Request *and* the Reply; every RFC 6581 frame (Rev 2 with the
//!   S bit, which lies in RFC 5044's Res field) raises two warnings, "Res
//!   field is NOT set to zero" and "Rev field is NOT set to one". Nothing
//!   else may appear at warning level or above.
//! * The IRD/ORD words are not dissected: they are the first four octets of
//!   `iwarp_mpa.privatedata`.
//! * A CRC is only checked when the Request or Reply had C set, and a bad CRC
//!   is not an expert item: only the text of `iwarp_mpa.crc_check` says
//!   "Good CRC32" or "Bad CRC32" (so the test reads the text).
//! * The `rpcrdma_iwarp` heuristic throws "Malformed Packet" on Sends shorter
//!   than 16 octets that are not RPC-over-RDMA, so it is disabled.
//! * RFC 7306 in 4.0.17: opcodes 0xA (Atomic Request) and 0xB (Atomic
//!   Response) are decoded with all their fields; the AOpCode values
//!   FetchAdd 0 and CmpSwap 2 agree with ours. Opcodes 0x8 (Immediate Data)
//!   and 0x9 (Immediate Data with SE) are not in its table: the DDP header
//!   and the RDMAP control octet are decoded (opcode shown as a bare number),
//!   the 8 octets of immediate data are left undissected (`data`), and no
//!   expert item or malformed mark is raised (see `immediate`).
//! * The Terminated DDP Header is given 14 octets when the Terminate's EType
//!   value is 1 and 18 otherwise, whatever the layer and the echoed header's
//!   own T bit: right for DDP tagged (1/1/x) and untagged (1/2/x) errors,
//!   wrong for an RDMAP Remote Protection error on a Read Request (0/1/x,
//!   size class 70), where it shows 14 of our 18 octets and starts the
//!   Terminated RDMA Header 4 octets early. Our layout is RFC 5040 §4.8's;
//!   the test asserts tshark's reading (`wireshark_term_ddp_len`).
//! * The segments of a Send are reassembled (pref
//!   `iwarp_ddp_rdmap.reassemble_iwarp_rdma_send`, on by default): only the
//!   last one shows the payload, as the whole message.
//! * Number formats in `-T fields`: STag and TO of the DDP header in hex,
//!   Invalidate STag, Read Request and atomic fields in decimal (atomic
//!   masks in hex), Terminate layer/type/code as `0x0N`; IPv4 and TCP
//!   checksums are verified only with `ip.check_checksum` /
//!   `tcp.check_checksum` set, and then read 1 (good).
//!
//! If `tshark` is not installed the test prints why and returns without
//! checking (`scripts/test.sh` / `.ci/run` install it, so CI always checks).

#[path = "common/pcap.rs"]
mod pcap;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use iwarp::wire::cause::{self, TermCause};
use iwarp::wire::ddp::{Addr, Header};
use iwarp::wire::fpdu::Framer;
use iwarp::wire::mpa::{self, EnhancedData, FrameKind, RtrSet};
use iwarp::wire::rdmap::{AtomicOp, AtomicRequest, AtomicResponse, Message, Opcode, Queue, ReadRequest};
use iwarp::wire::terminate::{self, Offending};
use pcap::{Conversation, Dir, Endpoint, Pcap};

/// What tshark must show for one FPDU or MPA frame: `(field, value)` in the
/// `-T fields` text form.
#[derive(Debug, Clone, Default)]
struct Expect(Vec<(&'static str, String)>);

impl Expect {
    fn f(mut self, field: &'static str, value: impl ToString) -> Self {
        self.0.push((field, value.to_string()));
        self
    }
}

fn hex8(v: u32) -> String {
    format!("{v:#010x}")
}
fn hex16(v: u64) -> String {
    format!("{v:#018x}")
}
fn hexbytes(b: &[u8]) -> String {
    hex::encode(b)
}
fn bit(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

/// DDP + RDMAP control fields of one segment header (RDMAP-HDR-01/03/04):
/// DV = 1 and RV = 1 always (literal values, not our constants).
fn expect_header(h: &Header) -> Expect {
    let op = h.rdmap_ctrl & 0x0f;
    let e = Expect::default()
        .f("iwarp_ddp.tagged_flag", bit(h.is_tagged()))
        .f("iwarp_ddp.last_flag", bit(h.last))
        .f("iwarp_ddp.dv", 1)
        .f("iwarp_rdma.version", 1)
        .f("iwarp_rdma.opcode", format!("{op:#04x}"));
    match h.addr {
        Addr::Tagged { stag, to } => e
            .f("iwarp_ddp.stag", hex8(stag))
            .f("iwarp_ddp.tagged_offset", hex16(to)),
        Addr::Untagged { qn, msn, mo, inv_stag } => {
            let e = e.f("iwarp_ddp.qn", qn).f("iwarp_ddp.msn", msn).f("iwarp_ddp.mo", mo);
            if matches!(Opcode::from(op), Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                // BASE_DEC in Wireshark: printed in decimal.
                e.f("iwarp_rdma.inval_stag", inv_stag)
            } else {
                e
            }
        }
    }
}

/// The whole pcap under construction and what each frame must decode to.
struct Capture {
    pcap: Pcap,
    /// frame number -> expectations of the FPDUs / MPA frame it carries, in order.
    frames: BTreeMap<usize, Vec<Expect>>,
    /// Frames carrying an MPA Request or Reply of revision 2 with S set.
    mpa_v2_frames: usize,
    /// FPDUs sent with a CRC (each must read "Good CRC32").
    crc_fpdus: usize,
    /// FPDUs in the capture.
    fpdus: usize,
    /// Client port of the next connection.
    next_port: u16,
}

/// One MPA/TCP connection: client = MPA Initiator, server = Responder.
struct Conn {
    conv: Conversation,
    /// Transmit framers: [client, server].
    framers: [Framer; 2],
    crc: bool,
}

fn side(dir: Dir) -> usize {
    match dir {
        Dir::C2S => 0,
        Dir::S2C => 1,
    }
}

impl Capture {
    fn new() -> Capture {
        Capture {
            pcap: Pcap::new(),
            frames: BTreeMap::new(),
            mpa_v2_frames: 0,
            crc_fpdus: 0,
            fpdus: 0,
            next_port: 40_000,
        }
    }

    /// TCP handshake, MPA v2 Request and Reply with IRD/ORD (C.2.2, C.3), CRC
    /// requested by the initiator when `crc`.
    fn connect(&mut self, crc: bool, req_pd: &[u8], rep_pd: &[u8]) -> Conn {
        let port = self.next_port;
        self.next_port += 1;
        let client = Endpoint {
            mac: [0x02, 0, 0, 0, 0, 0x01],
            ip: Ipv4Addr::new(192, 0, 2, 1),
            port,
        };
        let server = Endpoint {
            mac: [0x02, 0, 0, 0, 0, 0x02],
            ip: Ipv4Addr::new(192, 0, 2, 2),
            port: 7174,
        };
        let isn = 0x1000_0000u32.wrapping_mul(u32::from(port % 7) + 1);
        let conv = Conversation::open(&mut self.pcap, client, server, isn, !isn);
        let mut conn = Conn {
            conv,
            framers: [Framer::new(crc, false), Framer::new(crc, false)],
            crc,
        };
        let req = mpa::Repr {
            crc,
            ..mpa::Repr::enhanced(
                FrameKind::Request,
                EnhancedData {
                    ird: 16,
                    ord: 8,
                    p2p: false,
                    rtr: RtrSet::EMPTY,
                },
                req_pd,
            )
        };
        // The responder echoes C (CRC is used if either side asks, RFC 5044 §7.1.2).
        let rep = mpa::Repr {
            crc,
            ..mpa::Repr::enhanced(
                FrameKind::Reply,
                EnhancedData {
                    ird: 8,
                    ord: 16,
                    p2p: false,
                    rtr: RtrSet::EMPTY,
                },
                rep_pd,
            )
        };
        for (dir, r, key_field, ird_ord) in [
            (Dir::C2S, req, "iwarp_mpa.key.req", [0x00, 0x10, 0x00, 0x08]),
            (Dir::S2C, rep, "iwarp_mpa.key.rep", [0x00, 0x08, 0x00, 0x10]),
        ] {
            let mut bytes = Vec::new();
            r.emit_vec(&mut bytes).unwrap();
            let mut pd = ird_ord.to_vec();
            pd.extend_from_slice(r.private_data);
            let key = match r.kind {
                FrameKind::Request => mpa::KEY_REQUEST,
                FrameKind::Reply => mpa::KEY_REPLY,
            };
            let e = Expect::default()
                .f(key_field, hexbytes(&key))
                .f("iwarp_mpa.marker_flag", "0")
                .f("iwarp_mpa.crc_flag", bit(crc))
                .f("iwarp_mpa.rej_flag", "0")
                .f("iwarp_mpa.rev", 2)
                .f("iwarp_mpa.pdlength", pd.len())
                .f("iwarp_mpa.privatedata", hexbytes(&pd));
            conn.conv.send(&mut self.pcap, dir, &bytes);
            self.frames.insert(self.pcap.frames(), vec![e]);
            self.mpa_v2_frames += 1;
        }
        conn
    }

    /// Sends the ULPDUs as FPDUs, all in one TCP segment, in direction `dir`.
    fn send(&mut self, conn: &mut Conn, dir: Dir, ulpdus: Vec<(Vec<u8>, Expect)>) {
        let mut seg = Vec::new();
        let mut exp = Vec::new();
        for (ulpdu, e) in ulpdus {
            let pad = iwarp::wire::fpdu::pad_len(ulpdu.len());
            conn.framers[side(dir)].emit_vec(&ulpdu, &mut seg).unwrap();
            let mut e = e.f("iwarp_mpa.ulpdulength", ulpdu.len());
            if pad > 0 {
                e = e.f("iwarp_mpa.pad", "00".repeat(pad));
            }
            if !conn.crc {
                // C.2.3: without CRC the field is sent as zero.
                e = e.f("iwarp_mpa.crc", hex8(0));
            } else {
                self.crc_fpdus += 1;
            }
            self.fpdus += 1;
            exp.push(e);
        }
        conn.conv.send(&mut self.pcap, dir, &seg);
        self.frames.insert(self.pcap.frames(), exp);
    }

    fn close(&mut self, conn: &mut Conn) {
        conn.conv.close(&mut self.pcap);
    }
}

/// Opcode number, T flag and QN of each message, written out from catalogue
/// A.1.3 (RFC 5040 Fig. 4) and RFC 7306 §4.1 / §10.2 instead of taken from
/// `rdmap::Opcode`, so that a wrong table in the crate cannot agree with itself.
fn catalogue(m: &Message) -> (u8, Option<u32>) {
    match m {
        Message::Write { .. } => (0x0, None),
        Message::ReadRequest(_) => (0x1, Some(1)),
        Message::ReadResponse { .. } => (0x2, None),
        Message::Send {
            se: false,
            invalidate: None,
            ..
        } => (0x3, Some(0)),
        Message::Send {
            se: false,
            invalidate: Some(_),
            ..
        } => (0x4, Some(0)),
        Message::Send {
            se: true,
            invalidate: None,
            ..
        } => (0x5, Some(0)),
        Message::Send {
            se: true,
            invalidate: Some(_),
            ..
        } => (0x6, Some(0)),
        Message::Terminate(_) => (0x7, Some(2)),
        Message::ImmediateData { se: false, .. } => (0x8, Some(0)),
        Message::ImmediateData { se: true, .. } => (0x9, Some(0)),
        Message::AtomicRequest(_) => (0xa, Some(1)),
        Message::AtomicResponse(_) => (0xb, Some(3)),
    }
}

/// One whole-message ULPDU (L = 1) and its expectations.
fn whole(m: &Message, msn: u32) -> (Vec<u8>, Expect) {
    let mut v = vec![0; m.buffer_len()];
    assert_eq!(m.emit(&mut v, msn).unwrap(), v.len());
    let (op, qn) = catalogue(m);
    let addr = match (*m, qn) {
        (Message::Write { stag, to, .. } | Message::ReadResponse { stag, to, .. }, None) => Addr::Tagged { stag, to },
        (_, Some(qn)) => Addr::Untagged {
            qn,
            msn,
            mo: 0,
            inv_stag: match *m {
                Message::Send {
                    invalidate: Some(s), ..
                } => s,
                _ => 0,
            },
        },
        _ => unreachable!("tagged messages are Write and Read Response"),
    };
    let mut e = expect_header(&Header {
        last: true,
        rdmap_ctrl: 0x40 | op,
        addr,
    });
    if !m.payload().is_empty() {
        e = e.f("data.len", m.payload().len());
    }
    e = match m {
        Message::ReadRequest(rr) => read_request_fields(e, rr),
        Message::Terminate(t) => terminate_fields(e, t),
        Message::AtomicRequest(a) => atomic_request_fields(e, a),
        Message::AtomicResponse(a) => atomic_response_fields(e, a),
        _ => e,
    };
    (v, e)
}

/// A message cut into segments of at most `mulpdu` ULPDU octets (RDMAP-LLP-02).
fn segmented(first: Header, payload: &[u8], mulpdu: usize) -> Vec<(Vec<u8>, Expect)> {
    let room = mulpdu - first.header_len();
    let (mut off, mut segs) = (0, Vec::new());
    loop {
        let (n, last) = iwarp::wire::ddp::segment_len(payload.len(), off, room);
        segs.push((first.at_offset(off, last), off..off + n));
        off += n;
        if last {
            break;
        }
    }
    assert!(segs.len() >= 2, "the test wants a multi-segment message");
    // Tagged segments show their own payload; tshark reassembles the
    // segments of a Send (pref `iwarp_ddp_rdmap.reassemble_iwarp_rdma_send`,
    // on by default) and shows the whole message as data in the last one.
    let reassembled = !first.is_tagged();
    segs.into_iter()
        .map(|(h, r)| {
            let mut v = vec![0; h.header_len() + r.len()];
            let n = h.emit(&mut v).unwrap();
            v[n..].copy_from_slice(&payload[r.clone()]);
            let e = expect_header(&h);
            let e = match (reassembled, h.last) {
                (false, _) => e.f("data.len", r.len()),
                (true, true) => e.f("data.len", payload.len()),
                (true, false) => e,
            };
            (v, e)
        })
        .collect()
}

fn read_request_fields(e: Expect, rr: &ReadRequest) -> Expect {
    e.f("iwarp_rdma.sinkstag", hex8(rr.sink_stag))
        .f("iwarp_rdma.sinkto", hex16(rr.sink_to))
        .f("iwarp_rdma.rdmardsz", rr.size)
        .f("iwarp_rdma.srcstag", hex8(rr.src_stag))
        .f("iwarp_rdma.srcto", hex16(rr.src_to))
}

/// Length tshark 4.0.17 gives the Terminated DDP Header: it goes by the
/// Terminate's EType *value* (1 -> 14 octets, anything else -> 18) whatever
/// the layer and whatever the T bit of the echoed header says. RFC 5040 §4.8
/// makes it 14 or 18 by that T bit, which is what we send. The two agree for
/// DDP Tagged (1/1/x, class 38) and DDP Untagged (1/2/x, class 42) errors,
/// but not for an RDMAP Remote Protection error (EType 1) on a Read Request
/// (class 70): tshark then shows the first 14 octets of our 18-octet
/// untagged header and starts the Terminated RDMA Header 4 octets early.
/// The test asserts that reading exactly, computed from the octets we sent.
const fn wireshark_term_ddp_len(etype: u8) -> usize {
    if etype == 1 { 14 } else { 18 }
}

fn terminate_fields(e: Expect, t: &terminate::Repr) -> Expect {
    let c = t.control();
    let local_catastrophic = t.cause.etype == 0 && !matches!(t.cause.layer, cause::Layer::Llp);
    let (etype_f, code_f) = match t.cause.layer {
        cause::Layer::Rdmap => ("iwarp_rdma.term_etype_rdma", "iwarp_rdma.term_errcode_rdma"),
        cause::Layer::Ddp if t.cause.etype == cause::etype::DDP_TAGGED => {
            ("iwarp_rdma.term_etype_ddp", "iwarp_rdma.term_errcode_ddp_tagged")
        }
        cause::Layer::Ddp => ("iwarp_rdma.term_etype_ddp", "iwarp_rdma.term_errcode_ddp_untagged"),
        _ => ("iwarp_rdma.term_etype_llp", "iwarp_rdma.term_errcode_llp"),
    };
    // Local Catastrophic errors have no code table: tshark uses the generic field.
    let code_f = if local_catastrophic {
        "iwarp_rdma.term_errcode"
    } else {
        code_f
    };
    let mut e = e
        .f("iwarp_rdma.term_layer", format!("{:#04x}", t.cause.layer.to_nibble()))
        .f(etype_f, format!("{:#04x}", t.cause.etype))
        .f(code_f, format!("{:#04x}", t.cause.code))
        .f("iwarp_rdma.term_hdrct_m", bit(c.m))
        .f("iwarp_rdma.hdrct_d", bit(c.d))
        .f("iwarp_rdma.hdrct_r", bit(c.r));
    // The Terminate header octets we emit (RFC layout, RDMAP-HDR-12).
    let mut hdr = vec![0; t.buffer_len()];
    t.emit(&mut hdr).unwrap();
    if let Some(d) = t.ddp {
        // Our own layout first: length, then the echoed header by its T bit.
        assert_eq!(&hdr[4..6], &d.seg_len.to_be_bytes());
        assert_eq!(&hdr[6..6 + d.header.len()], d.header.as_bytes());
        let l = wireshark_term_ddp_len(t.cause.etype);
        e = e
            .f("iwarp_rdma.term_ddp_seg_len", hexbytes(&d.seg_len.to_be_bytes()))
            .f("iwarp_rdma.term_ddp_h", hexbytes(&hdr[6..6 + l]));
        if t.rdma.is_some() {
            e = e.f("iwarp_rdma.term_rdma_h", hexbytes(&hdr[6 + l..6 + l + 28]));
        }
    }
    e
}

fn atomic_request_fields(e: Expect, a: &AtomicRequest) -> Expect {
    // tshark prints identifiers, STag, TO and data in decimal, masks in hex,
    // and shows Compare Data/Mask for FetchAdd too (zero, as we send them).
    let e = e
        .f("iwarp_rdma.atomic.opcode", u8::from(a.op))
        .f("iwarp_rdma.atomic.request_identifier", a.request_id)
        .f("iwarp_rdma.atomic.remote_stag", a.remote_stag)
        .f("iwarp_rdma.atomic.remote_tagged_offset", a.remote_to);
    let e = match a.op {
        AtomicOp::FetchAdd => e
            .f("iwarp_rdma.atomic.add_data", a.add_swap_data)
            .f("iwarp_rdma.atomic.add_mask", hex16(a.add_swap_mask)),
        _ => e
            .f("iwarp_rdma.atomic.swap_data", a.add_swap_data)
            .f("iwarp_rdma.atomic.swap_mask", hex16(a.add_swap_mask)),
    };
    e.f("iwarp_rdma.atomic.compare_data", a.compare_data)
        .f("iwarp_rdma.atomic.compare_mask", hex16(a.compare_mask))
}

fn atomic_response_fields(e: Expect, a: &AtomicResponse) -> Expect {
    e.f("iwarp_rdma.atomic.original_request_identifier", a.orig_request_id)
        .f("iwarp_rdma.atomic.original_remote_data_value", a.orig_value)
}

/// RFC 7306 Immediate Data (opcodes 0x8, 0x9) as tshark 4.0.17 shows it:
/// the DDP header and the RDMAP control octet ("OpCode: Unknown (0x8)"),
/// nothing for the 8 octets of immediate data (not even `data`), and no
/// expert item. `whole` already expects exactly that.
fn immediate(se: bool, data: u64, msn: u32) -> (Vec<u8>, Expect) {
    whole(&Message::ImmediateData { se, data }, msn)
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The whole scripted capture: one long connection with every opcode, and
/// three short ones, one per remaining Terminate size class.
fn build() -> Capture {
    let mut cap = Capture::new();

    // --- Connection 1: CRC on, every opcode ------------------------------
    let mut c = cap.connect(true, b"softrdma tshark test", b"welcome");
    let mulpdu = 14 + 400; // small MULPDU so that messages need several FPDUs
    let mut send_msn = 1; // RDMAP-SND-01, C.1.3: MSN starts at 1 per queue
    let mut rreq_msn = 1;

    // RDMA Write, 37 octets (3 octets of pad).
    let w1 = payload(37, 1);
    let write1 = Message::Write {
        stag: 0x0a0b_0c01,
        to: 0x7f00_1234_5000,
        payload: &w1,
    };
    cap.send(&mut c, Dir::C2S, vec![whole(&write1, 0)]);

    // Multi-segment RDMA Write (RDMAP-LLP-02): 1000 octets in 400/400/200.
    let w2 = payload(1000, 2);
    let first = Header {
        last: false,
        rdmap_ctrl: Opcode::Write.control(),
        addr: Addr::Tagged {
            stag: 0x0a0b_0c02,
            to: 0x1000,
        },
    };
    for s in segmented(first, &w2, mulpdu) {
        cap.send(&mut c, Dir::C2S, vec![s]);
    }

    // RDMA Read Request (RDMAP-HDR-08, RDMAP-RD-02) and a two-segment
    // Read Response to SinkSTag/SinkTO (RDMAP-HDR-09, RDMAP-RD-13).
    let rr = ReadRequest {
        sink_stag: 0x1122_3301,
        sink_to: 0x2000,
        size: 700,
        src_stag: 0x4455_6601,
        src_to: 0xffff_0000_9000,
    };
    let (v, e) = whole(&Message::ReadRequest(rr), rreq_msn);
    rreq_msn += 1;
    cap.send(&mut c, Dir::C2S, vec![(v, e)]);
    let resp = payload(rr.size as usize, 3);
    let first = Header {
        last: false,
        rdmap_ctrl: Opcode::ReadResponse.control(),
        addr: Addr::Tagged {
            stag: rr.sink_stag,
            to: rr.sink_to,
        },
    };
    for s in segmented(first, &resp, mulpdu) {
        cap.send(&mut c, Dir::S2C, vec![s]);
    }

    // The Send family (RDMAP-SND-01, RDMAP-HDR-02).
    let sends: [(bool, Option<u32>, usize); 4] = [
        (false, None, 64),
        (false, Some(0xcafe_0001), 20),
        (true, None, 17),
        (true, Some(0xcafe_0002), 33),
    ];
    for (i, (se, invalidate, len)) in sends.into_iter().enumerate() {
        let p = payload(len, 10 + i as u8);
        let m = Message::Send {
            se,
            invalidate,
            payload: &p,
        };
        cap.send(&mut c, Dir::C2S, vec![whole(&m, send_msn)]);
        send_msn += 1;
    }

    // A three-segment Send: same MSN, MO 0/400/800, L on the last only.
    let s = payload(900, 20);
    let first = Header {
        last: false,
        rdmap_ctrl: Opcode::Send.control(),
        addr: Addr::Untagged {
            qn: Queue::Send.qn(),
            msn: send_msn,
            mo: 0,
            inv_stag: 0,
        },
    };
    send_msn += 1;
    for s in segmented(first, &s, 18 + 400) {
        cap.send(&mut c, Dir::C2S, vec![s]);
    }

    // RFC 7306 atomics, as the engine builds them: FetchAdd (mask 0,
    // compare 0/0) and CmpSwap (all-ones masks); responses on QN 3.
    let fa = AtomicRequest {
        op: AtomicOp::FetchAdd,
        request_id: 1,
        remote_stag: 0x7700_0001,
        remote_to: 0x8000,
        add_swap_data: 5,
        add_swap_mask: 0,
        compare_data: 0,
        compare_mask: 0,
    };
    let cs = AtomicRequest {
        op: AtomicOp::CmpSwap,
        request_id: 2,
        remote_stag: 0x7700_0001,
        remote_to: 0x8000,
        add_swap_data: 99,
        add_swap_mask: u64::MAX,
        compare_data: 15,
        compare_mask: u64::MAX,
    };
    // Atomic Responses: QN 3, their own MSN sequence from 1.
    for (aresp_msn, (a, orig)) in (1u32..).zip([(fa, 10u64), (cs, 15u64)]) {
        let (v, e) = whole(&Message::AtomicRequest(a), rreq_msn);
        rreq_msn += 1;
        cap.send(&mut c, Dir::C2S, vec![(v, e)]);
        let r = AtomicResponse {
            orig_request_id: a.request_id,
            orig_value: orig,
        };
        let (v, e) = whole(&Message::AtomicResponse(r), aresp_msn);
        cap.send(&mut c, Dir::S2C, vec![(v, e)]);
    }

    // RFC 7306 Immediate Data and Immediate Data with SE (the engine puts a
    // 32-bit verbs immediate into the low half of the 8 octets).
    cap.send(&mut c, Dir::C2S, vec![immediate(false, 0xfeed, send_msn)]);
    send_msn += 1;
    cap.send(&mut c, Dir::C2S, vec![immediate(true, 0xbeef, send_msn)]);
    send_msn += 1;

    // Write with immediate as the engine sends it: an RDMA Write followed by
    // an Immediate Data message; here both FPDUs share one TCP segment.
    let w3 = payload(3, 30);
    let write3 = Message::Write {
        stag: 0x0a0b_0c03,
        to: 0x300,
        payload: &w3,
    };
    cap.send(
        &mut c,
        Dir::C2S,
        vec![whole(&write3, 0), immediate(false, 0x1234, send_msn)],
    );

    // Terminate, size class 38 (RDMAP-HDR-10): DDP tagged "invalid STag"
    // for the first Write, echoing its DDP header (M, D; Fig. 10).
    let mut offending = vec![0; write1.buffer_len()];
    write1.emit(&mut offending, 0).unwrap();
    terminate_case(
        &mut cap,
        &mut c,
        cause::DDP_ERR_T_INVALID_STAG,
        &offending,
        None,
        terminate::ULPDU_LEN_TAGGED,
    );
    cap.close(&mut c);

    // --- Connection 2: CRC off (Linux siw's default), class 22 -------------
    let mut c = cap.connect(false, b"", b"");
    let hello = payload(24, 40);
    cap.send(
        &mut c,
        Dir::C2S,
        vec![whole(
            &Message::Send {
                se: false,
                invalidate: None,
                payload: &hello,
            },
            1,
        )],
    );
    terminate_case(
        &mut cap,
        &mut c,
        cause::RDMAP_LOCAL_CATASTROPHIC_ERR,
        &[],
        None,
        terminate::ULPDU_LEN_PLAIN,
    );
    cap.close(&mut c);

    // --- Connection 3: class 42, a Send with no receive posted (row 1) -----
    let mut c = cap.connect(true, b"c3", b"");
    let p = payload(40, 50);
    let send = Message::Send {
        se: true,
        invalidate: None,
        payload: &p,
    };
    let (v, e) = whole(&send, 1);
    cap.send(&mut c, Dir::C2S, vec![(v.clone(), e)]);
    terminate_case(
        &mut cap,
        &mut c,
        cause::DDP_ERR_U_NO_BUFFER,
        &v,
        None,
        terminate::ULPDU_LEN_UNTAGGED,
    );
    cap.close(&mut c);

    // --- Connection 4: class 70, Read Request with an invalid SrcSTag (row 13)
    let mut c = cap.connect(true, b"c4", b"");
    let rr = ReadRequest {
        sink_stag: 0x0102_0304,
        sink_to: 0x10,
        size: 8192,
        src_stag: 0xdead_be00,
        src_to: 0x4000,
    };
    let (v, e) = whole(&Message::ReadRequest(rr), 1);
    cap.send(&mut c, Dir::C2S, vec![(v.clone(), e)]);
    terminate_case(
        &mut cap,
        &mut c,
        cause::RDMAP_ERR_INVALID_STAG,
        &v,
        Some(&rr),
        terminate::ULPDU_LEN_READ_REQUEST,
    );
    cap.close(&mut c);
    cap
}

/// The responder's Terminate (QN 2, MSN 1, RDMAP-TRM-01) for `cause` about
/// the `offending` ULPDU, of ULPDU size `class` (RDMAP-HDR-10/12).
fn terminate_case(
    cap: &mut Capture,
    c: &mut Conn,
    cause: TermCause,
    offending: &[u8],
    rreq: Option<&ReadRequest>,
    class: usize,
) {
    let t = terminate::Repr::for_error(cause, Offending::from_ulpdu(offending), rreq);
    assert_eq!(t.ulpdu_len(), class, "{t}");
    let m = Message::Terminate(t);
    let (v, e) = whole(&m, 1);
    assert_eq!(v.len(), class);
    cap.send(c, Dir::S2C, vec![(v, e)]);
}

/// Every field any expectation names, plus the always-checked ones.
fn field_list(cap: &Capture) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for e in cap.frames.values().flatten() {
        for (f, _) in &e.0 {
            if !v.contains(f) {
                v.push(f);
            }
        }
    }
    v
}

/// Says loudly that a test did not check anything. Written straight to the
/// process's stderr: libtest captures `eprintln!`, which would hide it.
fn skip(test: &str) {
    use std::io::Write;
    let line =
        format!("\nSKIPPED {test}: `tshark` is not installed (apt-get install -y tshark); nothing was checked\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn tshark(pcap: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args(["-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE"])
        .args(["--disable-heuristic", "rpcrdma_iwarp"])
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

fn write_pcap(name: &str, bytes: &[u8]) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new(name);
    let path = dir.0.join(format!("{name}.pcap"));
    std::fs::write(&path, bytes).unwrap();
    // A copy for humans, next to the build output (best effort).
    if let Some(target) = option_env!("CARGO_TARGET_TMPDIR") {
        let _ = std::fs::write(Path::new(target).join(format!("{name}.pcap")), bytes);
    }
    (dir, path)
}

mod tempdir {
    /// A directory under the system temp dir, removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(name: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("softrdma-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn tshark_decodes_every_message_we_emit() {
    if !tshark_available() {
        skip("tshark_decodes_every_message_we_emit");
        return;
    }
    let cap = build();
    let fields = field_list(&cap);
    let frames = cap.frames.clone();
    let (mpa_v2, crc_fpdus, fpdus, nframes) = (cap.mpa_v2_frames, cap.crc_fpdus, cap.fpdus, cap.pcap.frames());
    let (_dir, path) = write_pcap("iwarp-exchange", &cap.pcap.into_bytes());
    // KEEP_PCAP=/some/file.pcap keeps a copy where you want it.
    if let Ok(keep) = std::env::var("KEEP_PCAP") {
        std::fs::copy(&path, keep).unwrap();
    }

    // 1. Every frame that carries MPA decodes as MPA, every FPDU as
    //    DDP/RDMAP, and nothing is malformed or fails the TCP/IP checksums.
    let mut args = vec![
        "-T",
        "fields",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
        "-E",
        "separator=/t",
        "-e",
        "frame.number",
        "-e",
        "frame.protocols",
        "-e",
        "_ws.malformed",
        "-e",
        "tcp.checksum.status",
        "-e",
        "ip.checksum.status",
    ];
    for f in &fields {
        args.push("-e");
        args.push(f);
    }
    let out = tshark(&path, &args);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), nframes, "one output line per frame:\n{out}");
    let mut report = String::new();
    for row in &rows {
        let n: usize = row[0].parse().unwrap();
        let protocols = row[1];
        assert_eq!(row[2], "", "frame {n} malformed: {protocols}");
        assert_eq!(
            row[3], "1",
            "frame {n}: TCP checksum status (1 = good, 0 = bad, 2 = unverified)"
        );
        assert_eq!(row[4], "1", "frame {n}: IPv4 checksum status (1 = good)");
        let Some(exp) = frames.get(&n) else {
            assert!(
                !protocols.contains("iwarp"),
                "frame {n} without payload decoded as {protocols}"
            );
            continue;
        };
        let is_mpa_frame = exp
            .iter()
            .any(|e| e.0.iter().any(|(f, _)| f.starts_with("iwarp_mpa.key")));
        let want_protocols = if is_mpa_frame {
            "eth:ethertype:ip:tcp:iwarp_mpa"
        } else {
            "eth:ethertype:ip:tcp:iwarp_mpa:iwarp_ddp_rdmap"
        };
        assert!(
            protocols.starts_with(want_protocols),
            "frame {n}: {protocols}, want {want_protocols}"
        );
        for (i, f) in fields.iter().enumerate() {
            let want: Vec<&str> = exp
                .iter()
                .flat_map(|e| e.0.iter().filter(|(g, _)| g == f).map(|(_, v)| v.as_str()))
                .collect();
            let want = want.join(",");
            let got = row.get(5 + i).copied().unwrap_or("");
            if want != got {
                let _ = writeln!(report, "frame {n} {f}: tshark {got:?}, we sent {want:?}");
            }
        }
    }
    assert!(report.is_empty(), "field mismatches:\n{report}\nfull output:\n{out}");

    // 2. CRC: Wireshark recomputes it and calls each one good (C.2.5).
    let verbose = tshark(&path, &["-V"]);
    assert_eq!(verbose.matches("Bad CRC32").count(), 0, "{verbose}");
    assert_eq!(
        verbose.matches("Good CRC32").count(),
        crc_fpdus,
        "one per FPDU with CRC"
    );
    assert!(
        crc_fpdus > 0 && crc_fpdus < fpdus,
        "both CRC on and off are in the capture"
    );

    // 3. Expert info: only the two RFC 6581 warnings, once per MPA frame.
    let expert = tshark(&path, &["-q", "-z", "expert,warn"]);
    assert_expert_only_mpa_v2(&expert, mpa_v2);
}

/// `-z expert,warn` lists exactly the two known MPA v2 warnings (peers file
/// §5.3 item 1), each `frames` times, and nothing else at warning or above.
fn assert_expert_only_mpa_v2(expert: &str, frames: usize) {
    let mut known = 0;
    for line in expert.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('=') || l.starts_with("Frequency") || l.starts_with("Warns (") {
            continue;
        }
        let ok = [
            "Res field is NOT set to zero as required by RFC 5044",
            "Rev field is NOT set to one as required by RFC 5044",
        ]
        .iter()
        .any(|m| l.ends_with(m));
        assert!(ok, "unexpected expert item: {l:?}\n{expert}");
        let freq: usize = l.split_whitespace().next().unwrap().parse().unwrap();
        assert_eq!(freq, frames, "{l}");
        assert!(l.contains("IWARP_MPA"), "{l}");
        known += 1;
    }
    assert_eq!(known, 2, "both MPA v2 warnings present:\n{expert}");
    assert!(expert.contains(&format!("Warns ({})", 2 * frames)), "{expert}");
}

/// The gate can fail: one corrupted CRC is reported as "Bad CRC32", and a
/// truncated FPDU length makes the capture malformed / flagged.
#[test]
fn tshark_gate_catches_a_bad_crc() {
    if !tshark_available() {
        skip("tshark_gate_catches_a_bad_crc");
        return;
    }
    let mut cap = Capture::new();
    let mut c = cap.connect(true, b"", b"");
    let p = payload(32, 7);
    let m = Message::Send {
        se: false,
        invalidate: None,
        payload: &p,
    };
    let (v, _) = whole(&m, 1);
    let mut fpdu = Vec::new();
    c.framers[0].emit_vec(&v, &mut fpdu).unwrap();
    let last = fpdu.len() - 1;
    fpdu[last] ^= 0x5a;
    c.conv.send(&mut cap.pcap, Dir::C2S, &fpdu);
    cap.close(&mut c);
    let (_dir, path) = write_pcap("iwarp-bad-crc", &cap.pcap.into_bytes());
    let verbose = tshark(&path, &["-V"]);
    assert_eq!(verbose.matches("Bad CRC32").count(), 1, "{verbose}");
    assert_eq!(verbose.matches("Good CRC32").count(), 0, "{verbose}");
}
