//! The transmit queue of one QP: framed FPDUs waiting for the socket, as a
//! gather list. Headers, trailers and small or copied payloads live in a
//! private arena; large payloads stay in their registered buffers and go to
//! the kernel with `writev` (no userspace copy: RFC 5040's "zero copy" as far
//! as a socket allows).
//!
//! Positions are counted in octets since the start of Full Operation, so a
//! completion mark ("slot N is done once octet X left") survives compaction.

use super::sockio::{self, IoPart, MAX_IO_PARTS, SMALL_IO_PARTS};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use verbs::buffer::Buffer;

enum Part {
    /// `arena[start..start + len]`.
    Arena { start: usize, len: usize },
    /// A range of a registered buffer.
    Mem { buf: Arc<Buffer>, off: usize, len: usize },
}

/// The gather-list element of `p`, its first `skip` octets already written.
fn io_part<'a>(arena: &'a [u8], skip: usize, p: &'a Part) -> IoPart<'a> {
    match p {
        Part::Arena { start, len } => IoPart::Bytes(&arena[start + skip..start + len]),
        Part::Mem { buf, off, len } => IoPart::Mem {
            buf,
            off: off + skip,
            len: len - skip,
        },
    }
}

impl Part {
    fn len(&self) -> usize {
        match self {
            Part::Arena { len, .. } | Part::Mem { len, .. } => *len,
        }
    }
}

/// Arena octets already sent that trigger compaction.
const COMPACT_AT: usize = 256 * 1024;

#[derive(Default)]
pub(crate) struct TxQueue {
    arena: Vec<u8>,
    parts: VecDeque<Part>,
    /// Octets of `parts.front()` already written.
    head_off: usize,
    /// Octets queued / written since the start.
    queued: u64,
    written: u64,
    /// (stream position, slot): the slot completes once `written` reaches it.
    marks: VecDeque<(u64, u64)>,
}

impl TxQueue {
    /// Octets waiting for the socket.
    pub fn pending(&self) -> usize {
        (self.queued - self.written) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.queued == self.written
    }

    /// Appends `len` arena octets written by `fill`; adjacent arena parts merge.
    pub fn push_bytes(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let start = self.arena.len();
        self.arena.resize(start + len, 0);
        fill(&mut self.arena[start..]);
        self.queued += len as u64;
        if let Some(Part::Arena { start: s, len: l }) = self.parts.back_mut()
            && *s + *l == start
        {
            *l += len;
            return;
        }
        self.parts.push_back(Part::Arena { start, len });
    }

    /// Appends a copy of `bytes`.
    pub fn push_slice(&mut self, bytes: &[u8]) {
        self.push_bytes(bytes.len(), |b| b.copy_from_slice(bytes));
    }

    /// Appends a range of a registered buffer, sent in place.
    pub fn push_mem(&mut self, buf: &Arc<Buffer>, off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.queued += len as u64;
        self.parts.push_back(Part::Mem {
            buf: buf.clone(),
            off,
            len,
        });
    }

    /// Undoes pushes back to `queued` position `mark` (a failed framing).
    pub fn truncate_to(&mut self, mark: u64) {
        while self.queued > mark {
            let Some(p) = self.parts.back_mut() else { break };
            let excess = (self.queued - mark) as usize;
            let len = p.len();
            if len <= excess {
                if let Part::Arena { start, .. } = p {
                    self.arena.truncate(*start);
                }
                self.parts.pop_back();
                self.queued -= len as u64;
            } else {
                match p {
                    Part::Arena { start, len } => {
                        *len -= excess;
                        self.arena.truncate(*start + *len);
                    }
                    Part::Mem { len, .. } => *len -= excess,
                }
                self.queued -= excess as u64;
            }
        }
    }

    /// The current end of the queue (for [`TxQueue::truncate_to`] and marks).
    pub fn position(&self) -> u64 {
        self.queued
    }

    /// Completes `slot` when everything queued so far has been written.
    pub fn mark(&mut self, slot: u64) {
        self.marks.push_back((self.queued, slot));
    }

    /// One `writev` of what is pending. `Ok(0)` if nothing is.
    pub fn write_to(&self, fd: RawFd) -> std::io::Result<usize> {
        if self.is_empty() {
            return Ok(0);
        }
        let n = self.parts.len().min(MAX_IO_PARTS);
        if n <= SMALL_IO_PARTS {
            // A latency-sized queue: the gather list on the stack (issue 18).
            let mut small = [IoPart::Bytes(&[]); SMALL_IO_PARTS];
            for (i, (slot, p)) in small.iter_mut().zip(self.parts.iter()).enumerate() {
                *slot = io_part(&self.arena, if i == 0 { self.head_off } else { 0 }, p);
            }
            return sockio::writev(fd, &small[..n]);
        }
        let iov: Vec<IoPart<'_>> = (self.parts.iter().take(n).enumerate())
            .map(|(i, p)| io_part(&self.arena, if i == 0 { self.head_off } else { 0 }, p))
            .collect();
        sockio::writev(fd, &iov)
    }

    /// Appends every pending octet to `out` (what `write_to` would send, in
    /// order, without a socket): the in-memory transport of the core tests.
    #[cfg(any(test, feature = "fuzz"))]
    pub fn copy_pending(&self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        for (i, p) in self.parts.iter().enumerate() {
            let skip = if i == 0 { self.head_off } else { 0 };
            match p {
                Part::Arena { start, len } => out.extend_from_slice(&self.arena[start + skip..start + len]),
                Part::Mem { buf, off, len } => {
                    let at = out.len();
                    out.resize(at + len - skip, 0);
                    buf.read(off + skip, &mut out[at..])
                        .expect("queued ranges are in bounds");
                }
            }
        }
        out.len() - start
    }

    /// `n` octets were written: returns the slots that fully left.
    pub fn consumed(&mut self, mut n: usize, done: &mut Vec<u64>) {
        self.written += n as u64;
        while n > 0 {
            let Some(p) = self.parts.front() else { break };
            let rest = p.len() - self.head_off;
            if n >= rest {
                n -= rest;
                self.parts.pop_front();
                self.head_off = 0;
            } else {
                self.head_off += n;
                n = 0;
            }
        }
        while let Some(&(end, id)) = self.marks.front() {
            if end > self.written {
                break;
            }
            self.marks.pop_front();
            done.push(id);
        }
        self.compact();
    }

    /// Drops sent arena octets: all of them when idle, else the prefix once large.
    fn compact(&mut self) {
        if self.parts.is_empty() {
            self.arena.clear();
            self.head_off = 0;
            return;
        }
        let first = self.parts.iter().find_map(|p| match p {
            Part::Arena { start, .. } => Some(*start),
            Part::Mem { .. } => None,
        });
        let first = first.unwrap_or(self.arena.len());
        if first >= COMPACT_AT && first * 2 >= self.arena.len() {
            self.arena.drain(..first);
            for p in self.parts.iter_mut() {
                if let Part::Arena { start, .. } = p {
                    *start -= first;
                }
            }
        }
    }

    /// Forgets everything queued but not written (the connection is gone).
    pub fn discard(&mut self, done: &mut Vec<u64>) {
        let n = self.pending();
        self.consumed(n, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    #[test]
    fn gathers_in_order_marks_and_compacts() {
        let b = Arc::new(Buffer::new(1 << 20).unwrap());
        let data: Vec<u8> = (0..(1 << 20)).map(|i: usize| (i % 251) as u8).collect();
        b.write(0, &data).unwrap();
        let mut q = TxQueue::default();
        let mut want = Vec::new();
        for i in 0..200usize {
            q.push_slice(&[i as u8; 7]);
            want.extend_from_slice(&[i as u8; 7]);
            q.push_mem(&b, i * 1000, 3000);
            want.extend_from_slice(&data[i * 1000..i * 1000 + 3000]);
            q.mark(i as u64);
        }
        // A framing that failed halfway is undone.
        let m = q.position();
        q.push_slice(b"junk");
        q.push_mem(&b, 0, 10);
        q.truncate_to(m);
        assert_eq!(q.pending(), want.len());
        let (mut r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        w.set_nonblocking(true).unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            got
        });
        let mut done = Vec::new();
        while !q.is_empty() {
            match q.write_to(w.as_raw_fd()) {
                Ok(n) => q.consumed(n, &mut done),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        drop(w);
        assert_eq!(reader.join().unwrap(), want);
        assert_eq!(done, (0..200).collect::<Vec<u64>>());
        assert!(q.arena.is_empty(), "idle queue keeps no arena");
    }
}
