//! Layering check (issue "One verbs API for every RDMA transport"): the CLI and
//! the upper layers reach providers only through the verbs API and the device
//! registry. Provider crates may be named in exactly one place, the module that
//! registers them (crates/cli/src/providers.rs); rpcrdma may not depend on a
//! provider outside its tests.

use std::path::{Path, PathBuf};

const PROVIDER_CRATES: &[&str] = &["iwarp", "roce"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of code (not comments) that name a provider crate as a path.
fn provider_uses(src: &str) -> Vec<(usize, String)> {
    let mut hits = Vec::new();
    for (n, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for c in PROVIDER_CRATES {
            let path = format!("{c}::");
            let is_use = code.trim_start().starts_with(&format!("use {c}"));
            let named = code.match_indices(&path).any(|(i, _)| {
                // `foo_iwarp::` or `x.iwarp::` are other names, not the crate.
                i == 0 || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_'
            });
            if is_use || named {
                hits.push((n + 1, line.trim().to_string()));
            }
        }
    }
    hits
}

#[test]
fn finder_sees_a_provider_path() {
    // The check must be able to fail: these lines name the crate, the last two do not.
    assert_eq!(provider_uses("let d = iwarp::open_device(c);").len(), 1);
    assert_eq!(provider_uses("use iwarp::IwarpConfig;").len(), 1);
    assert_eq!(provider_uses("    x(roce::Cfg::default())").len(), 1);
    assert!(provider_uses("// iwarp::open_device in a comment").is_empty());
    assert!(provider_uses("let my_iwarp::x = 1; softiwarp::y").is_empty());
}

#[test]
fn cli_and_rpcrdma_name_no_provider_outside_the_registry() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    rust_files(&root.join("crates/cli/src"), &mut files);
    rust_files(&root.join("crates/rpcrdma/src"), &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut bad = Vec::new();
    for f in &files {
        if f.ends_with("cli/src/providers.rs") {
            continue;
        }
        for (line, text) in provider_uses(&std::fs::read_to_string(f).unwrap()) {
            bad.push(format!("{}:{line}: {text}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "provider crates named outside crates/cli/src/providers.rs:\n{}",
        bad.join("\n")
    );
}

#[test]
fn rpcrdma_depends_on_no_provider() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("crates/rpcrdma/Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .split("\n[")
        .next()
        .unwrap();
    for c in PROVIDER_CRATES {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(c)),
            "rpcrdma's [dependencies] name the provider {c}"
        );
    }
}

/// iWARP names that must not appear in the code (not the comments) of the
/// provider-independent crate: they belong to the iwarp crate and reach
/// programs as provider detail (`ErrorDetail`, `vendor_err`).
const IWARP_WORDS: &[&str] = &["Terminate", "Mpa", "MPA", "ird_ord", "readv", "writev", "STag"];

fn iwarp_words(src: &str) -> Vec<(usize, String)> {
    let mut in_tests = false;
    let mut hits = Vec::new();
    for (n, line) in src.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            in_tests = true;
        }
        let code = line.split("//").next().unwrap_or("");
        if !in_tests && IWARP_WORDS.iter().any(|w| code.contains(w)) {
            hits.push((n + 1, line.trim().to_string()));
        }
    }
    hits
}

#[test]
fn finder_sees_iwarp_words() {
    assert_eq!(iwarp_words("pub struct TerminateInfo {").len(), 1);
    assert_eq!(iwarp_words("    ird_ord: Option<(u16, u16)>,").len(), 1);
    assert!(iwarp_words("/// a Terminate, in a comment").is_empty());
    assert!(iwarp_words("#[cfg(test)]\nmod t { const X: &str = \"MPA\"; }").is_empty());
}

#[test]
fn verbs_code_names_no_iwarp_type() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    rust_files(&root.join("crates/verbs/src"), &mut files);
    assert!(files.len() > 10, "found only {} files", files.len());
    let mut bad = Vec::new();
    for f in &files {
        for (line, text) in iwarp_words(&std::fs::read_to_string(f).unwrap()) {
            bad.push(format!("{}:{line}: {text}", f.display()));
        }
    }
    assert!(
        bad.is_empty(),
        "iWARP names in the verbs crate's code:\n{}",
        bad.join("\n")
    );
}

/// Lines that reach the provider-implementor side of the verbs
/// (`verbs::provider`: `new_device`, `new_cq`, `DeviceProviderExt`, `CqProviderExt`, the
/// `Provider` trait), which an application never needs.
fn provider_side_uses(src: &str) -> Vec<(usize, String)> {
    src.lines()
        .enumerate()
        .filter(|(_, l)| l.split("//").next().unwrap_or("").contains("verbs::provider"))
        .map(|(n, l)| (n + 1, l.trim().to_string()))
        .collect()
}

/// Applications (the CLI, its examples, rpcrdma) use the application API only. The one
/// exception is rpcrdma's Responder, which wakes its worker with a completion of its own
/// (`CqProviderExt::push`), documented there.
#[test]
fn applications_use_no_provider_side_call() {
    assert_eq!(provider_side_uses("use verbs::provider::CqProviderExt;").len(), 1);
    assert!(provider_side_uses("// verbs::provider in a comment").is_empty());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for d in ["crates/cli/src", "crates/cli/examples", "crates/rpcrdma/src"] {
        rust_files(&root.join(d), &mut files);
    }
    let mut bad = Vec::new();
    for f in &files {
        let hits = provider_side_uses(&std::fs::read_to_string(f).unwrap());
        let allowed = f.ends_with("rpcrdma/src/transport/responder/mod.rs");
        if !allowed || hits.len() > 1 {
            bad.extend(hits.into_iter().map(|(n, l)| format!("{}:{n}: {l}", f.display())));
        }
    }
    assert!(
        bad.is_empty(),
        "provider-side calls in applications:\n{}",
        bad.join("\n")
    );
}
