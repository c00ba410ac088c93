//! The system calls the export needs that `std` lacks, through rustix (this crate forbids
//! unsafe code): statvfs(3) for FSSTAT, utimensat(2) with AT_SYMLINK_NOFOLLOW for SETATTR's
//! times (also on symbolic links), geteuid(2).

use std::io;
use std::path::Path;

use rustix::fs::{AtFlags, CWD, Timespec, Timestamps, UTIME_NOW, UTIME_OMIT};

/// What FSSTAT reports.
#[derive(Debug, Clone, Copy)]
pub struct FsSpace {
    /// Total bytes.
    pub total: u64,
    /// Free bytes.
    pub free: u64,
    /// Bytes free to unprivileged users.
    pub avail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Inodes free to unprivileged users.
    pub favail: u64,
}

/// statvfs(3) of the file system holding `p`.
pub fn statvfs(p: &Path) -> io::Result<FsSpace> {
    let s = rustix::fs::statvfs(p)?;
    let f = s.f_frsize;
    Ok(FsSpace {
        total: s.f_blocks.saturating_mul(f),
        free: s.f_bfree.saturating_mul(f),
        avail: s.f_bavail.saturating_mul(f),
        files: s.f_files,
        ffree: s.f_ffree,
        favail: s.f_favail,
    })
}

/// How one time is set.
#[derive(Debug, Clone, Copy)]
pub enum TimeSet {
    /// Leave it.
    Omit,
    /// The server's clock.
    Now,
    /// This time (seconds, nanoseconds).
    At(i64, u32),
}

fn timespec(t: TimeSet) -> Timespec {
    match t {
        TimeSet::Omit => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        TimeSet::Now => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        TimeSet::At(s, ns) => Timespec {
            tv_sec: s,
            tv_nsec: ns.min(999_999_999).into(),
        },
    }
}

/// utimensat(AT_FDCWD, p, [atime, mtime], AT_SYMLINK_NOFOLLOW).
pub fn set_times(p: &Path, atime: TimeSet, mtime: TimeSet) -> io::Result<()> {
    let ts = Timestamps {
        last_access: timespec(atime),
        last_modification: timespec(mtime),
    };
    rustix::fs::utimensat(CWD, p, &ts, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}
