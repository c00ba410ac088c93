//! Failover of connections in memory (requirements A2.13 SMC-FO-2..5, A4.7 steps 2–5): two
//! connection machines joined by a modelled RC link whose failure loses what was not yet
//! delivered and the acknowledgements of some of what was; both ends then move to a
//! second link (`Conn::failover`) and the byte streams must arrive whole, in order, with
//! nothing lost or duplicated, for random sizes, timings and failure points. And the
//! fault of SMC-FO-4: a CDC the sender saw complete but the receiver never processed →
//! the receiver resets at once.

use smc::conn::{AbortReason, Action, Conn, ConnParams};
use smc::wire::cdc::{Cdc, ProducerFlags};
use smc::wire::cursor::{EyecatcherMode, Rmbe};
use std::collections::VecDeque;

/// What travels on one direction of the link.
#[derive(Debug, Clone)]
enum Op {
    Write { remote_off: u32, data: Vec<u8> },
    Cdc(Cdc),
}

struct Side {
    conn: Conn,
    /// Every octet the application wrote, indexed by stream offset (the send ring).
    stream: Vec<u8>,
    elem: Vec<u8>,
    got: Vec<u8>,
    /// Posted, not yet delivered (this direction of the current link).
    wire: VecDeque<Op>,
    /// Delivered, completion not yet seen by this (sending) side.
    acks: VecDeque<Op>,
}

fn side(lt: u32, pt: u32, e: Rmbe, send_buf: u32) -> Side {
    Side {
        conn: Conn::new(ConnParams {
            local_token: lt,
            peer_token: pt,
            local_rmbe: e,
            peer_rmbe: e,
            send_buf,
        }),
        stream: Vec::new(),
        elem: vec![0; e.len() as usize],
        got: Vec::new(),
        wire: VecDeque::new(),
        acks: VecDeque::new(),
    }
}

/// Posts the machine's actions on the link (as the engine's drive does).
fn post(s: &mut Side) {
    while let Some(a) = s.conn.poll_action() {
        match a {
            Action::RdmaWrite { src, remote_off, len } => {
                let data = s.stream[src as usize..(src + u64::from(len)) as usize].to_vec();
                s.wire.push_back(Op::Write { remote_off, data });
            }
            Action::SendCdc(c) => s.wire.push_back(Op::Cdc(c)),
            Action::TcpReset | Action::ReleaseElement => {}
        }
    }
}

/// Delivers the oldest op of `from`'s wire to `to`.
fn deliver(from: &mut Side, to: &mut Side) {
    let Some(op) = from.wire.pop_front() else { return };
    match &op {
        Op::Write { remote_off, data } => {
            let o = *remote_off as usize;
            to.elem[o..o + data.len()].copy_from_slice(data);
        }
        Op::Cdc(c) => {
            to.conn.on_cdc(c);
        }
    }
    from.acks.push_back(op);
}

/// `from` sees the completion of its oldest delivered op.
fn complete(from: &mut Side) {
    match from.acks.pop_front() {
        Some(Op::Write { data, .. }) => from.conn.writes_completed(data.len() as u64),
        Some(Op::Cdc(c)) => from.conn.cdc_completed(c.seq),
        None => {}
    }
}

fn read(s: &mut Side, max: u64) {
    let (a, b) = s.conn.read_spans(max);
    let mut n = 0;
    for sp in [Some(a), b].into_iter().flatten() {
        s.got
            .extend_from_slice(&s.elem[sp.off as usize..(sp.off + sp.len) as usize]);
        n += u64::from(sp.len);
    }
    if n > 0 {
        s.conn.consume(n).unwrap();
    }
}

fn write(s: &mut Side, n: usize, seed: &mut u64) {
    let took = s.conn.write(n as u64).unwrap() as usize;
    for _ in 0..took {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s.stream.push((*seed >> 33) as u8);
    }
}

fn rnd(seed: &mut u64, n: u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (*seed >> 33) % n
}

/// The link fails: undelivered ops are lost; of the delivered ones whose completion was
/// not seen, the completions are lost too (flushed). Both ends then fail over.
fn fail_link(a: &mut Side, b: &mut Side) {
    for s in [&mut *a, &mut *b] {
        s.wire.clear();
        s.acks.clear();
    }
    a.conn.failover();
    b.conn.failover();
}

/// SMC-FO-2..5: random traffic both ways through 1–3 link failures at random points:
/// both streams arrive byte-exact (nothing lost, nothing duplicated), no reset.
#[test]
fn failover_keeps_both_streams_exact() {
    for run in 0..250u64 {
        let mut seed = run.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let elen = [16_384u32, 32_768][(run % 2) as usize];
        let e = Rmbe::new(elen, EyecatcherMode::None).unwrap();
        let send_buf = [8_192u32, 65_536, 100_000][(run % 3) as usize];
        let mut a = side(0xA1, 0xB1, e, send_buf);
        let mut b = side(0xB1, 0xA1, e, send_buf);
        let total = 200_000 + rnd(&mut seed, 100_000) as usize;
        let fails: Vec<u64> = (0..1 + rnd(&mut seed, 3)).map(|_| rnd(&mut seed, 3_000)).collect();
        let mut step = 0u64;
        while (a.stream.len() < total || b.stream.len() < total || a.got.len() < total || b.got.len() < total)
            && step < 200_000
        {
            step += 1;
            if fails.contains(&step) {
                fail_link(&mut a, &mut b);
            }
            match rnd(&mut seed, 8) {
                0 if a.stream.len() < total => {
                    let n = (1 + rnd(&mut seed, 20_000) as usize).min(total - a.stream.len());
                    write(&mut a, n, &mut seed);
                }
                1 if b.stream.len() < total => {
                    let n = (1 + rnd(&mut seed, 20_000) as usize).min(total - b.stream.len());
                    write(&mut b, n, &mut seed);
                }
                2 => deliver(&mut a, &mut b),
                3 => deliver(&mut b, &mut a),
                4 => complete(&mut a),
                5 => complete(&mut b),
                6 => read(&mut a, 1 + rnd(&mut seed, 30_000)),
                _ => read(&mut b, 1 + rnd(&mut seed, 30_000)),
            }
            post(&mut a);
            post(&mut b);
        }
        assert_eq!(a.conn.abort_reason(), None, "run {run}");
        assert_eq!(b.conn.abort_reason(), None, "run {run}");
        assert_eq!(b.got.len(), total, "run {run}: A→B length");
        assert_eq!(a.got.len(), total, "run {run}: B→A length");
        assert!(b.got == a.stream, "run {run}: A→B octets differ");
        assert!(a.got == b.stream, "run {run}: B→A octets differ");
        assert_eq!(
            a.conn.failovers() as usize,
            fails.iter().filter(|f| **f <= step).count()
        );
    }
}

/// SMC-FO-3: the first message on the new link is the validation CDC (F, sequence SS =
/// the last CDC whose send completed, not counted), then the replayed writes at their old
/// element offsets, then a CDC with a fresh sequence number and the current producer
/// cursor.
#[test]
fn failover_message_order_and_fields() {
    let e = Rmbe::new(16_384, EyecatcherMode::None).unwrap();
    let mut a = side(0xA1, 0xB1, e, 65_536);
    let mut b = side(0xB1, 0xA1, e, 65_536);
    let mut seed = 7;
    write(&mut a, 1000, &mut seed);
    post(&mut a);
    // Write + CDC 1 delivered and completed.
    for _ in 0..2 {
        deliver(&mut a, &mut b);
        complete(&mut a);
    }
    write(&mut a, 500, &mut seed);
    post(&mut a);
    // Write 2 + CDC 2 delivered, completions lost.
    deliver(&mut a, &mut b);
    deliver(&mut a, &mut b);
    fail_link(&mut a, &mut b);
    post(&mut a);
    let ops: Vec<Op> = a.wire.iter().cloned().collect();
    let Op::Cdc(f) = &ops[0] else { panic!("{ops:?}") };
    assert!(f.prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION));
    assert_eq!(f.seq, 1);
    let Op::Write { remote_off, data } = &ops[1] else {
        panic!("{ops:?}")
    };
    assert_eq!((*remote_off, data.len()), (1000, 500));
    let Op::Cdc(c) = &ops[2] else { panic!("{ops:?}") };
    assert_eq!(c.seq, 3);
    assert!(!c.prod_flags.contains(ProducerFlags::FAILOVER_VALIDATION));
    assert_eq!(e.position(c.prod), 1500);
    while !a.wire.is_empty() {
        deliver(&mut a, &mut b);
    }
    read(&mut b, 10_000);
    assert!(b.got == a.stream);
    assert_eq!(b.conn.abort_reason(), None);
}

/// SMC-FO-4 (fault injection): the sender saw CDC 2 complete but the receiver never
/// processed it (SR 1 < SS 2): the validation CDC makes the receiver reset at once.
#[test]
fn validation_detects_lost_data_and_resets() {
    let e = Rmbe::new(16_384, EyecatcherMode::None).unwrap();
    let mut a = side(0xA1, 0xB1, e, 65_536);
    let mut b = side(0xB1, 0xA1, e, 65_536);
    let mut seed = 9;
    write(&mut a, 100, &mut seed);
    post(&mut a);
    deliver(&mut a, &mut b);
    deliver(&mut a, &mut b);
    complete(&mut a);
    complete(&mut a);
    write(&mut a, 100, &mut seed);
    post(&mut a);
    // The write and CDC 2 "complete" at the sender but are never placed.
    a.wire.clear();
    a.conn.writes_completed(100);
    a.conn.cdc_completed(2);
    a.conn.failover();
    post(&mut a);
    deliver(&mut a, &mut b);
    assert_eq!(b.conn.abort_reason(), Some(AbortReason::FailoverLoss));
    post(&mut b);
    assert!(
        b.wire
            .iter()
            .any(|o| matches!(o, Op::Cdc(c) if c.conn_flags.contains(smc::wire::cdc::ConnStateFlags::ABORT)))
    );
}
