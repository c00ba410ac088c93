//! `softrdma smc stat` reads another process's SMC-R state (issue 15 item 5): this test
//! process makes a link group (an `SmcStream` pair over two soft RoCEv2 devices on
//! 127.115.30.x) and a fallback connection, publishes its stats socket in a temporary
//! directory (`smc::stats::Publisher`), and the CLI, a separate process, prints them as
//! text and as JSON.

use serde_json::Value;
use smc::{Mode, SmcConfig, SmcListener, SmcStream};
use std::io::{Read, Write};
use std::process::Command;
use verbs::{DeviceFactory, DeviceOptions};

const BIN: &str = env!("CARGO_BIN_EXE_softrdma");

#[test]
fn smc_stat_shows_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let _p = smc::stats::Publisher::start(dir.path()).unwrap();
    let dev = |a: &str| {
        roce::RoceFactory
            .open(&DeviceOptions::new().with("addr", a).with("name", format!("smc_{a}")))
            .unwrap()
    };
    let (da, db) = (dev("127.115.30.1"), dev("127.115.30.2"));
    let cfg = SmcConfig {
        prefix_len: 8,
        ..SmcConfig::default()
    };
    let l = SmcListener::bind_with("127.115.30.1:0", &da, cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let srv = std::thread::spawn(move || (l.accept().unwrap().0, l.accept().unwrap().0));
    let mut c = SmcStream::connect_with(addr, &db, &cfg).unwrap();
    let _plain = SmcStream::connect_with(addr, &db, &SmcConfig { propose: false, ..cfg }).unwrap();
    let (mut s, fb) = srv.join().unwrap();
    assert_eq!(c.mode(), Mode::SmcR);
    assert!(matches!(fb.mode(), Mode::Fallback(_)));
    c.write_all(&[7u8; 4096]).unwrap();
    let mut b = vec![0u8; 4096];
    s.read_exact(&mut b).unwrap();

    let d = dir.path().to_str().unwrap();
    let out = Command::new(BIN).args(["smc", "stat", "--dir", d]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("process {}", std::process::id())), "{text}");
    assert!(text.contains("link group") && text.contains("SMCR"), "{text}");
    assert!(text.contains("peer did not indicate SMC (0x03010000)"), "{text}");

    let out = Command::new(BIN)
        .args(["smc", "stat", "--json", "--dir", d])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v.as_array().unwrap()[0];
    assert_eq!(p["pid"], std::process::id());
    let groups = p["link_groups"].as_array().unwrap();
    let g = groups
        .iter()
        .find(|g| g["id"] == c.link_group().unwrap())
        .expect("client group");
    assert_eq!(g["role"], "client");
    assert_eq!(g["links"][0]["state"], "active");
    assert_eq!(g["links"][0]["local_gid"], "::ffff:127.115.30.2");
    let conns = p["connections"].as_array().unwrap();
    assert!(conns.iter().any(|x| x["mode"] == "SMCR" && x["bytes_sent"] == 4096));
    assert!(conns.iter().any(|x| x["mode"] == "SMCR" && x["bytes_received"] == 4096));
    assert!(
        conns
            .iter()
            .any(|x| x["mode"] == "TCP" && x["fallback_code"] == 0x0301_0000)
    );
    assert!(p["resources"]["qps"].as_u64().unwrap() >= 2);
    drop(fb);
}
