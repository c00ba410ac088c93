//! `softrdma perftest --provider roce` against linux-rdma perftest 6.06 in rdma_cm mode (`-R`)
//! over the kernel's soft-RoCE (rxe0) in the QEMU lab (`../shared/lab`, issue 13): each of
//! `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`, `ib_write_lat`, `ib_read_lat`
//! with perftest as the server in the guest and our client in the lab's namespace, and the
//! other way round; the same checks as the siw file (`common/perftest.rs`), and the guest
//! kernel logs no BUG/WARNING/Oops. The IB CM runs on QP1 (REQ/REP/RTU, DREQ/DREP), the
//! data on RC QPs over UDP 4791.
//!
//! Routing in the guest without deleting siw0 (docs/roce.md, "Reaching the guest's rxe0"):
//! perftest's server listens on the wildcard address, so our REQ to 192.168.77.2 reaches its
//! cm_id on rxe0; perftest's client connects to 192.168.78.1 over the guest's eth0.78, an
//! address only rxe0 has a GID for (`scripts/lab-rxe-path.sh`, run by `lab()`).
//! Over the IB transport ib_send_bw runs without the iWARP credit Writes (`send_rcredit` is
//! for `IBV_TRANSPORT_IWARP` only): the receiver's RNR NAKs pace the sender.
//!
//! UD (issue 14): `ib_send_bw -c UD -R` and `ib_send_lat -c UD -R`, both ways, 1024 octets
//! (the path MTU) × 100. The data QP is resolved by SIDR in rdma_cm's UDP port space; for
//! send_lat the client's QPN goes in a Send with immediate from which the server makes its
//! AH (`ibv_create_ah_from_wc`). With 100 iterations every receive is posted before the
//! traffic (rx_depth is min(512, iters)), so no datagram can find an empty receive queue.
//!
//! Requirement IDs: `../shared/requirements/smcr-ipoibcm.md` C1 (IB CM with a foreign
//! rdma_cm; SIDR), C2 (UD Sends against rxe), C3 (RC over RoCEv2: Send, RDMA Write, RDMA
//! Read against rxe), D3.
//! Gate as `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, `require` turns a skip into a failure.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[macro_use]
#[path = "common/perftest.rs"]
mod perftest_common;
#[path = "common/rxe_path.rs"]
mod rxe_path;

use lab_common::{Lab, acquire, bring_up_siw, vm_exec};
use perftest_common::{Case, ITERS, Path, SIZE, UD_SIZE};
use rxe_path::{HOST_RXE_IP, rxe_path_up};
use std::path::PathBuf;

/// The rxe path: our client to the guest's eth0 address (perftest's server listens on the
/// wildcard address, so our REQ/SIDR_REQ reaches its cm_id on rxe0); perftest's client to
/// our server on 192.168.78.1, which only rxe0 can reach.
const RXE: Path = Path {
    dev: "rxe0",
    guest_ip: "192.168.77.2",
    host_ip: HOST_RXE_IP,
    ours: &["--provider", "roce"],
    guest_listening: "rdma res show cm_id | grep -q 'rxe0/.*LISTEN.*:{p} '",
    transport: "IB",
    ports: (19600, 400),
    log: "px",
};

/// The lab with rxe0 active and perftest in the guest.
fn bring_up() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    let (rc, out) = vm_exec(&dir, "rdma link show | grep -q 'rxe0/1 state ACTIVE' && echo ok", 20);
    if rc != 0 || !out.contains("ok") {
        return Err(format!("rxe0 is not active in the guest: {out}"));
    }
    // `ib_write_bw --version` exits with status 1 (VERSION_EXIT is returned as FAILURE).
    let (_, out) = vm_exec(&dir, "ib_write_bw --version", 20);
    if !out.contains("Version: ") {
        return Err(format!("perftest is not in the guest: {out}"));
    }
    Ok(dir)
}

fn lab(test: &str) -> Option<Lab> {
    let lab = acquire(test, "kernel rxe + perftest interop lab", bring_up)?;
    if let Err(why) = rxe_path_up(&lab.dir) {
        panic!("{test}: the lab is up but its path to rxe0 is not: {why}");
    }
    lab.kernel_check_init();
    Some(lab)
}

/// One case (`name`): `ib_{test} -R` over rxe0 as `c.perftest`, softrdma the other end.
fn case(name: &str, c: &Case) {
    let Some(lab) = lab(name) else {
        return;
    };
    RXE.case(&lab, c);
}

perftest_cases! {
    // perftest server in the guest (rxe0), softrdma client
    /// C3: RDMA Writes placed in rxe's memory, each completion verified.
    write_bw_rxe_server_our_client: "write_bw", Server, Rc, Some(&format!("verified: {ITERS} RDMA Write completions"));
    /// C3: RDMA Read Requests answered by rxe, 128 outstanding.
    read_bw_rxe_server_our_client: "read_bw", Server, Rc, Some(&format!("verified: {ITERS} RDMA Read completions"));
    /// C3: Sends without credit Writes (IB transport): rxe's RNR NAKs pace us.
    send_bw_rxe_server_our_client: "send_bw", Server, Rc, Some(&format!("verified: {ITERS} Send completions\n"));
    send_lat_rxe_server_our_client: "send_lat", Server, Rc, None;
    write_lat_rxe_server_our_client: "write_lat", Server, Rc, Some("sequence byte checked");
    read_lat_rxe_server_our_client: "read_lat", Server, Rc, None;
    /// C1, C2, D3: SIDR to rxe's UD listener, then 100 datagrams of the MTU to its QP.
    ud_send_bw_rxe_server_our_client: "send_bw", Server, Ud, Some(&format!("verified: {ITERS} Send completions\n"));
    /// C1, C2, D3: our QPN by Send with immediate; rxe answers to the AH it makes from it.
    ud_send_lat_rxe_server_our_client: "send_lat", Server, Ud, Some(&format!("verified: {ITERS} Sends each way"));

    // softrdma server, perftest client in the guest (rxe0 over eth0.78)
    write_bw_our_server_rxe_client: "write_bw", Client, Rc, None;
    read_bw_our_server_rxe_client: "read_bw", Client, Rc, None;
    send_bw_our_server_rxe_client: "send_bw", Client, Rc, Some(&format!("verified: {ITERS} receives of {SIZE} bytes"));
    send_lat_our_server_rxe_client: "send_lat", Client, Rc, None;
    write_lat_our_server_rxe_client: "write_lat", Client, Rc, None;
    read_lat_our_server_rxe_client: "read_lat", Client, Rc, Some("the client measures");
    /// C1, C2, D3: rxe's SIDR_REQ answered, 100 datagrams received with their GRH area.
    ud_send_bw_our_server_rxe_client: "send_bw", Client, Ud, Some(&format!("verified: {ITERS} receives of {UD_SIZE} bytes"));
    /// C1, C2, D3: rxe's QPN datagram gives our AH (from the completion and the GRH).
    ud_send_lat_our_server_rxe_client: "send_lat", Client, Ud, Some(&format!("verified: {ITERS} Sends each way"));
}
