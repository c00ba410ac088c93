//! A demo RPC program that moves large opaque data both ways, with its
//! upper-layer binding (program 0x20000099, version 1).
//!
//! | proc | name | arguments | results | DDP-eligible |
//! |---|---|---|---|---|
//! | 0 | NULL | void | void | - |
//! | 1 | ECHO | `opaque data<>` | `opaque data<>` | the argument and the result |
//! | 2 | READ | `unsigned size, unsigned seed` | `opaque data<>`, `unsigned trailer` | the result data |
//! | 3 | WRITE | `unsigned tag, opaque data<>` | `unsigned len, unsigned sum` | the argument data |
//! | 4 | WORDS | `unsigned words<>` | `unsigned words<>` (reversed) | nothing: large ones go as Long Calls / Long Replies |
//!
//! READ's data is [`pattern`]`(size, seed)`; WRITE's `sum` is [`checksum`] of the data.

use crate::client::{Call, RpcClient, RpcError};
use crate::server::{ProcError, Registry};
use crate::xdr::{ReplySizing, roundup_u32};

/// Program number (in the 0x20000000 "defined by user" range of RFC 5531 §13).
pub const PROGRAM: u32 = 0x2000_0099;
/// Version.
pub const VERSION: u32 = 1;
/// NULL.
pub const NULL: u32 = 0;
/// ECHO.
pub const ECHO: u32 = 1;
/// READ.
pub const READ: u32 = 2;
/// WRITE.
pub const WRITE: u32 = 3;
/// WORDS.
pub const WORDS: u32 = 4;
/// Largest opaque the program moves.
pub const MAX_DATA: usize = 64 << 20;
/// Largest WORDS array.
pub const MAX_WORDS: usize = 1 << 20;
/// READ's trailer word.
pub const TRAILER: u32 = 0xcafe_f00d;

/// Deterministic test data: byte `i` is `(31 i + (seed ^ (i >> 8))) mod 256`.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(&mut v, seed);
    v
}

/// Append [`pattern`]`(len, seed)` to `v` (no zero-fill first).
pub fn extend_pattern(v: &mut Vec<u8>, len: usize, seed: u32) {
    let table: [u8; 256] = std::array::from_fn(|j| (j as u32).wrapping_mul(31) as u8);
    let mut block = [0u8; 256];
    let mut b = 0u32;
    let mut left = len;
    while left > 0 {
        let c = (seed ^ b) as u8;
        for (o, t) in block.iter_mut().zip(table.iter()) {
            *o = t.wrapping_add(c);
        }
        let n = left.min(256);
        v.extend_from_slice(&block[..n]);
        left -= n;
        b = b.wrapping_add(1);
    }
}

/// [`pattern`] written into `out` (byte `i` of `out` is byte `i` of the pattern).
/// Within each 256-byte block `31 i mod 256` repeats, so a block is one table
/// plus a constant (vectorised by the compiler).
pub fn fill_pattern(out: &mut [u8], seed: u32) {
    let table: [u8; 256] = std::array::from_fn(|j| (j as u32).wrapping_mul(31) as u8);
    for (b, block) in out.chunks_mut(256).enumerate() {
        let c = (seed ^ b as u32) as u8;
        for (o, t) in block.iter_mut().zip(table.iter()) {
            *o = t.wrapping_add(c);
        }
    }
}

/// WRITE's checksum (wrapping byte sum mixed with the length).
pub fn checksum(data: &[u8]) -> u32 {
    data.iter()
        .fold(data.len() as u32, |acc, &b| acc.rotate_left(5) ^ u32::from(b))
}

/// Register the demo program's procedures in `reg`, each with its reply bound
/// ([`Registry::register_bounded`]): a READ(64 MiB) whose Call provides no room for
/// the result is refused before the 64 MiB are built (issue 12 point 5).
pub fn register(reg: &mut Registry) {
    reg.register_null(PROGRAM, VERSION);
    reg.register_bounded(
        PROGRAM,
        VERSION,
        ECHO,
        |d| Ok(opaque_sizing(d.get_opaque_ddp(MAX_DATA)?.len(), 0)),
        |_, d, e| {
            let data = d.get_opaque_ddp(MAX_DATA)?;
            e.put_opaque_ddp(data, MAX_DATA)?;
            Ok(())
        },
    );
    reg.register_bounded(
        PROGRAM,
        VERSION,
        READ,
        |d| {
            let size = d.get_u32()? as usize;
            if size > MAX_DATA {
                return Err(ProcError::SystemErr);
            }
            Ok(opaque_sizing(size, 4))
        },
        |_, d, e| {
            let size = d.get_u32()? as usize;
            let seed = d.get_u32()?;
            if size > MAX_DATA {
                return Err(ProcError::SystemErr);
            }
            e.put_opaque_ddp_with(size, MAX_DATA, |v| extend_pattern(v, size, seed))?;
            e.put_u32(TRAILER)?;
            Ok(())
        },
    );
    reg.register_bounded(
        PROGRAM,
        VERSION,
        WRITE,
        |_| {
            Ok(ReplySizing {
                max_results: 8,
                ddp_results: vec![],
            })
        },
        |_, d, e| {
            let _tag = d.get_u32()?;
            let data = d.get_opaque_ddp(MAX_DATA)?;
            e.put_u32(data.len() as u32)?;
            e.put_u32(checksum(data))?;
            Ok(())
        },
    );
    reg.register_bounded(
        PROGRAM,
        VERSION,
        WORDS,
        |d| {
            let n = (d.get_u32()? as usize).min(MAX_WORDS) as u32;
            Ok(ReplySizing {
                max_results: 4 + 4 * n,
                ddp_results: vec![],
            })
        },
        |_, d, e| {
            let words = d.get_array(MAX_WORDS, 4, |d| d.get_u32())?;
            e.put_array(&words.iter().rev().copied().collect::<Vec<_>>(), MAX_WORDS, |e, w| {
                e.put_u32(*w)
            })?;
            Ok(())
        },
    );
}

/// A registry holding just the demo program.
pub fn registry() -> Registry {
    let mut r = Registry::new();
    register(&mut r);
    r
}

/// NULL.
pub fn null<C: RpcClient>(c: &C) -> Result<(), RpcError> {
    c.call(
        &Call::new(PROGRAM, VERSION, NULL, &|_| Ok(()), ReplySizing::default()),
        |_| Ok(()),
    )
}

fn opaque_sizing(len: usize, extra: u32) -> ReplySizing {
    ReplySizing {
        max_results: 4 + roundup_u32(len as u32).unwrap_or(u32::MAX - 8) + extra,
        ddp_results: vec![len as u32],
    }
}

/// ECHO: send `data`, get it back.
pub fn echo<C: RpcClient>(c: &C, data: &[u8]) -> Result<Vec<u8>, RpcError> {
    let args = |e: &mut crate::xdr::Encoder<Vec<u8>>| e.put_opaque_ddp(data, MAX_DATA);
    let call = Call::new(PROGRAM, VERSION, ECHO, &args, opaque_sizing(data.len(), 0));
    c.call(&call, |d| Ok(d.get_opaque_ddp(MAX_DATA)?.to_vec()))
}

/// READ: get `size` bytes of `pattern(size, seed)`.
pub fn read<C: RpcClient>(c: &C, size: usize, seed: u32) -> Result<Vec<u8>, RpcError> {
    let args = |e: &mut crate::xdr::Encoder<Vec<u8>>| {
        e.put_u32(size as u32)?;
        e.put_u32(seed)
    };
    let call = Call::new(PROGRAM, VERSION, READ, &args, opaque_sizing(size, 4));
    c.call(&call, |d| {
        let data = d.get_opaque_ddp(MAX_DATA)?.to_vec();
        let t = d.get_u32()?;
        if t != TRAILER {
            return Err(crate::xdr::XdrError::BadDiscriminant {
                what: "READ trailer",
                value: t,
            });
        }
        Ok(data)
    })
}

/// READ of `size` bytes, checked in place against [`pattern`] (every 61st byte
/// and the last) without copying the data out of the reply: what `rpc bench`
/// times. Returns the length.
pub fn read_checked<C: RpcClient>(c: &C, size: usize, seed: u32) -> Result<usize, RpcError> {
    let args = |e: &mut crate::xdr::Encoder<Vec<u8>>| {
        e.put_u32(size as u32)?;
        e.put_u32(seed)
    };
    let call = Call::new(PROGRAM, VERSION, READ, &args, opaque_sizing(size, 4));
    c.call(&call, |d| {
        let data = d.get_opaque_ddp(MAX_DATA)?;
        let t = d.get_u32()?;
        let byte = |i: usize| (i as u32).wrapping_mul(31).wrapping_add(seed ^ (i as u32 >> 8)) as u8;
        let bad = data.len() != size
            || (0..data.len())
                .step_by(61)
                .chain(data.len().checked_sub(1))
                .any(|i| data[i] != byte(i));
        if t != TRAILER || bad {
            return Err(crate::xdr::XdrError::BadDiscriminant {
                what: "READ data or trailer",
                value: t,
            });
        }
        Ok(data.len())
    })
}

/// WRITE: send `data`; returns (length, checksum) as the server saw them.
pub fn write<C: RpcClient>(c: &C, data: &[u8]) -> Result<(u32, u32), RpcError> {
    let args = |e: &mut crate::xdr::Encoder<Vec<u8>>| {
        e.put_u32(0x7a6)?;
        e.put_opaque_ddp(data, MAX_DATA)
    };
    let call = Call::new(
        PROGRAM,
        VERSION,
        WRITE,
        &args,
        ReplySizing {
            max_results: 8,
            ddp_results: vec![],
        },
    );
    c.call(&call, |d| Ok((d.get_u32()?, d.get_u32()?)))
}

/// WORDS: send `words` (not DDP-eligible), get them back reversed.
pub fn words<C: RpcClient>(c: &C, words: &[u32]) -> Result<Vec<u32>, RpcError> {
    let args = |e: &mut crate::xdr::Encoder<Vec<u8>>| e.put_array(words, MAX_WORDS, |e, w| e.put_u32(*w));
    let call = Call::new(
        PROGRAM,
        VERSION,
        WORDS,
        &args,
        ReplySizing {
            max_results: 4 + 4 * words.len() as u32,
            ddp_results: vec![],
        },
    );
    c.call(&call, |d| d.get_array(MAX_WORDS, 4, |d| d.get_u32()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block-wise pattern is the per-byte formula.
    #[test]
    fn pattern_matches_formula() {
        for seed in [0u32, 7, 0xdead_beef] {
            let p = pattern(70_000, seed);
            let mut q = vec![9u8];
            extend_pattern(&mut q, 70_000, seed);
            assert_eq!(&q[1..], &p[..]);
            for (i, &b) in p.iter().enumerate() {
                assert_eq!(
                    b,
                    (i as u32).wrapping_mul(31).wrapping_add(seed ^ (i as u32 >> 8)) as u8
                );
            }
        }
    }
}
