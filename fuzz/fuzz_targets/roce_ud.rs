//! Fuzzes the DETH codec and the RoCEv2 UD receive path (`roce::ud::UdQp`), issue 14:
//!
//! * the first 8 octets as a DETH: parse -> emit -> parse is stable;
//! * a UD core in RTS (Q_Key from the input, a few receives posted, some of them too short
//!   for the GRH) gets a stream of arbitrary packets cut from the input by a length octet;
//!   to get past the first checks more often than by chance, a selector bit makes the opcode
//!   UD SEND ONLY (with immediate) and the DETH Q_Key the core's. Each packet comes with a
//!   GRH area taken from the input. The core never panics; a packet is delivered only when
//!   a receive was posted and consumes exactly one; every drop is counted once; a
//!   successful receive's `byte_len` is 40 + payload and its buffer starts with the GRH;
//! * the core also sends: WRs of input-chosen sizes either refused (longer than the MTU)
//!   or emitted as packets that parse, with our DETH source QPN.
#![no_main]
use libfuzzer_sys::fuzz_target;
use roce::rc::harness;
use roce::ud::{RxOutcome, UdConfig, UdQp};
use roce::wire::{Deth, Opcode, Packet};
use verbs::{Access, AhAttr, Gid, QpAttr, QpState, RecvWr, SendWr, UdDest, WcStatus, WrOpcode};

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    if let Ok((d, _)) = Deth::parse(&data[..8]) {
        let mut b = [0u8; 8];
        assert_eq!(d.emit(&mut b), Ok(8));
        let (again, _) = Deth::parse(&b).unwrap();
        assert_eq!(again.q_key, d.q_key);
        assert_eq!(again.src_qp, d.src_qp & 0xff_ffff);
    }
    let sel = data[0];
    let qkey = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) & 0x7fff_ffff;
    let dev = harness::device();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr(1 << 16, Access::LOCAL_WRITE).unwrap();
    let mem = verbs::provider::DeviceProviderExt::mem_table(&dev);
    let mut qp = UdQp::new(UdConfig::new(0x42, pd.id(), mem));
    qp.modify(&QpAttr::init_ud(1, 0, qkey)).unwrap();
    qp.modify(&QpAttr::state(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::state(QpState::Rts)).unwrap();
    let nrecv = usize::from(sel >> 4);
    for i in 0..nrecv {
        let len = if i % 3 == 2 { 30 } else { 4200 };
        qp.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: vec![mr.sge(i * 4200, len)],
        })
        .unwrap();
    }
    let mut input = &data[5..];
    let mut delivered = 0usize;
    let mut dropped = 0u64;
    while let Some((&n, rest)) = input.split_first() {
        let n = usize::from(n).min(rest.len());
        let (pkt, rest) = rest.split_at(n);
        input = rest;
        let mut pkt = pkt.to_vec();
        if sel & 1 != 0 && pkt.len() >= 20 {
            pkt[0] = if sel & 2 != 0 { 0x65 } else { 0x64 };
            if sel & 4 != 0 {
                pkt[12..16].copy_from_slice(&qkey.to_be_bytes());
            }
        }
        let mut grh = [0u8; 40];
        for (g, b) in grh.iter_mut().zip(pkt.iter().rev()) {
            *g = *b;
        }
        let Ok(p) = Packet::parse(&pkt) else { continue };
        let before = qp.recv_queued();
        match qp.handle_packet(&p, &grh) {
            RxOutcome::Delivered => {
                assert_eq!(qp.recv_queued() + 1, before);
                delivered += 1;
                let wc = qp.poll_completion().expect("a delivered packet completes a receive");
                if wc.status == WcStatus::Success {
                    assert_eq!(wc.byte_len as usize, 40 + p.payload.len());
                    let mut got = [0u8; 40];
                    mr.read(wc.wr_id as usize * 4200, &mut got).unwrap();
                    assert_eq!(got, grh);
                    assert_eq!(Some(wc.src_qp), p.ext.deth.map(|d| d.src_qp));
                } else {
                    assert_eq!(wc.status, WcStatus::LocLenErr);
                }
            }
            RxOutcome::Dropped => {
                assert_eq!(qp.recv_queued(), before);
                dropped += 1;
            }
        }
    }
    let s = qp.stats().clone();
    assert_eq!(s.received as usize, delivered);
    assert!(delivered <= nrecv);
    assert_eq!(
        s.qkey_dropped + s.pkey_dropped + s.rq_empty_dropped + s.state_dropped + s.opcode_dropped,
        dropped
    );
    // Sends of input-chosen sizes.
    let ah = pd.create_ah(&AhAttr::to_gid(Gid::from_ip("10.0.0.1".parse().unwrap()))).unwrap();
    for (i, c) in data.chunks(2).take(8).enumerate() {
        let len = u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) % 1400);
        let wr = SendWr::new(i as u64, WrOpcode::Send, vec![mr.sge(0, len)]).ud(UdDest {
            ah: ah.clone(),
            remote_qpn: u32::from(c[0]) << 16,
            remote_qkey: qkey,
        });
        match qp.post_send(&wr) {
            Ok(()) => {
                assert!(len <= 1024);
                let mut buf = vec![0u8; qp.max_packet_len()];
                let tx = qp.poll_transmit(&mut buf).unwrap();
                let p = Packet::parse(&buf[..tx.len]).unwrap();
                assert_eq!(p.bth.opcode, Opcode::UD_SEND_ONLY);
                assert_eq!(p.ext.deth.unwrap().src_qp, 0x42);
                assert_eq!(p.payload.len(), len as usize);
            }
            Err(_) => assert!(len > 1024),
        }
    }
});
