//! `softrdma devices` and `softrdma info`: the providers this build offers,
//! their limits (`verbs::DeviceAttr`) and configuration, all through the device
//! registry (`crate::providers`).

use crate::providers;
use anyhow::Result;
use serde_json::json;
use verbs::{ConfigValue, DeviceAttr, DeviceOptions};

/// List the RDMA devices (providers) this build offers.
#[derive(clap::Args)]
pub struct DevicesArgs {
    /// One JSON object per device instead of the table.
    #[arg(long)]
    json: bool,
}

/// Show a device's attributes and configuration, laid out as `ibv_devinfo` does (`-v`:
/// every attribute, the GID and P_Key tables, the provider's settings and counters).
#[derive(clap::Args)]
pub struct InfoArgs {
    /// Device name (see `softrdma devices`), as ibv_devinfo's -d; the same as --device.
    #[arg(short = 'd', value_name = "NAME", conflicts_with = "device")]
    d: Option<String>,
    /// The device: --provider iwarp|roce, --device NAME, --dev-opt KEY=VALUE.
    #[command(flatten)]
    dev: providers::DeviceArgs,
    /// iWARP: show the configuration with MPA CRC32c requested (refused on other providers).
    #[arg(long, value_parser = ["on", "off"])]
    crc: Option<String>,
    /// Verbose, as ibv_devinfo -v: device limits, every port attribute, GIDs, P_Keys, the
    /// provider's configuration and counters.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// One JSON object instead of text (always everything -v shows).
    #[arg(long)]
    json: bool,
}

/// The attributes a device reports through the verbs API (`ibv_query_device`).
fn attr_of(device: &str, opts: &DeviceOptions) -> Result<DeviceAttr> {
    Ok(providers::registry().open(device, opts)?.attr().clone())
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

/// One port as `ibv_devinfo -v` shows it.
struct Port {
    num: u8,
    attr: verbs::PortAttr,
    gids: Vec<verbs::Gid>,
    pkeys: Vec<u16>,
}

fn ports_of(dev: &verbs::Device) -> Result<Vec<Port>> {
    (1..=dev.phys_port_cnt())
        .map(|num| {
            let attr = dev.query_port(num)?;
            let gids = (0..attr.gid_tbl_len)
                .map(|i| dev.query_gid(num, i))
                .collect::<verbs::Result<_>>()?;
            let pkeys = (0..attr.pkey_tbl_len)
                .map(|i| dev.query_pkey(num, i))
                .collect::<verbs::Result<_>>()?;
            Ok(Port { num, attr, gids, pkeys })
        })
        .collect()
}

fn value_json(v: &ConfigValue) -> serde_json::Value {
    match v {
        ConfigValue::Bool(b) => json!(b),
        ConfigValue::Num(n) => json!(n),
        ConfigValue::Text(t) => json!(t),
        ConfigValue::Null => serde_json::Value::Null,
        ConfigValue::List(l) => json!(l),
    }
}

pub fn run_devices(args: DevicesArgs) -> Result<()> {
    let list = providers::registry().list();
    if args.json {
        for p in &list {
            // Opening a device can fail where listing it cannot (a RoCE device's UDP port
            // 4791 held by another process): the entry stays, its attributes are null.
            let a = attr_of(&p.device, &DeviceOptions::new());
            if let Err(e) = &a {
                tracing::warn!(device = %p.device, "cannot open it for its attributes: {e:#}");
            }
            let a = a.ok();
            println!(
                "{}",
                json!({
                    "name": p.device,
                    "provider": p.provider,
                    "transport": p.transport.as_str(),
                    "description": p.description,
                    "fw_ver": a.as_ref().map(|a| a.fw_ver.clone()),
                    "max_qp": a.as_ref().map(|a| a.max_qp),
                    "max_mr_size": a.as_ref().map(|a| a.max_mr_size),
                    "options": p.params.iter().map(|o| json!({"name": o.name, "default": o.default, "help": o.help})).collect::<Vec<_>>(),
                })
            );
        }
        return Ok(());
    }
    println!("    {:<16} {:<8} {:<11} protocols", "device", "provider", "transport");
    println!("    {:<16} {:<8} {:<11} ---------", "------", "--------", "---------");
    for p in &list {
        println!(
            "    {:<16} {:<8} {:<11} {}",
            p.device,
            p.provider,
            p.transport.as_str(),
            p.description
        );
    }
    Ok(())
}

/// rdma-core's `ibv_transport_type` number of a transport.
fn transport_num(t: verbs::Transport) -> u8 {
    match t {
        verbs::Transport::RoceV2 => 0,
        verbs::Transport::Iwarp => 1,
    }
}

pub fn run_info(args: InfoArgs) -> Result<()> {
    let mut d = args.dev.clone();
    if args.d.is_some() {
        d.device = args.d.clone();
    }
    let (_, f) = providers::chosen(&d)?;
    let flags: Vec<_> = providers::Flag::crc(args.crc.as_deref()).into_iter().collect();
    let dev = providers::open(&d, &flags, providers::Endpoint::Any)?;
    let a = dev.attr().clone();
    let ports = ports_of(&dev)?;
    let config = providers::describe(&d, &flags)?;
    let counters = providers::hw_counters(&dev);
    let roce = f.transport == verbs::Transport::RoceV2;
    if args.json {
        let cfg: serde_json::Map<String, serde_json::Value> = config
            .iter()
            .map(|c| (c.key.to_string(), value_json(&c.value)))
            .collect();
        let ctr: serde_json::Map<String, serde_json::Value> =
            counters.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        println!(
            "{}",
            json!({
                "name": dev.name(),
                "provider": f.provider,
                "transport": f.transport.as_str(),
                "transport_type": transport_num(f.transport),
                "attr": attr_json(&a),
                "phys_port_cnt": dev.phys_port_cnt(),
                "ports": ports.iter().map(|p| json!({
                    "port": p.num,
                    "state": p.attr.state.as_str(),
                    "max_mtu": p.attr.max_mtu.bytes(),
                    "active_mtu": p.attr.active_mtu.bytes(),
                    "link_layer": format!("{:?}", p.attr.link_layer),
                    "lid": p.attr.lid,
                    "sm_lid": p.attr.sm_lid,
                    "gid_tbl_len": p.attr.gid_tbl_len,
                    "pkey_tbl_len": p.attr.pkey_tbl_len,
                    "gids": p.gids.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                    "pkeys": p.pkeys.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "config": cfg,
                "hw_counters": ctr,
            })
        );
        return Ok(());
    }
    // ibv_devinfo's layout (libibverbs/examples/devinfo.c): tab-indented, the same names.
    // Fields our devices have no value for (node_guid, hw_ver, ...) are left out, not faked.
    println!("hca_id:\t{}", dev.name());
    println!(
        "\ttransport:\t\t\t{} ({})",
        f.transport.as_str(),
        transport_num(f.transport)
    );
    println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    println!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    println!("\tphys_port_cnt:\t\t\t{}", dev.phys_port_cnt());
    if args.verbose {
        println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
        println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
        println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
        println!("\tmax_sge:\t\t\t{}", a.max_sge);
        println!("\tmax_sge_rd:\t\t\t{}", a.max_sge_rd);
        println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
        println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
        println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
        println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
        println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
        println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
        println!(
            "\tatomic_cap:\t\t\t{}",
            if a.atomic_cap {
                "ATOMIC_HCA (1)"
            } else {
                "ATOMIC_NONE (0)"
            }
        );
        println!("\tmax_pkeys:\t\t\t{}", ports.first().map_or(0, |p| p.attr.pkey_tbl_len));
        // Not in ibv_devinfo, but in ibv_device_attr_ex / our DeviceAttr.
        println!("\tmax_msg_sz:\t\t\t{:#x}", a.max_msg_sz);
        println!("\tmax_inline_data:\t\t{}", a.max_inline_data);
        println!("\tmax_fast_reg_page_list_len:\t{}", a.max_fast_reg_page_list_len);
    }
    for p in &ports {
        let pa = &p.attr;
        println!("\t\tport:\t{}", p.num);
        println!("\t\t\tstate:\t\t\t{} ({})", pa.state.as_str(), pa.state as u8);
        println!("\t\t\tmax_mtu:\t\t{} ({})", pa.max_mtu.bytes(), pa.max_mtu as u8);
        println!(
            "\t\t\tactive_mtu:\t\t{} ({})",
            pa.active_mtu.bytes(),
            pa.active_mtu as u8
        );
        println!("\t\t\tsm_lid:\t\t\t{}", pa.sm_lid);
        println!("\t\t\tport_lid:\t\t{}", pa.lid);
        println!("\t\t\tport_lmc:\t\t0x00");
        println!("\t\t\tlink_layer:\t\t{:?}", pa.link_layer);
        if args.verbose {
            println!("\t\t\tmax_msg_sz:\t\t{:#x}", a.max_msg_sz);
            println!("\t\t\tpkey_tbl_len:\t\t{}", pa.pkey_tbl_len);
            println!("\t\t\tgid_tbl_len:\t\t{}", pa.gid_tbl_len);
            for (i, g) in p.gids.iter().enumerate() {
                // ibv_devinfo skips unset entries and names the RoCE version.
                if g.0 == [0; 16] {
                    continue;
                }
                println!("\t\t\tGID[{i:>3}]:\t\t{g}{}", if roce { ", RoCE v2" } else { "" });
            }
            for (i, k) in p.pkeys.iter().enumerate() {
                println!("\t\t\tP_Key[{i:>3}]:\t\t{k:#06x}");
            }
        }
        println!();
    }
    if args.verbose {
        println!("\tprovider:\t\t\t{} ({})", f.provider, f.description);
        println!("\tconfiguration:");
        for c in &config {
            println!("\t\t{:<32}{}", format!("{}:", c.label), c.text);
        }
        if !counters.is_empty() {
            println!("\thw_counters:");
            for (k, v) in &counters {
                println!("\t\t{:<32}{v}", format!("{k}:"));
            }
        }
    }
    Ok(())
}
