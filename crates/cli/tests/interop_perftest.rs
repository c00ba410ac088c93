//! `softrdma perftest` against linux-rdma perftest 6.06 (Debian 4.5+0.17) in rdma_cm mode (`-R`)
//! over the kernel's soft-iWARP in the QEMU lab (`../shared/lab`, issue 6): each of
//! `ib_send_bw`, `ib_write_bw`, `ib_read_bw`, `ib_send_lat`, `ib_write_lat`, `ib_read_lat` with
//! perftest as the server in the guest and our client in the lab's namespace, and the other way
//! round. Every case checks both exit statuses, both result lines (bytes and iterations, and
//! where perftest prints the other side's figures, that they are ours), and that the guest
//! kernel logged no BUG/WARNING/Oops and has no new taint. docs/interop-perftest.md has the
//! exchange and the figures.
//!
//! Requirements exercised against a foreign implementation: RDMAP-WR-01/02 (Writes placed, no
//! receive consumed: the write tests), RDMAP-RD-01 (Read Request/Response: the read tests),
//! RDMAP-SND-01/02/03 (Sends consume one receive each, lengths reported, in order: the send
//! tests and the whole comm exchange), RDMAP-LLP-02 (4 KiB messages as DDP segments).
//!
//! Gate as `interop_siw.rs`: `SOFTRDMA_INTEROP=0` skips, unset uses a lab that is built
//! (`/var/tmp/rdmalab/vmlinuz`), `=1` also builds it, `=require` turns a skip into a failure.
//! Each case holds the lab (`common/lab.rs`: process mutex + flock), so `--test-threads=1` or
//! not, one case at a time uses the guest.

#[path = "common/child.rs"]
mod child;
#[path = "common/lab.rs"]
mod lab_common;
#[macro_use]
#[path = "common/perftest.rs"]
mod perftest_common;

use lab_common::{acquire, bring_up_siw, vm_exec};
use perftest_common::{Case, ITERS, Path, SIZE};
use std::path::PathBuf;

/// The siw path: the guest's siw0 on 192.168.77.2, our end 192.168.77.1 (iWARP, the
/// default provider). A guest listener is a kernel TCP socket.
const SIW: Path = Path {
    dev: "siw0",
    guest_ip: "192.168.77.2",
    host_ip: "192.168.77.1",
    ours: &[],
    guest_listening: "ss -tln | grep -q ':{p} '",
    transport: "IW",
    ports: (18600, 400),
    log: "pt",
};

/// The siw lab, with perftest in the guest.
fn bring_up() -> Result<PathBuf, String> {
    let dir = bring_up_siw()?;
    // `ib_write_bw --version` exits with status 1 (VERSION_EXIT is returned as FAILURE).
    let (_, out) = vm_exec(&dir, "ib_write_bw --version", 20);
    if !out.contains("Version: ") {
        return Err(format!("perftest is not in the guest: {out}"));
    }
    Ok(dir)
}

/// One case (`name`): `ib_{test} -R` over siw0 as `c.perftest`, softrdma the other end.
fn case(name: &str, c: &Case) {
    let Some(lab) = acquire(name, "kernel siw + perftest interop lab", bring_up) else {
        return;
    };
    lab.kernel_check_init();
    SIW.case(&lab, c);
}

perftest_cases! {
    // perftest server in the guest, softrdma client
    write_bw_kernel_server_our_client: "write_bw", Server, Rc, Some(&format!("verified: {ITERS} RDMA Write completions"));
    read_bw_kernel_server_our_client: "read_bw", Server, Rc, Some(&format!("verified: {ITERS} RDMA Read completions"));
    /// P2 (docs/interop-perftest.md): over iWARP ib_send_bw's receiver grants credits by RDMA
    /// Write into the sender's credit word; without them we would stall after rx_depth Sends.
    send_bw_kernel_server_our_client: "send_bw", Server, Rc, Some("credits from the receiver");
    send_lat_kernel_server_our_client: "send_lat", Server, Rc, None;
    /// ib_write_lat has no closing exchange: P3's teardown order matters most here.
    write_lat_kernel_server_our_client: "write_lat", Server, Rc, Some("sequence byte checked");
    read_lat_kernel_server_our_client: "read_lat", Server, Rc, None;

    // softrdma server, perftest client in the guest
    write_bw_our_server_kernel_client: "write_bw", Client, Rc, None;
    read_bw_our_server_kernel_client: "read_bw", Client, Rc, None;
    send_bw_our_server_kernel_client: "send_bw", Client, Rc, Some(&format!("verified: {ITERS} receives of {SIZE} bytes"));
    send_lat_our_server_kernel_client: "send_lat", Client, Rc, None;
    write_lat_our_server_kernel_client: "write_lat", Client, Rc, None;
    read_lat_our_server_kernel_client: "read_lat", Client, Rc, Some("the client measures");
}
