//! The sockets handed over to SMC-R, by inode (dup and fork keep it): the TCP addresses and
//! the TCP/IP-level options the program set, for the answers AF_UNIX would give differently.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// At most this many sockets are remembered (the oldest entries go first; socket inode
/// numbers are not reused while a process runs, so an old entry does no harm but memory).
const MAX_ENTRIES: usize = 65_536;

/// One handed-over socket.
#[derive(Debug, Clone)]
pub struct Entry {
    /// AF_INET or AF_INET6.
    pub family: i32,
    /// `getsockname` of the TCP socket, raw octets.
    pub local: Vec<u8>,
    /// `getpeername` of the TCP socket, raw octets.
    pub peer: Vec<u8>,
    /// TCP/IP-level options set by the program: (level, name) → value octets.
    pub opts: HashMap<(i32, i32), Vec<u8>>,
    order: u64,
}

struct Table {
    map: HashMap<u64, Entry>,
    next: u64,
}

static ANY: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// Whether any socket was handed over (fast path for the hooks).
pub fn any() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Remembers the socket with inode `ino`.
pub fn insert(ino: u64, family: i32, local: Vec<u8>, peer: Vec<u8>) {
    let mut g = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    let t = g.get_or_insert_with(|| Table {
        map: HashMap::new(),
        next: 0,
    });
    if t.map.len() >= MAX_ENTRIES
        && let Some(oldest) = t.map.iter().min_by_key(|(_, e)| e.order).map(|(k, _)| *k)
    {
        t.map.remove(&oldest);
    }
    t.next += 1;
    let order = t.next;
    t.map.insert(
        ino,
        Entry {
            family,
            local,
            peer,
            opts: HashMap::new(),
            order,
        },
    );
    ANY.store(true, Ordering::Relaxed);
}

/// The entry of inode `ino`, if handed over.
pub fn get(ino: u64) -> Option<Entry> {
    let g = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    g.as_ref().and_then(|t| t.map.get(&ino).cloned())
}

/// Records an option the program set on a handed-over socket.
pub fn set_opt(ino: u64, level: i32, name: i32, value: &[u8]) {
    let mut g = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = g.as_mut().and_then(|t| t.map.get_mut(&ino)) {
        e.opts.insert((level, name), value.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_inode_and_keep_options() {
        insert(7, 2, vec![1, 2], vec![3, 4]);
        set_opt(7, 6, 1, &1i32.to_ne_bytes());
        let e = get(7).unwrap();
        assert_eq!((e.family, e.local, e.peer), (2, vec![1, 2], vec![3, 4]));
        assert_eq!(e.opts[&(6, 1)], 1i32.to_ne_bytes().to_vec());
        assert!(get(8).is_none());
        assert!(any());
    }
}
