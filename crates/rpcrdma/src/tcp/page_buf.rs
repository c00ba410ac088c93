//! A byte buffer that starts on a 4 KiB page boundary, for socket reads.
//!
//! `vec![0; 256 << 10]` starts 16 octets into a page (glibc serves allocations above its
//! mmap threshold from a fresh `mmap`, after a 16-octet header), and on an AMD EPYC with
//! FSRM the kernel's receive copy (`copy_to_user`, `rep movsb`) into such a buffer cost
//! 2.5-3x the CPU per octet of a page-aligned one (docs/performance.md, session 16, branch
//! s16-fairtcp). The record readers of ONC RPC over TCP and `softrdma bench`'s TCP
//! baseline read into these.

const PAGE: usize = 4096;

/// `len` octets starting on a page boundary (safe code: a vector one page longer, used from
/// its first page boundary).
#[derive(Debug, Clone)]
pub struct PageBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl PageBuf {
    /// `len` octets, each `fill`.
    pub fn new(len: usize, fill: u8) -> PageBuf {
        let v = vec![fill; len + PAGE - 1];
        let off = (PAGE - v.as_ptr() as usize % PAGE) % PAGE;
        PageBuf { v, off, len }
    }

    /// The buffer's octets.
    pub fn bytes(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }

    /// The buffer's octets, to read into.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::PageBuf;

    #[test]
    fn starts_on_a_page_and_has_its_length() {
        for len in [0usize, 1, 4095, 4096, 64 << 10, 256 << 10, 1 << 20] {
            let mut b = PageBuf::new(len, 7);
            assert_eq!(b.bytes().as_ptr() as usize % 4096, 0, "{len}");
            assert_eq!(b.bytes().len(), len);
            assert!(b.bytes().iter().all(|&x| x == 7));
            b.bytes_mut().fill(1);
            assert_eq!(b.bytes_mut().len(), len);
        }
    }
}
