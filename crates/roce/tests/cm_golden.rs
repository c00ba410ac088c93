//! Golden vectors: the CM MADs of the lab capture `shared/lab/results/host-br0-roce-cm.pcap`
//! (Linux 6.1 rdma_cm on rxe0 talking to `tools/roce_probe.py`: REQ, REP, RTU, DREQ, DREP
//! twice, then two REQs, the second answered by REJ 8), cut out of the frames into
//! `testdata/br0-frameNN-*.mad` (the 256 octets after BTH + DETH). Each is parsed and checked
//! field by field against what tshark 4.0.17 printed for the same frame
//! (`testdata/br0-cm-tshark.tsv`, made with `tshark -T fields` over the infiniband.mad and
//! infiniband.cm fields; the command is at the end of this file), then emitted back byte for
//! byte. Requirements: C1.1 (MAD header), C1.2 (attribute IDs), C1.3 (private-data sizes),
//! C1.4 (REQ layout), C1.5 (REP layout), C1.6 (REJ), plus the rdma_cm header and service ID.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use roce::cm::cma::{CmaHdr, PortSpace, parse_service_id};
use roce::cm::mad::{CmMsg, Mad, MsgType, RejReason};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

/// tshark's rows, one map (field name → printed value) per frame.
fn tshark_rows() -> Vec<HashMap<String, String>> {
    let text = std::fs::read_to_string(testdata().join("br0-cm-tshark.tsv")).unwrap();
    let mut lines = text.lines();
    let names: Vec<&str> = lines.next().unwrap().split('\t').collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            names
                .iter()
                .zip(l.split('\t'))
                .filter(|(_, v)| !v.is_empty())
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn mad_file(frame: u32) -> Vec<u8> {
    let prefix = format!("br0-frame{frame:02}-");
    let entry = std::fs::read_dir(testdata())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no MAD for frame {frame}"));
    std::fs::read(entry).unwrap()
}

/// A number as tshark prints it: `0x…` hex or decimal.
fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

struct Row<'a>(&'a HashMap<String, String>, u32);

impl Row<'_> {
    fn get(&self, f: &str) -> &str {
        self.0
            .get(f)
            .unwrap_or_else(|| panic!("frame {}: tshark printed no {f}", self.1))
    }
    fn n(&self, f: &str, ours: u64) {
        assert_eq!(num(self.get(f)), ours, "frame {}: {f}", self.1);
    }
    fn bytes(&self, f: &str, ours: &[u8]) {
        assert_eq!(self.get(f), hex::encode(ours), "frame {}: {f}", self.1);
    }
    fn ip(&self, f: &str, ours: IpAddr) {
        assert_eq!(self.get(f), ours.to_string(), "frame {}: {f}", self.1);
    }
}

#[test]
fn capture_mads_match_tshark_and_round_trip() {
    let rows = tshark_rows();
    assert_eq!(rows.len(), 13, "13 CM MADs in the capture");
    let mut seen = HashMap::new();
    for row in &rows {
        let frame = num(&row["frame.number"]) as u32;
        let r = Row(row, frame);
        let bytes = mad_file(frame);
        let mad = Mad::parse(&bytes).unwrap_or_else(|e| panic!("frame {frame}: {e}"));

        // C1.1: the common MAD header.
        r.n("infiniband.mad.baseversion", 1);
        r.n("infiniband.mad.mgmtclass", 7);
        r.n("infiniband.mad.classversion", 2);
        r.n("infiniband.mad.method", 3);
        r.n("infiniband.mad.status", mad.hdr.status.into());
        r.n("infiniband.mad.classspecific", mad.hdr.class_specific.into());
        r.n("infiniband.mad.transactionid", mad.hdr.tid);
        r.n("infiniband.mad.attributeid", u16::from(mad.msg.attr_id()).into());
        r.n("infiniband.mad.attributemodifier", mad.hdr.attr_mod.into());

        match &mad.msg {
            CmMsg::Req(q) => {
                // C1.4
                assert_eq!(q.private_data.len(), 92, "C1.3 REQ private data");
                r.n("infiniband.cm.req", q.local_comm_id.into());
                r.n("infiniband.cm.req.serviceid.prefix", q.service_id >> 24);
                r.n("infiniband.cm.req.serviceid.protocol", (q.service_id >> 16) & 0xff);
                r.n("infiniband.cm.req.serviceid.dport", q.service_id & 0xffff);
                // rping's port 7174 (frame 18: 7175, where nobody listens) in RDMA_PS_TCP.
                let (ps, port) = parse_service_id(q.service_id).unwrap();
                assert_eq!(ps, PortSpace::Tcp);
                assert!(port == 7174 || (frame == 18 && port == 7175), "frame {frame}");
                r.n("infiniband.cm.req.localcaguid", q.local_ca_guid);
                r.n("infiniband.cm.req.localqkey", q.local_qkey.into());
                r.n("infiniband.cm.req.localqpn", q.local_qpn.into());
                r.n("infiniband.cm.req.responderres", q.responder_resources.into());
                r.n("infiniband.cm.req.localeecn", q.local_eecn.into());
                r.n("infiniband.cm.req.initdepth", q.initiator_depth.into());
                r.n("infiniband.cm.req.remoteeecn", q.remote_eecn.into());
                r.n("infiniband.cm.req.remoteresptout", q.remote_cm_response_timeout.into());
                r.n("infiniband.cm.req.transpsvctype", q.transport_service_type.into());
                r.n("infiniband.cm.req.e2eflowctrl", q.end_to_end_flow_control.into());
                r.n("infiniband.cm.req.startpsn", q.starting_psn.into());
                r.n("infiniband.cm.req.localresptout", q.local_cm_response_timeout.into());
                r.n("infiniband.cm.req.retrcount", q.retry_count.into());
                r.n("infiniband.cm.req.pkey", q.pkey.into());
                r.n("infiniband.cm.req.pppmtu", q.path_mtu.into());
                r.n("infiniband.cm.req.rdcexist", q.rdc_exists.into());
                r.n("infiniband.cm.req.rnrretrcount", q.rnr_retry_count.into());
                r.n("infiniband.cm.req.maxcmretr", q.max_cm_retries.into());
                r.n("infiniband.cm.req.srq", q.srq.into());
                r.n("infiniband.cm.req.ext_transport", q.extended_transport_type.into());
                let p = &q.primary_path;
                r.n("infiniband.cm.req.prim_locallid", p.local_lid.into());
                r.n("infiniband.cm.req.prim_remotelid", p.remote_lid.into());
                r.ip("infiniband.cm.req.prim_localgid_ipv4", p.local_gid.to_ip());
                r.ip("infiniband.cm.req.prim_remotegid_ipv4", p.remote_gid.to_ip());
                r.n("infiniband.cm.req.prim_flowlabel", p.flow_label.into());
                r.n("infiniband.cm.req.prim_pktrate", p.packet_rate.into());
                r.n("infiniband.cm.req.prim_tfcclass", p.traffic_class.into());
                r.n("infiniband.cm.req.prim_hoplim", p.hop_limit.into());
                r.n("infiniband.cm.req.prim_sl", p.sl.into());
                r.n("infiniband.cm.req.prim_subnetlocal", p.subnet_local.into());
                r.n("infiniband.cm.req.prim_localacktout", p.local_ack_timeout.into());
                let a = &q.alternate_path;
                r.n("infiniband.cm.req.alt_locallid", a.local_lid.into());
                r.n("infiniband.cm.req.alt_remotelid", a.remote_lid.into());
                r.bytes("infiniband.cm.req.alt_localgid", &a.local_gid.0);
                r.bytes("infiniband.cm.req.alt_remotegid", &a.remote_gid.0);
                r.n("infiniband.cm.req.alt_hoplim", a.hop_limit.into());
                r.n("infiniband.cm.req.alt_localacktout", a.local_ack_timeout.into());
                // The rdma_cm header in the private data.
                let h = CmaHdr::parse(&q.private_data).unwrap();
                r.n("infiniband.cm.req.ip_cm.majv", 0);
                r.n("infiniband.cm.req.ip_cm.minv", 0);
                r.n("infiniband.cm.req.ip_cm.ipv", 4);
                r.n("infiniband.cm.req.ip_cm.sport", h.src.port().into());
                r.ip("infiniband.cm.req.ip_cm.sip4", h.src.ip());
                r.ip("infiniband.cm.req.ip_cm.dip4", h.dst);
                r.bytes("infiniband.cm.req.ip_cm.private", &q.private_data[36..]);
                // rdma_cm puts the REQ's GIDs and the header's addresses in agreement.
                assert_eq!(h.src.ip(), p.local_gid.to_ip());
                assert_eq!(h.dst, p.remote_gid.to_ip());
            }
            CmMsg::Rep(p) => {
                // C1.5
                assert_eq!(p.private_data.len(), 196, "C1.3 REP private data");
                r.n("infiniband.cm.rep", p.local_comm_id.into());
                r.n("infiniband.cm.rep.remotecommid", p.remote_comm_id.into());
                r.n("infiniband.cm.rep.localqkey", p.local_qkey.into());
                r.n("infiniband.cm.rep.localqpn", p.local_qpn.into());
                r.n("infiniband.cm.rep.localeecn", p.local_eecn.into());
                r.n("infiniband.cm.rep.startpsn", p.starting_psn.into());
                r.n("infiniband.cm.rep.respres", p.responder_resources.into());
                r.n("infiniband.cm.rep.initdepth", p.initiator_depth.into());
                r.n("infiniband.cm.rep.tgtackdelay", p.target_ack_delay.into());
                r.n("infiniband.cm.rep.failoveracc", p.failover_accepted.into());
                r.n("infiniband.cm.rep.e2eflowctrl", p.end_to_end_flow_control.into());
                r.n("infiniband.cm.rep.rnrretrcount", p.rnr_retry_count.into());
                r.n("infiniband.cm.rep.srq", p.srq.into());
                r.n("infiniband.cm.rep.localcaguid", p.local_ca_guid);
                r.bytes("infiniband.cm.rep.private", &p.private_data);
                // rxe's QPs are numbered from 17 (lab README); rxe0's node GUID.
                assert!(p.local_qpn >= 17);
                assert_eq!(p.local_ca_guid, 0x5054_00ff_fe77_0002);
            }
            CmMsg::Rtu(u) => {
                assert_eq!(u.private_data.len(), 224, "C1.3 RTU private data");
                r.n("infiniband.cm.rtu.localcommid", u.local_comm_id.into());
                r.n("infiniband.cm.rtu.remotecommid", u.remote_comm_id.into());
                r.bytes("infiniband.cm.rtu.private", &u.private_data);
            }
            CmMsg::Dreq(d) => {
                assert_eq!(d.private_data.len(), 220, "C1.3 DREQ private data");
                r.n("infiniband.cm.dreq.localcommid", d.local_comm_id.into());
                r.n("infiniband.cm.dreq.remotecommid", d.remote_comm_id.into());
                r.n("infiniband.cm.req.remoteqpneecn", d.remote_qpn.into());
                r.bytes("infiniband.cm.dreq.private", &d.private_data);
            }
            CmMsg::Drep(d) => {
                assert_eq!(d.private_data.len(), 224, "C1.3 DREP private data");
                r.n("infiniband.cm.drsp.localcommid", d.local_comm_id.into());
                r.n("infiniband.cm.drsp.remotecommid", d.remote_comm_id.into());
                r.bytes("infiniband.cm.drsp.private", &d.private_data);
            }
            CmMsg::Rej(j) => {
                // C1.6: Linux answers a REQ for port 7174 with nobody listening by REJ 8,
                // local comm ID 0, message rejected = REQ, no ARI.
                assert_eq!(j.private_data.len(), 148, "C1.3 REJ private data");
                r.n("infiniband.cm.rej.localcommid", j.local_comm_id.into());
                r.n("infiniband.cm.rej.remotecommid", j.remote_comm_id.into());
                r.n("infiniband.cm.rej.msgrej", 0);
                r.n("infiniband.cm.rej.rejinfolen", j.ari.len() as u64);
                r.n("infiniband.cm.rej.reason", u16::from(j.reason).into());
                assert_eq!(j.reason, RejReason::InvalidServiceId);
                assert_eq!(j.message_rejected, MsgType::Req);
                assert_eq!(j.local_comm_id, 0);
                r.bytes("infiniband.cm.rej.ari", &[0u8; 72]);
                r.bytes("infiniband.cm.rej.private", &j.private_data);
            }
            other => panic!("frame {frame}: unexpected {other:?}"),
        }
        *seen.entry(mad.msg.attr_id()).or_insert(0) += 1;

        // Emitted back byte for byte.
        assert_eq!(mad.emit().unwrap().to_vec(), bytes, "frame {frame}: emit");
    }
    use roce::cm::AttrId::*;
    assert_eq!(seen[&Req], 4);
    assert_eq!(seen[&Rep], 2);
    assert_eq!(seen[&Rtu], 2);
    assert_eq!(seen[&Dreq], 2);
    assert_eq!(seen[&Drep], 2);
    assert_eq!(seen[&Rej], 1);
}

/// The exchange in frames 1-5 hangs together as Linux's CM builds it: REP, RTU reuse the
/// REQ's TID, DREQ has a new one that the DREP echoes; the comm IDs cross over; the DREQ
/// names the QPN from the REP (C1.7).
#[test]
fn capture_exchange_is_consistent() {
    let m = |f| Mad::parse(&mad_file(f)).unwrap();
    let (req, rep, rtu, dreq, drep) = (m(1), m(2), m(3), m(4), m(5));
    let (CmMsg::Req(q), CmMsg::Rep(p), CmMsg::Rtu(u), CmMsg::Dreq(d), CmMsg::Drep(e)) =
        (&req.msg, &rep.msg, &rtu.msg, &dreq.msg, &drep.msg)
    else {
        panic!("frames 1-5 are REQ REP RTU DREQ DREP");
    };
    assert_eq!(rep.hdr.tid, req.hdr.tid);
    assert_eq!(rtu.hdr.tid, req.hdr.tid);
    assert_ne!(dreq.hdr.tid, req.hdr.tid);
    assert_eq!(drep.hdr.tid, dreq.hdr.tid);
    assert_eq!(p.remote_comm_id, q.local_comm_id);
    assert_eq!((u.local_comm_id, u.remote_comm_id), (q.local_comm_id, p.local_comm_id));
    assert_eq!((d.local_comm_id, d.remote_comm_id), (q.local_comm_id, p.local_comm_id));
    assert_eq!((e.local_comm_id, e.remote_comm_id), (p.local_comm_id, q.local_comm_id));
    assert_eq!(d.remote_qpn, p.local_qpn);
}

// How br0-cm-tshark.tsv was made (tshark 4.0.17):
//   tshark -r host-br0-roce-cm.pcap -Y 'infiniband.mad.mgmtclass == 7' -T fields \
//     -E header=y -E separator=/t -E occurrence=f -e frame.number -e infiniband.mad.… \
//     -e infiniband.cm.… (every field named in the header line of the file)
// and the .mad files: octets 62..318 of each CM frame (Ethernet 14, IPv4 20, UDP 8,
// BTH 12, DETH 8; the ICRC follows).

/// Our CM's REQ for an rdma_cm peer is byte for byte the REQ Linux accepted in frame 1 (sent
/// by `tools/roce_probe.py`), once the random values (comm ID, TID) are those of the frame and
/// the inputs (CA GUID, QPN, PSN, rdma_cm source port, GIDs) are the frame's (C1.4, rdma_cm).
/// Likewise our REP for that REQ is Linux's REP of frame 2 (C1.5) with its QPN, PSN, GUID.
#[test]
fn our_req_and_rep_are_linux_shaped() {
    use roce::cm::{AcceptParams, Cm, CmConfig, CmEvent, ConnectParams};
    use std::time::Instant;
    use verbs::Gid;

    let frame1 = mad_file(1);
    let CmMsg::Req(linux_req) = Mad::parse(&frame1).unwrap().msg else {
        panic!()
    };
    let cma = CmaHdr::parse(&linux_req.private_data).unwrap();
    let host = Gid::from_ip(cma.src.ip());
    let rxe = Gid::from_ip(cma.dst);
    let now = Instant::now();

    let mut ours = Cm::new(CmConfig::new(linux_req.local_ca_guid, host, 1));
    let dst = std::net::SocketAddr::new(cma.dst, 7174);
    let p = ConnectParams::rdma_cm(cma.src, dst, linux_req.local_qpn, linux_req.starting_psn, &[]).unwrap();
    ours.connect(now, p).unwrap();
    let (to, mut mad) = ours.poll_transmit().unwrap();
    assert_eq!(to, rxe);
    let req_tid = Mad::parse(&frame1).unwrap().hdr.tid;
    mad.hdr.tid = req_tid;
    if let CmMsg::Req(q) = &mut mad.msg {
        q.local_comm_id = linux_req.local_comm_id;
    }
    assert_eq!(hex::encode(mad.emit().unwrap()), hex::encode(&frame1));

    // The passive side: feed Linux's REQ to a CM with rxe0's GUID and GID, accept with the
    // QPN and PSN Linux chose, compare with frame 2.
    let frame2 = mad_file(2);
    let CmMsg::Rep(linux_rep) = Mad::parse(&frame2).unwrap().msg else {
        panic!()
    };
    let mut passive = Cm::new(CmConfig::new(linux_rep.local_ca_guid, rxe, 2));
    passive.listen(linux_req.service_id).unwrap();
    passive.handle_mad(now, &frame1, host).unwrap();
    let Some(CmEvent::ConnectRequest(r)) = passive.poll_event() else {
        panic!("no ConnectRequest")
    };
    assert_eq!(r.cma, Some(cma));
    let qp = passive
        .accept(
            now,
            r.id,
            AcceptParams {
                qpn: linux_rep.local_qpn,
                starting_psn: linux_rep.starting_psn,
                responder_resources: 1,
                initiator_depth: 1,
                rnr_retry_count: 7,
                target_ack_delay: 15,
                srq: false,
                min_rnr_timer: 12,
                private_data: vec![],
            },
        )
        .unwrap();
    let (to, mut rep) = passive.poll_transmit().unwrap();
    assert_eq!(to, host);
    if let CmMsg::Rep(p) = &mut rep.msg {
        p.local_comm_id = linux_rep.local_comm_id;
    }
    assert_eq!(hex::encode(rep.emit().unwrap()), hex::encode(&frame2));
    // The passive QP sends from the REQ's PSN and expects the REP's (lab README "PSN
    // direction": rxe's READ REQUEST carried the REQ PSN, and wanted the REP PSN from us).
    assert_eq!(qp.rts.sq_psn, linux_req.starting_psn);
    assert_eq!(qp.rtr.rq_psn, linux_rep.starting_psn);
    assert_eq!(qp.rtr.dest_qp_num, linux_req.local_qpn);
}
