//! Volume and scale (moved from the iWARP provider's scale tests): 1 GiB
//! moved by RDMA Writes and by RDMA Reads under each device variant,
//! verified by SHA-256 of both ends; 256 connected QPs at once, each moving
//! data.

use crate::{Caps, Fixture, Pair, T, pair_with};
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use verbs::*;

/// The suite's volume: 1 GiB.
pub const GIB: usize = 1 << 30;
const CHUNK: usize = 1 << 20;

/// A region of `len` bytes of a deterministic pseudo-random pattern.
pub fn patterned(pd: &ProtectionDomain, len: usize, seed: u64) -> MemoryRegion {
    let mr = pd.reg_mr(len, Access::all_remote()).unwrap();
    let mut x = seed | 1;
    let mut block = vec![0u8; CHUNK];
    for off in (0..len).step_by(CHUNK) {
        for w in block.chunks_exact_mut(8) {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            w.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        mr.write(off, &block[..CHUNK.min(len - off)]).unwrap();
    }
    mr
}

/// SHA-256 of the whole region.
pub fn sha256(mr: &MemoryRegion) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut block = vec![0u8; 16 << 20];
    for off in (0..mr.len()).step_by(block.len()) {
        let n = block.len().min(mr.len() - off);
        mr.read(off, &mut block[..n]).unwrap();
        h.update(&block[..n]);
    }
    h.finalize().into()
}

/// Moves the whole of `src` to `dst` with 1 MiB work requests, keeping
/// `depth` outstanding; every 16th signaled.
pub fn move_all(p: &Pair, read: bool, local: &MemoryRegion, remote: &MemoryRegion, depth: usize) -> Duration {
    let t0 = Instant::now();
    let n = local.len() / CHUNK;
    let (mut posted, mut done) = (0usize, 0usize);
    while done < n {
        while posted < n && posted - done < depth {
            let off = posted * CHUNK;
            let ra = RemoteAddr {
                addr: remote.addr() + off as u64,
                rkey: remote.rkey(),
            };
            let op = if read {
                WrOpcode::RdmaRead { remote: ra }
            } else {
                WrOpcode::RdmaWrite { remote: ra }
            };
            let last = posted + 1 == n;
            let flags = if posted % 16 == 15 || last {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            p.a.post_send_one(SendWr::new(posted as u64, op, vec![local.sge(off, CHUNK as u32)]).flags(flags))
                .unwrap();
            posted += 1;
        }
        let wc = p.cq_a().wait(Some(T)).expect("completion");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        done = wc.wr_id as usize + 1;
    }
    if !read {
        // Local completion of a Write is not remote placement (RFC 5040 §5.5
        // rule 9): a Read after them returns once they are placed (ORD-12).
        let ra = RemoteAddr {
            addr: remote.addr(),
            rkey: remote.rkey(),
        };
        p.a.post_send_one(SendWr::new(
            u64::MAX,
            WrOpcode::RdmaRead { remote: ra },
            vec![local.sge(0, 1)],
        ))
        .unwrap();
        assert_eq!(p.cq_a().wait(Some(T)).unwrap().status, WcStatus::Success);
    }
    t0.elapsed()
}

/// Moves `len` bytes (1 GiB in the suite) by Writes or by Reads on `p` and
/// compares the SHA-256 of both ends (RDMAP-WR-02, RDMAP-RD-06; IBA vol. 1
/// §9.4, subsections unconfirmed). Returns how long the transfer took.
pub fn hashed_transfer(p: &Pair, len: usize, read: bool) -> Duration {
    // A Write pushes local src into remote dst; a Read pulls remote src into local dst.
    let (src_pd, dst_pd) = if read {
        (&p.eb.pd, &p.ea.pd)
    } else {
        (&p.ea.pd, &p.eb.pd)
    };
    let src = patterned(src_pd, len, if read { 7 } else { 3 });
    let dst = dst_pd.reg_mr(len, Access::all_remote()).unwrap();
    let want = sha256(&src);
    let took = if read {
        move_all(p, true, &dst, &src, 16)
    } else {
        move_all(p, false, &src, &dst, 64)
    };
    assert_eq!(sha256(&dst), want, "SHA-256 of the sink equals the source's");
    took
}

/// 1 GiB by Writes or Reads under device variant `variant`, hashed at both ends.
pub fn one_gib(fx: &dyn Fixture, variant: usize, read: bool) {
    let opts = &fx.variants()[variant];
    let p = pair_with(fx, opts, &Caps::default());
    let took = hashed_transfer(&p, GIB, read);
    eprintln!(
        "{} {opts:?}: 1 GiB by {}: {:.2} s ({:.2} GB/s)",
        fx.name(),
        if read { "Reads" } else { "Writes" },
        took.as_secs_f64(),
        GIB as f64 / took.as_secs_f64() / 1e9
    );
}

/// 256 connected QP pairs at once, each moving a 64 KiB Write and a Send naming it.
pub fn qps_256_at_once(fx: &dyn Fixture) {
    const N: usize = 256;
    let (ec, es) = fx.ends(&fx.variants()[0], 8 * N);
    let (clients, servers): (Vec<QueuePair>, Vec<QueuePair>) =
        fx.connect(&ec, &es, N, &Caps::default()).into_iter().unzip();
    let (cq_c, cq_s) = (&ec.cq, &es.cq);
    // Each QP: a Write of 64 KiB into its own slice, then a Send naming it.
    const SLICE: usize = 64 << 10;
    let src = patterned(&ec.pd, N * SLICE, 11);
    let dst = es.pd.reg_mr(N * SLICE, Access::all_remote()).unwrap();
    let rbuf = es.pd.reg_mr(N * 8, Access::LOCAL_WRITE).unwrap();
    for (i, s) in servers.iter().enumerate() {
        s.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: vec![rbuf.sge(i * 8, 8)],
        }])
        .unwrap();
    }
    let tags = ec.pd.reg_mr(N * 8, Access::LOCAL_WRITE).unwrap();
    for (i, c) in clients.iter().enumerate() {
        tags.write(i * 8, &(i as u64).to_be_bytes()).unwrap();
        let ra = RemoteAddr {
            addr: dst.addr() + (i * SLICE) as u64,
            rkey: dst.rkey(),
        };
        c.post_send(&[
            SendWr::new(
                i as u64,
                WrOpcode::RdmaWrite { remote: ra },
                vec![src.sge(i * SLICE, SLICE as u32)],
            )
            .flags(SendFlags::empty()),
            SendWr::new(i as u64, WrOpcode::Send, vec![tags.sge(i * 8, 8)]),
        ])
        .unwrap();
    }
    let mut seen = vec![false; N];
    for _ in 0..N {
        let wc = cq_s.wait(Some(T)).expect("a receive");
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8));
        let i = wc.wr_id as usize;
        // The Send follows the Write on the same QP: the slice is placed.
        let tag = u64::from_be_bytes(rbuf.to_vec(i * 8, 8).unwrap().try_into().unwrap());
        assert_eq!(tag as usize, i, "QP {i} delivered its own tag");
        assert_eq!(
            dst.to_vec(i * SLICE, SLICE).unwrap(),
            src.to_vec(i * SLICE, SLICE).unwrap(),
            "slice {i}"
        );
        assert!(!std::mem::replace(&mut seen[i], true));
    }
    for _ in 0..N {
        assert_eq!(cq_c.wait(Some(T)).unwrap().status, WcStatus::Success);
    }
    assert!(clients.iter().all(|c| c.state() == QpState::Rts));
}
