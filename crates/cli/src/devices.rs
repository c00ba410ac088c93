//! `softrdma devices` and `softrdma info`: the providers this build offers,
//! their limits (`verbs::DeviceAttr`) and configuration, all through the device
//! registry (`crate::providers`).

use crate::providers;
use anyhow::{Result, bail};
use serde_json::json;
use verbs::{ConfigValue, DeviceAttr, DeviceOptions};

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

/// The attributes a device reports through the verbs API (`ibv_query_device`).
fn attr_of(device: &str, opts: &DeviceOptions) -> Result<DeviceAttr> {
    Ok(providers::open(Some(device), opts)?.attr().clone())
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
            let a = attr_of(&p.device, &DeviceOptions::new())?;
            println!(
                "{}",
                json!({
                    "name": p.device,
                    "provider": p.provider,
                    "transport": p.transport.as_str(),
                    "description": p.description,
                    "fw_ver": a.fw_ver,
                    "max_qp": a.max_qp,
                    "max_mr_size": a.max_mr_size,
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

pub fn run_info(args: InfoArgs) -> Result<()> {
    let reg = providers::registry();
    let f = match &args.device {
        None => reg
            .list()
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("this build offers no device"))?,
        Some(n) => match reg.find(n) {
            Ok(f) => f.info(),
            Err(e) => bail!("{e} (see `softrdma devices`)"),
        },
    };
    let opts = providers::crc(args.crc == "on");
    let dev = providers::open(Some(&f.device), &opts)?;
    let a = dev.attr().clone();
    let ports = ports_of(&dev)?;
    let config = reg.find(&f.device)?.describe(&opts)?;
    if args.json {
        let cfg: serde_json::Map<String, serde_json::Value> = config
            .iter()
            .map(|c| (c.key.to_string(), value_json(&c.value)))
            .collect();
        println!(
            "{}",
            json!({
                "name": f.device,
                "provider": f.provider,
                "transport": f.transport.as_str(),
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
                    "gids": p.gids.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                    "pkeys": p.pkeys.iter().map(|k| format!("{k:#06x}")).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "config": cfg,
            })
        );
        return Ok(());
    }
    println!("hca_id: {}", f.device);
    println!("        provider:                       {}", f.provider);
    println!(
        "        transport:                      {} ({})",
        f.transport.as_str(),
        f.description
    );
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
        if a.atomic_cap { "FetchAdd, CmpSwap" } else { "none" }
    );
    println!("        phys_port_cnt:                  {}", dev.phys_port_cnt());
    for p in &ports {
        let a = &p.attr;
        println!("                port:   {}", p.num);
        println!(
            "                        state:                  {} ({})",
            a.state.as_str(),
            a.state as u8
        );
        println!(
            "                        max_mtu:                {} ({})",
            a.max_mtu.bytes(),
            a.max_mtu as u8
        );
        println!(
            "                        active_mtu:             {} ({})",
            a.active_mtu.bytes(),
            a.active_mtu as u8
        );
        println!("                        sm_lid:                 {}", a.sm_lid);
        println!("                        port_lid:               {}", a.lid);
        println!("                        link_layer:             {:?}", a.link_layer);
        for (i, g) in p.gids.iter().enumerate() {
            println!("                        GID[{i:>3}]:               {g}");
        }
        for (i, k) in p.pkeys.iter().enumerate() {
            println!("                        P_Key[{i:>3}]:             {k:#06x}");
        }
    }
    println!("    configuration:");
    for c in &config {
        println!("        {:<32}{}", format!("{}:", c.label), c.text);
    }
    Ok(())
}
