//! Checks of `softrdma nfs probe --json` output, shared by the loopback test (`nfs.rs`) and the
//! lab test (`nfs_interop.rs`).

/// Asserts the probe's verdict and, case by case, its name, how its observation starts and how
/// many reconnects it took, and that the client worked afterwards (`client_ok`: a plain call
/// succeeded, and a retransmitted READ's data equalled a plain READ's). Returns the file the
/// stale-read-handle case wrote (`/dir/softrdma-probe-PID` below the export), if it ran.
pub fn check(v: &serde_json::Value, want: &[(&str, &str, u64)]) -> Option<String> {
    assert_eq!(v["ok"], true, "{v:#}");
    let cases = v["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), want.len(), "{v:#}");
    for (c, (name, observed, reconnects)) in cases.iter().zip(want) {
        assert_eq!(c["case"], *name);
        assert!(c["observed"].as_str().unwrap().starts_with(observed), "{c:#}");
        assert_eq!(c["reconnects"], *reconnects, "{c:#}");
        assert_eq!(c["client_ok"], true, "{c:#}");
    }
    cases
        .iter()
        .find(|c| c["case"] == "stale-read-handle")
        .and_then(|c| c["observed"].as_str())
        .and_then(|o| o.rsplit_once("(file "))
        .map(|(_, f)| f.trim_end_matches(')').to_string())
}
