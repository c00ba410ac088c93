//! Fuzzes the IB CM state machine the RoCE provider runs (`roce::cm::machine::Cm`): two
//! CMs back to back (A connects, B listens) driven by an arbitrary script of operations:
//! deliver or drop or duplicate the next MAD either side sends, inject arbitrary octets as a
//! MAD (raw, or with a valid CM header and attribute), advance the clock and run the timers,
//! and every application command (connect, accept, reject, mra, rtu, disconnect,
//! notify_established) on arbitrary IDs, and SIDR (sidr_request to a listened or unknown
//! service ID, sidr_reply with any status, sidr_cancel). Checks: nothing panics; every MAD a CM sends emits
//! and parses back to the same octets; after `handle_timeout(now)` no timer is due at `now`; the
//! number of connections stays bounded by what was created; SIDR state stays within its
//! bounds (pending requests ≤ those made, received ones ≤ the machine's caps).
#![no_main]
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use roce::cm::mad::{MAD_LEN, Mad};
use roce::cm::machine::{MAX_SIDR_ANSWERED, MAX_SIDR_PENDING};
use roce::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmId, ConnectParams, RejReason, SidrId, SidrStatus};
use verbs::{Gid, Mtu};

const SID: u64 = 0x0106_1c06;
const UDP_SID: u64 = 0x0111_1c06;
/// IPoIB connected mode's service ID form (`0x10…|UD QPN`, RFC 4755 §3.5).
const IPOIB_SID: u64 = 0x1000_0000_0040_0001;

fn gid(last: u8) -> Gid {
    Gid::from_ipv4(std::net::Ipv4Addr::new(10, 0, 0, last))
}

fn config(guid: u64, g: Gid, seed: u64) -> CmConfig {
    let mut c = CmConfig::new(guid, g, seed);
    c.cm_response_timeout = 8;
    c.packet_life_time = 4;
    c.max_cm_retries = 3;
    c.mra_service_timeout = 10;
    c.time_wait = Duration::from_millis(5);
    c
}

struct Side {
    cm: Cm,
    gid: Gid,
    out: Vec<Mad>,
    ids: Vec<CmId>,
    sidr: Vec<SidrId>,
}

impl Side {
    fn drain(&mut self) {
        while let Some((_, mad)) = self.cm.poll_transmit() {
            let bytes = mad.emit().expect("the CM sends only MADs that emit");
            // Parsed, the private data is the whole zero-padded area: compare octets.
            let again = Mad::parse(&bytes).expect("and parse");
            assert_eq!(again.emit().unwrap(), bytes);
            assert_eq!(again.hdr, mad.hdr);
            self.out.push(mad);
        }
        while let Some(e) = self.cm.poll_event() {
            let id = match e {
                CmEvent::SidrRequest(r) => {
                    self.sidr.push(r.id);
                    continue;
                }
                CmEvent::SidrReply { .. } | CmEvent::SidrTimedOut { .. } => continue,
                CmEvent::ConnectRequest(r) => r.id,
                CmEvent::ConnectReply { id, .. }
                | CmEvent::Established { id, .. }
                | CmEvent::Rejected { id, .. }
                | CmEvent::TimedOut { id }
                | CmEvent::Disconnected { id, .. }
                | CmEvent::TimeWaitExit { id } => id,
            };
            if !self.ids.contains(&id) {
                self.ids.push(id);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let seed = data.first().copied().unwrap_or(0) as u64;
    let mut now = Instant::now();
    let mut s = [
        Side {
            cm: Cm::new(config(0xa, gid(1), seed)),
            gid: gid(1),
            out: vec![],
            ids: vec![],
            sidr: vec![],
        },
        Side {
            cm: Cm::new(config(0xb, gid(2), seed ^ 1)),
            gid: gid(2),
            out: vec![],
            ids: vec![],
            sidr: vec![],
        },
    ];
    s[1].cm.listen(SID).unwrap();
    s[1].cm.listen(UDP_SID).unwrap();
    // A raw IB service (IPoIB-CM, issue 16): no rdma_cm header in its REQs.
    s[1].cm.listen(IPOIB_SID).unwrap();
    let mut sidr_made = 0usize;
    let mut created = 0usize;
    let mut i = 1;
    while i + 1 < data.len() && i < 4096 {
        let (op, arg) = (data[i], data[i + 1]);
        i += 2;
        let who = usize::from(op & 1);
        let other = 1 - who;
        let pick = |ids: &Vec<CmId>| {
            if ids.is_empty() {
                CmId(u32::from(arg))
            } else {
                ids[usize::from(arg) % ids.len()]
            }
        };
        match (op >> 1) % 15 {
            // Deliver (or with arg bits: drop, duplicate) the oldest MAD `who` sent.
            0 => {
                if !s[who].out.is_empty() {
                    let mad = s[who].out.remove(0);
                    let bytes = mad.emit().unwrap();
                    let copies = [1, 0, 2, 1][usize::from(arg & 3)];
                    let from = s[who].gid;
                    for _ in 0..copies {
                        let _ = s[other].cm.handle_mad(now, &bytes, from);
                    }
                }
            }
            // Arbitrary octets as a MAD.
            1 | 2 => {
                let len = usize::from(arg).min(data.len() - i);
                let mut buf = data[i..i + len].to_vec();
                i += len;
                if (op >> 1) % 15 == 2 {
                    buf.resize(MAD_LEN, 0);
                    buf[..4].copy_from_slice(&[1, 7, 2, 3]);
                    buf[16] = 0;
                    buf[17] = 0x10 + arg % 9;
                }
                let from = s[other].gid;
                let _ = s[who].cm.handle_mad(now, &buf, from);
            }
            // The clock.
            3 => {
                now += Duration::from_micros(u64::from(arg) * u64::from(arg) * 64);
                for side in s.iter_mut() {
                    side.cm.handle_timeout(now);
                    if let Some(t) = side.cm.poll_timeout() {
                        assert!(t > now, "a timer due after handle_timeout");
                    }
                }
            }
            4 => {
                let p = ConnectParams {
                    remote_gid: s[other].gid,
                    service_id: match arg & 3 {
                        0 | 2 => SID,
                        1 => IPOIB_SID,
                        _ => u64::from(arg),
                    },
                    qpn: u32::from(arg) + 2,
                    starting_psn: u32::from(arg) << 8,
                    responder_resources: arg & 7,
                    initiator_depth: arg >> 5,
                    path_mtu: Mtu::Mtu1024,
                    retry_count: 7,
                    rnr_retry_count: 7,
                    local_ack_timeout: 14,
                    hop_limit: 64,
                    traffic_class: 0,
                    flow_label: 0,
                    srq: false,
                    private_data: vec![arg; usize::from(arg) % 100],
                };
                if let Ok(id) = s[who].cm.connect(now, p) {
                    created += 1;
                    s[who].ids.push(id);
                }
            }
            5 => {
                let id = pick(&s[who].ids);
                let p = AcceptParams {
                    qpn: 0x100 + u32::from(arg),
                    starting_psn: u32::from(arg),
                    responder_resources: 1,
                    initiator_depth: 1,
                    rnr_retry_count: arg & 7,
                    target_ack_delay: arg & 31,
                    srq: false,
                    min_rnr_timer: 12,
                    private_data: vec![arg; usize::from(arg)],
                };
                let _ = s[who].cm.accept(now, id, p);
            }
            6 => {
                let id = pick(&s[who].ids);
                let _ = s[who]
                    .cm
                    .reject(now, id, RejReason::from(u16::from(arg)), &[arg; 8], &[arg; 3]);
            }
            7 => {
                let id = pick(&s[who].ids);
                let _ = s[who].cm.rtu(now, id, &[arg]);
            }
            8 => {
                let id = pick(&s[who].ids);
                let _ = s[who].cm.disconnect(now, id, &vec![arg; usize::from(arg)]);
            }
            9 => {
                let id = pick(&s[who].ids);
                let _ = s[who].cm.mra(now, id);
            }
            10 => {
                let id = pick(&s[who].ids);
                let _ = s[who].cm.notify_established(now, id);
            }
            12 => {
                let sid = if arg & 1 == 0 { UDP_SID } else { u64::from(arg) };
                let pd = vec![arg; usize::from(arg)];
                if s[who].cm.sidr_request(now, s[other].gid, sid, &pd).is_ok() {
                    sidr_made += 1;
                }
            }
            13 => {
                let id = if s[who].sidr.is_empty() {
                    SidrId(u32::from(arg))
                } else {
                    s[who].sidr[usize::from(arg) % s[who].sidr.len()]
                };
                let pd = vec![arg; usize::from(arg)];
                let _ = s[who]
                    .cm
                    .sidr_reply(now, id, SidrStatus::from(arg % 7), u32::from(arg) << 16, 0x0123_4567, &pd);
            }
            14 => {
                let _ = s[who].cm.sidr_cancel(SidrId(u32::from(arg)));
            }
            _ => {
                if arg & 1 == 0 {
                    let _ = s[who].cm.listen(u64::from(arg));
                } else {
                    s[who].cm.unlisten(u64::from(arg));
                }
            }
        }
        for side in s.iter_mut() {
            side.drain();
        }
        // Connections come from connect() or from REQs delivered; neither side can hold more
        // than every REQ and connect seen so far.
        assert!(s[0].cm.connections() + s[1].cm.connections() <= created + i);
        for side in &s {
            assert!(side.cm.sidr_pending() <= sidr_made);
            assert!(side.cm.sidr_received() <= MAX_SIDR_PENDING + MAX_SIDR_ANSWERED);
        }
    }
});
