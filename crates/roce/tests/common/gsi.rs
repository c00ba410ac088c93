//! Packets built by hand for the tests that play a peer of a device on UDP 4791
//! (cm_foreign_ipid.rs, misbehave_gsi.rs, icrc_rx.rs, cm_sidr.rs): the REQ our own CM sends,
//! a GSI datagram (UD SEND ONLY to QP1 with a DETH) around a MAD, and the ICRC sealed over
//! IPv4 and UDP headers as rxe computes it (IBA annex A17 §A17.3.3).

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use roce::cm::{Cm, CmConfig, ConnectParams};
use roce::wire::{Bth, Deth, ExtHeaders, Opcode, Packet, Psn, icrc};
use verbs::Gid;

/// The MAD of the REQ our CM (CA GUID `ca_guid`, port GID `us`) sends to connect
/// `us`:40000 to rdma_cm's TCP port `port` on `dev`: QPN 0x1234, PSN 0x5678, no private
/// data.
pub fn rdma_cm_req(ca_guid: u64, us: Ipv4Addr, dev: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut cm = Cm::new(CmConfig::new(ca_guid, Gid::from_ipv4(us), 7));
    let p = ConnectParams::rdma_cm(
        SocketAddr::new(us.into(), 40000),
        SocketAddr::new(dev.into(), port),
        0x00_1234,
        0x00_5678,
        b"",
    )
    .unwrap();
    cm.connect(Instant::now(), p).unwrap();
    let (_, mad) = cm.poll_transmit().unwrap();
    mad.emit().unwrap().to_vec()
}

/// The BTH of a GSI datagram: UD SEND ONLY to QP1 with PSN `psn`, the default P_Key.
pub fn gsi_bth(psn: u32) -> Bth {
    Bth::new(Opcode::UD_SEND_ONLY, 1, Psn::new(psn))
}

/// The RoCEv2 packet (BTH, DETH from QP1 with Q_Key `q_key`, `payload`, room for the ICRC)
/// of a datagram with header `bth`; the ICRC is not yet sealed.
pub fn ud_packet(bth: Bth, q_key: u32, payload: &[u8]) -> Vec<u8> {
    let ext = ExtHeaders {
        deth: Some(Deth {
            q_key,
            resv8: 0,
            src_qp: 1,
        }),
        ..ExtHeaders::default()
    };
    packet(bth, ext, payload)
}

/// The RoCEv2 packet (BTH, `ext`, `payload`, room for the ICRC); the ICRC is not yet
/// sealed.
pub fn packet(bth: Bth, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
    let pkt = Packet::new(bth, ext, payload).unwrap();
    let mut buf = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut buf).unwrap();
    buf
}

/// Seals `roce`'s ICRC for an IPv4 packet `src` → `dst` with Identification `id`, UDP
/// source port `sport` and destination port 4791; returns the IPv4 and UDP headers it was
/// sealed for.
pub fn seal_ipv4(roce: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, id: u16, sport: u16) -> ([u8; 20], [u8; 8]) {
    let ip = icrc::ipv4_header(src.octets(), dst.octets(), id, roce.len());
    let udp = icrc::udp_header(sport, 4791, roce.len());
    icrc::seal(&ip, &udp, roce).unwrap();
    (ip, udp)
}
