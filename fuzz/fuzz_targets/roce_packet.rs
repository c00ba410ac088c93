//! Fuzzes the RoCEv2 packet decoder (`roce::wire::Packet::parse`) and the ICRC: arbitrary
//! UDP payloads must never panic; whatever parses re-emits to octets that parse to the same
//! packet (parse -> emit -> parse stable), and the receive checks that read the opcode table
//! (`sequence_ok`, `check_payload_len`) accept any parsed packet without panicking.
//! Selector octet: bit 0 also runs the ICRC over `data` cut as IP (20 or 40, bit 1) + UDP (8)
//! + packet; bit 2 compares the lean IPv4 ICRC (`compute_v4_short_packet`, addresses, ID and
//! ports from the next 14 octets) with the general one.
//! Always: the lean parser and header emitter of the data path's opcodes (`wire::lean`)
//! equal the generic, table-driven ones (`Packet::parse_generic`, `emit_header_generic`):
//! same packet or same error, same header octets, on every input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use roce::wire::icrc;
use roce::wire::lean;
use roce::wire::opcode::sequence_ok;
use roce::wire::segment::check_payload_len;
use roce::wire::Packet;
use verbs::Mtu;

const MTUS: [Mtu; 5] = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    if sel & 4 != 0 && rest.len() >= 14 {
        // The lean IPv4 ICRC the engine sends and checks short packets with
        // (`icrc::compute_v4_short_packet`) equals the general one over `ipv4_header` and
        // `udp_header` whenever it answers.
        let (f, pkt) = rest.split_at(14);
        let (src, dst) = ([f[0], f[1], f[2], f[3]], [f[4], f[5], f[6], f[7]]);
        let id = u16::from_be_bytes([f[8], f[9]]);
        let (sport, dport) = (u16::from_be_bytes([f[10], f[11]]), u16::from_be_bytes([f[12], f[13]]));
        if let Some(lean) = icrc::compute_v4_short_packet(src, dst, id, sport, dport, pkt) {
            let ip = icrc::ipv4_header(src, dst, id, pkt.len());
            let udp = icrc::udp_header(sport, dport, pkt.len());
            assert_eq!(icrc::compute(&ip, &udp, pkt), Ok(lean));
        }
    }
    if sel & 1 != 0 {
        let ip_len = if sel & 2 != 0 { 40 } else { 20 };
        if rest.len() >= ip_len + 8 {
            let (ip, r) = rest.split_at(ip_len);
            let (udp, pkt) = r.split_at(8);
            let _ = icrc::verify(ip, udp, pkt);
            let mut sealed = pkt.to_vec();
            if icrc::seal(ip, udp, &mut sealed).is_ok() {
                assert_eq!(icrc::verify(ip, udp, &sealed), Ok(()));
            }
        }
    }
    let generic = Packet::parse_generic(rest);
    if let Some(l) = lean::parse(rest) {
        assert_eq!(Ok(l), generic);
    }
    assert_eq!(Packet::parse(rest), generic);
    if let Ok(p) = &generic {
        // Header emit, lean against generic, at the packet's own payload length, at another
        // one (the selector), and into a buffer one octet short.
        for (len, room) in [(p.payload.len(), 64), (usize::from(sel) * 17, 64), (p.payload.len(), 11)] {
            let (mut a, mut g) = ([0x5au8; 64], [0x5au8; 64]);
            let r = p.emit_header_generic(&mut g[..room], len);
            if let Some(n) = lean::emit_header(p, &mut a[..room], len) {
                assert_eq!(Ok(n), r);
            }
            assert_eq!(p.emit_header(&mut a[..room], len), r);
            assert_eq!(a, g);
        }
    }
    match generic {
        Ok(p) => {
            let _ = format!("{p:?}");
            let mut buf = vec![0u8; p.buffer_len()];
            assert_eq!(p.emit(&mut buf), Ok(buf.len()));
            let again = Packet::parse(&buf).expect("an emitted packet parses");
            assert_eq!(again, p);
            let info = p.info().expect("a parsed opcode is in the table");
            for mtu in MTUS {
                let _ = check_payload_len(info, p.payload.len(), mtu);
            }
            let _ = sequence_ok(None, info);
            let _ = sequence_ok(Some(info), info);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
