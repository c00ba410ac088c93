//! `softrdma demo`: every iWARP operation between two QPs over loopback TCP, explained.

use anyhow::{Context, Result, bail};
use std::time::{Duration, Instant};
use verbs::*;

/// Walk through each RDMA operation between two queue pairs over loopback
/// TCP, in one process, printing what happens on the wire and in the
/// completion queues, then a short bandwidth run.
#[derive(clap::Args)]
pub struct Args {
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: crate::providers::DeviceArgs,
    /// iWARP: negotiate MPA CRC32c on the connection (refused on other providers).
    #[arg(long, value_parser = ["on", "off"])]
    crc: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    let flags: Vec<_> = crate::providers::Flag::crc(args.crc.as_deref()).into_iter().collect();
    let here = std::net::IpAddr::from([127, 0, 0, 1]);
    let dev = crate::providers::open(&args.dev, &flags, crate::providers::Endpoint::Listen(here))?;
    demo(dev)
}

const T: Duration = Duration::from_secs(10);

fn expect(cq: &CompletionQueue, what: &str) -> Result<WorkCompletion> {
    cq.wait(Some(T))
        .with_context(|| format!("no completion for {what} within {T:?}"))
}

fn demo(dev: Device) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let listener = dev.listen("127.0.0.1:0".parse()?)?;
    let addr = listener.local_addr();
    println!(
        "device {}: listening on {addr} ({})",
        dev.name(),
        crate::providers::label(&dev)
    );
    let (cq_c, cq_s) = (dev.create_cq(1024)?, dev.create_cq(1024)?);
    let (pd2, cqs2) = (pd.clone(), cq_s.clone());
    let server = std::thread::spawn(move || -> Result<QueuePair> {
        let req = listener.get_request(Some(T))?;
        println!(
            "server: connect request from {} with private data {:?}, IRD {} ORD {}",
            req.peer_addr(),
            String::from_utf8_lossy(req.private_data()),
            req.param().responder_resources,
            req.param().initiator_depth
        );
        Ok(req.accept(&pd2, QpOptions::new(&cqs2).rd_atomic(16, 16).private_data(b"welcome"))?)
    });
    let client = pd.connect(
        addr,
        QpOptions::new(&cq_c)
            .rd_atomic(16, 16)
            .private_data(b"hello from the demo"),
        T,
    )?;
    let server = server.join().map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    println!("client: connected, {}", client.conn_info().detail);

    let mc = pd.reg_mr(1 << 20, Access::all_remote())?;
    let ms = pd.reg_mr(1 << 20, Access::all_remote())?;
    println!(
        "registered two 1 MiB regions: client STag {:#010x}, server STag {:#010x}",
        mc.rkey(),
        ms.rkey()
    );

    // Send
    server.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: vec![ms.sge(0, 4096)],
    }])?;
    mc.write(0, b"Hello over RDMAP Send")?;
    client.post_send_one(SendWr::new(1, WrOpcode::Send, vec![mc.sge(0, 21)]))?;
    expect(&cq_c, "Send")?;
    let wc = expect(&cq_s, "receive")?;
    println!(
        "Send: server received {} bytes: {:?}",
        wc.byte_len,
        String::from_utf8_lossy(&ms.to_vec(0, wc.byte_len as usize)?)
    );

    // Send with Invalidate of a fast-registered STag on the server.
    let fr = pd.alloc_mr(4096)?;
    let key = 0x5a;
    server.post_send_one(SendWr::new(
        9,
        WrOpcode::RegMr {
            mr_stag: fr.lkey(),
            key,
            source_lkey: ms.lkey(),
            source_addr: ms.addr() + 8192,
            length: 4096,
            iova: 0x1_0000,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        },
        vec![],
    ))?;
    expect(&cq_s, "fast register")?;
    let fr_stag = fr.stag_with_key(key);
    server.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: vec![ms.sge(0, 64)],
    }])?;
    client.post_send_one(SendWr::new(
        2,
        WrOpcode::SendWithInv {
            invalidate_rkey: fr_stag,
        },
        vec![mc.sge(0, 5)],
    ))?;
    expect(&cq_c, "Send with Invalidate")?;
    let wc = expect(&cq_s, "receive")?;
    println!(
        "Send with Invalidate: server's receive completion says STag {:#010x} was invalidated",
        wc.invalidated_rkey.unwrap_or(0)
    );

    // Write
    mc.write(4096, b"placed directly by RDMA Write")?;
    let remote = RemoteAddr {
        addr: ms.addr() + 4096,
        rkey: ms.rkey(),
    };
    client.post_send_one(SendWr::new(3, WrOpcode::RdmaWrite { remote }, vec![mc.sge(4096, 29)]))?;
    expect(&cq_c, "Write")?;
    // A local Write completion means "handed to the wire", not "placed"; a
    // following Read is answered only after the Write was placed (RFC 5040 §5.5 rule 12).
    client.post_send_one(SendWr::new(30, WrOpcode::RdmaRead { remote }, vec![mc.sge(8192, 1)]))?;
    expect(&cq_c, "fencing Read")?;
    println!(
        "RDMA Write: server memory now holds {:?} (no receive consumed)",
        String::from_utf8_lossy(&ms.to_vec(4096, 29)?)
    );

    // Read
    ms.write(16384, b"fetched by RDMA Read")?;
    let remote = RemoteAddr {
        addr: ms.addr() + 16384,
        rkey: ms.rkey(),
    };
    client.post_send_one(SendWr::new(4, WrOpcode::RdmaRead { remote }, vec![mc.sge(16384, 20)]))?;
    let wc = expect(&cq_c, "Read")?;
    println!(
        "RDMA Read: client received {} bytes {:?}",
        wc.byte_len,
        String::from_utf8_lossy(&mc.to_vec(16384, 20)?)
    );

    // Write with immediate
    server.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: vec![],
    }])?;
    let remote = RemoteAddr {
        addr: ms.addr() + 20000,
        rkey: ms.rkey(),
    };
    client.post_send_one(SendWr::new(
        5,
        WrOpcode::RdmaWriteWithImm {
            remote,
            imm_data: 0xC0FFEE,
        },
        vec![mc.sge(0, 5)],
    ))?;
    expect(&cq_c, "Write with immediate")?;
    let wc = expect(&cq_s, "immediate")?;
    println!(
        "RDMA Write with immediate (RFC 7306): server completion {:?} with immediate data {:#x}",
        wc.opcode,
        wc.imm_data.unwrap_or(0)
    );

    // Atomic
    ms.write(32768, &40u64.to_ne_bytes())?;
    let remote = RemoteAddr {
        addr: ms.addr() + 32768,
        rkey: ms.rkey(),
    };
    client.post_send_one(SendWr::new(
        6,
        WrOpcode::AtomicFetchAdd { remote, add: 2 },
        vec![mc.sge(32768, 8)],
    ))?;
    expect(&cq_c, "FetchAdd")?;
    let old = u64::from_ne_bytes(mc.to_vec(32768, 8)?.try_into().unwrap());
    let new = u64::from_ne_bytes(ms.to_vec(32768, 8)?.try_into().unwrap());
    println!("Atomic FetchAdd (RFC 7306): returned the original {old}, server memory is now {new}");

    // Bandwidth before we break the connection.
    let len = 1 << 20;
    let iters = 512;
    let remote = RemoteAddr {
        addr: ms.addr(),
        rkey: ms.rkey(),
    };
    let start = Instant::now();
    let mut inflight = 0;
    for i in 0..iters {
        client.post_send_one(SendWr::new(
            100 + i,
            WrOpcode::RdmaWrite { remote },
            vec![mc.sge(0, len as u32)],
        ))?;
        inflight += 1;
        if inflight == 8 {
            expect(&cq_c, "Write")?;
            inflight -= 1;
        }
    }
    while inflight > 0 {
        expect(&cq_c, "Write")?;
        inflight -= 1;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "bandwidth: {iters} RDMA Writes of 1 MiB in {:.3} s = {:.2} GB/s ({:.1} Gbit/s)",
        secs,
        (iters * len) as f64 / secs / 1e9,
        (iters * len) as f64 * 8.0 / secs / 1e9
    );

    // A Read that hits a bad STag: the server answers with a Terminate.
    let bogus = RemoteAddr {
        addr: 0x1000,
        rkey: 0xbad0_0000,
    };
    client.post_send_one(SendWr::new(7, WrOpcode::RdmaRead { remote: bogus }, vec![mc.sge(0, 8)]))?;
    let wc = expect(&cq_c, "bad Read")?;
    println!("RDMA Read of a bad STag: client completion status \"{}\"", wc.status);
    let _ = client.get_event(Some(T)); // Established
    match client.get_event(Some(T)) {
        Some(CmEvent::ErrorReceived(d)) => println!("client: fatal error received from the server: {d}"),
        other => bail!("expected the server's fatal error (a Terminate), got {other:?}"),
    }
    println!(
        "client QP state is now {:?}; the server's other work carries on. Done.",
        client.state()
    );
    Ok(())
}
