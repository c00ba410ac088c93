//! File handles of [`super::Export`]: 32 bytes that name an inode of one export and carry
//! a keyed MAC, so a client cannot forge or alter one, and one from another export (or a
//! server with another key) is refused.
//!
//! ```text
//! 0..2   b"sr"            magic
//! 2      1                layout version
//! 3      0                reserved
//! 4..8   export id        the first 4 bytes of HMAC-SHA256(key, "export" || root path)
//! 8..16  inode number     (big-endian)
//! 16..32 MAC              HMAC-SHA256(key, bytes 0..16), first 16 bytes
//! ```
//!
//! The key is the server's secret (the CLI keeps it in a file), so the same directory served
//! again after a restart hands out, and accepts, the same handles.

use sha2::{Digest, Sha256};

use crate::nfs3::{Fh, NfsStat};

/// Length of our handles.
pub const HANDLE_LEN: usize = 32;
const MAGIC: &[u8; 2] = b"sr";
const LAYOUT: u8 = 1;

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Mints and checks handles for one export.
#[derive(Clone)]
pub struct HandleKey {
    key: [u8; 32],
    export_id: [u8; 4],
}

impl std::fmt::Debug for HandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleKey")
            .field("export_id", &self.export_id)
            .finish_non_exhaustive()
    }
}

impl HandleKey {
    /// The handles of the export at `root` under the server secret `key`.
    pub fn new(key: [u8; 32], root: &std::path::Path) -> HandleKey {
        use std::os::unix::ffi::OsStrExt;
        let mac = hmac_sha256(&key, &[b"export", root.as_os_str().as_bytes()]);
        HandleKey {
            key,
            export_id: [mac[0], mac[1], mac[2], mac[3]],
        }
    }

    /// The export id in our handles.
    pub fn export_id(&self) -> u32 {
        u32::from_be_bytes(self.export_id)
    }

    /// The handle of inode `ino`.
    pub fn mint(&self, ino: u64) -> Fh {
        let mut h = Vec::with_capacity(HANDLE_LEN);
        h.extend_from_slice(MAGIC);
        h.push(LAYOUT);
        h.push(0);
        h.extend_from_slice(&self.export_id);
        h.extend_from_slice(&ino.to_be_bytes());
        let mac = hmac_sha256(&self.key, &[&h]);
        h.extend_from_slice(&mac[..16]);
        Fh(h)
    }

    /// The inode a handle names. NFS3ERR_BADHANDLE for anything we did not mint (wrong
    /// length, layout or MAC: forged, altered, or from a server with another key),
    /// NFS3ERR_STALE for a genuine handle of another export of this key.
    pub fn check(&self, fh: &Fh) -> Result<u64, NfsStat> {
        let h = &fh.0;
        if h.len() != HANDLE_LEN || &h[..2] != MAGIC || h[2] != LAYOUT || h[3] != 0 {
            return Err(NfsStat::BADHANDLE);
        }
        let mac = hmac_sha256(&self.key, &[&h[..16]]);
        // not constant-time-critical: a forger learns nothing useful from timing of a
        // 16-byte compare of a MAC it cannot compute, but compare all bytes anyway
        if mac[..16].iter().zip(&h[16..]).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(NfsStat::BADHANDLE);
        }
        if h[4..8] != self.export_id {
            return Err(NfsStat::STALE);
        }
        let mut ino = [0u8; 8];
        ino.copy_from_slice(&h[8..16]);
        Ok(u64::from_be_bytes(ino))
    }
}
