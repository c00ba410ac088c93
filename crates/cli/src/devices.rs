//! `softrdma devices` and `softrdma info`: the providers this build offers,
//! their limits (`verbs::DeviceAttr`) and configuration (`iwarp::IwarpConfig`).

use anyhow::{Result, bail};
use serde_json::json;
use verbs::DeviceAttr;

/// List the RDMA devices (providers) this build offers.
#[derive(clap::Args)]
pub struct DevicesArgs {
    /// One JSON object per device instead of the table.
    #[arg(long)]
    json: bool,
}

/// Show a device's attributes (ibv_devinfo -v style) and configuration.
#[derive(clap::Args)]
pub struct InfoArgs {
    /// Device name (see `softrdma devices`); default: the first one.
    #[arg(long, short = 'd')]
    device: Option<String>,
    /// Show the configuration with MPA CRC32c requested.
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    crc: String,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// One device of this build: its provider configuration.
struct Entry {
    provider: &'static str,
    transport: &'static str,
    cfg: iwarp::IwarpConfig,
}

fn entries(crc: bool) -> Vec<Entry> {
    vec![Entry {
        provider: "iwarp",
        transport: "iWARP (RDMAP RFC 5040/7306, DDP RFC 5041, MPA RFC 5044/6581) over kernel TCP",
        cfg: iwarp::IwarpConfig {
            crc,
            ..Default::default()
        },
    }]
}

/// The attributes as the provider reports them through the verbs API.
fn attr_of(e: &Entry) -> Result<DeviceAttr> {
    let dev = iwarp::open_device(e.cfg.clone())?;
    Ok(dev.attr().clone())
}

fn attr_json(a: &DeviceAttr) -> serde_json::Value {
    json!({
        "fw_ver": a.fw_ver,
        "vendor_id": a.vendor_id,
        "max_qp": a.max_qp,
        "max_qp_wr": a.max_qp_wr,
        "max_sge": a.max_sge,
        "max_sge_rd": a.max_sge_rd,
        "max_cq": a.max_cq,
        "max_cqe": a.max_cqe,
        "max_mr": a.max_mr,
        "max_mr_size": a.max_mr_size,
        "max_pd": a.max_pd,
        "max_qp_rd_atom": a.max_qp_rd_atom,
        "max_qp_init_rd_atom": a.max_qp_init_rd_atom,
        "max_msg_sz": a.max_msg_sz,
        "max_inline_data": a.max_inline_data,
        "max_fast_reg_page_list_len": a.max_fast_reg_page_list_len,
        "atomic_cap": a.atomic_cap,
    })
}

fn config_json(c: &iwarp::IwarpConfig) -> serde_json::Value {
    json!({
        "crc": c.crc,
        "mpa_revision": c.mpa_revision,
        "markers": if c.reject_markers { "refused" } else { "never requested; inserted if the peer requires them" },
        "reject_markers": c.reject_markers,
        "p2p": c.p2p.as_ref().map(|v| v.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>()),
        "max_private_data": c.max_private_data,
        "reply_timeout_ms": c.reply_timeout.as_millis() as u64,
        "request_timeout_ms": c.request_timeout.as_millis() as u64,
        "terminate_siw_form": c.terminate_siw_form,
        "max_ulpdu": c.max_ulpdu,
    })
}

pub fn run_devices(args: DevicesArgs) -> Result<()> {
    let es = entries(false);
    if args.json {
        for e in &es {
            let a = attr_of(e)?;
            println!(
                "{}",
                json!({
                    "name": e.cfg.name,
                    "provider": e.provider,
                    "transport": e.transport,
                    "fw_ver": a.fw_ver,
                    "max_qp": a.max_qp,
                    "max_mr_size": a.max_mr_size,
                })
            );
        }
        return Ok(());
    }
    println!("    {:<16} {:<8} transport", "device", "provider");
    println!("    {:<16} {:<8} ---------", "------", "--------");
    for e in &es {
        println!("    {:<16} {:<8} {}", e.cfg.name, e.provider, e.transport);
    }
    Ok(())
}

pub fn run_info(args: InfoArgs) -> Result<()> {
    let es = entries(args.crc == "on");
    let e = match &args.device {
        None => &es[0],
        Some(n) => match es.iter().find(|e| &e.cfg.name == n) {
            Some(e) => e,
            None => bail!("no device {n:?} (see `softrdma devices`)"),
        },
    };
    let a = attr_of(e)?;
    if args.json {
        println!(
            "{}",
            json!({
                "name": e.cfg.name,
                "provider": e.provider,
                "transport": e.transport,
                "attr": attr_json(&a),
                "config": config_json(&e.cfg),
            })
        );
        return Ok(());
    }
    let c = &e.cfg;
    println!("hca_id: {}", c.name);
    println!("        provider:                       {}", e.provider);
    println!("        transport:                      {}", e.transport);
    println!("        fw_ver:                         {}", a.fw_ver);
    println!("        vendor_id:                      {:#x}", a.vendor_id);
    println!("        max_qp:                         {}", a.max_qp);
    println!("        max_qp_wr:                      {}", a.max_qp_wr);
    println!("        max_sge:                        {}", a.max_sge);
    println!("        max_sge_rd:                     {}", a.max_sge_rd);
    println!("        max_cq:                         {}", a.max_cq);
    println!("        max_cqe:                        {}", a.max_cqe);
    println!("        max_mr:                         {}", a.max_mr);
    println!("        max_mr_size:                    {:#x}", a.max_mr_size);
    println!("        max_pd:                         {}", a.max_pd);
    println!("        max_qp_rd_atom (IRD):           {}", a.max_qp_rd_atom);
    println!("        max_qp_init_rd_atom (ORD):      {}", a.max_qp_init_rd_atom);
    println!("        max_msg_sz:                     {:#x}", a.max_msg_sz);
    println!("        max_inline_data:                {}", a.max_inline_data);
    println!(
        "        max_fast_reg_page_list_len:     {}",
        a.max_fast_reg_page_list_len
    );
    println!(
        "        atomic_cap:                     {}",
        if a.atomic_cap {
            "RFC 7306 FetchAdd, CmpSwap"
        } else {
            "none"
        }
    );
    println!("    configuration:");
    println!(
        "        MPA CRC32c:                     {}",
        if c.crc {
            "requested (used if either side asks)"
        } else {
            "not requested (used if the peer asks)"
        }
    );
    println!(
        "        MPA revision:                   {} ({})",
        c.mpa_revision,
        if c.mpa_revision >= 2 {
            "RFC 6581, enhanced connection setup"
        } else {
            "RFC 5044"
        }
    );
    println!(
        "        markers:                        {}",
        if c.reject_markers {
            "peers requiring markers are refused"
        } else {
            "not requested; inserted if the peer requires them"
        }
    );
    println!(
        "        peer-to-peer (RTR):             {}",
        match &c.p2p {
            None => "off".to_string(),
            Some(v) => format!("on, RTR types {v:?}"),
        }
    );
    println!("        max ULPDU (FPDU payload):       {} bytes", c.max_ulpdu);
    println!("        max private data accepted:      {} bytes", c.max_private_data);
    println!("        MPA Reply timeout (initiator):  {:?}", c.reply_timeout);
    println!("        MPA Request timeout (responder):{:?}", c.request_timeout);
    println!(
        "        Terminate bit order:            {}",
        if c.terminate_siw_form {
            "Linux siw's"
        } else {
            "RFC 5040's"
        }
    );
    Ok(())
}
