//! NFSv3 data types (RFC 1813 §2.5, §2.6) and the arguments and results of the
//! procedures this crate implements, each with its XDR encoder and decoder.
//!
//! DDP-eligibility (RFC 8267 §4.1, RFC 8166 §6): the opaque file data of WRITE
//! arguments and of READ results are the only eligible items among these
//! procedures; they are encoded with `put_opaque_ddp` and decoded with
//! `get_opaque_ddp`, so the transport moves them through a Read chunk (WRITE)
//! or a Write chunk (READ). READDIRPLUS results are not eligible: large ones
//! travel in a Reply chunk (Long Reply).

use crate::xdr::{Decoder, Encoder, Sink, XdrDecode, XdrEncode, XdrError};

/// Largest NFSv3 file handle (RFC 1813 §2.4 NFS3_FHSIZE).
pub const FHSIZE3: usize = 64;
/// Cookie verifier, create verifier and write verifier size (NFS3_COOKIEVERFSIZE etc.).
pub const VERFSIZE: usize = 8;
/// Largest file name we accept (Linux NAME_MAX).
pub const MAX_NAME: usize = 255;
/// Largest READ/WRITE data we move in one call.
pub const MAX_DATA: usize = 64 << 20;

/// Encoded size of `fattr3`.
pub const FATTR3_LEN: u32 = 84;
/// Largest encoded `post_op_attr`.
pub const POST_OP_ATTR_MAX: u32 = 4 + FATTR3_LEN;
/// Largest encoded `wcc_data` (pre_op_attr + post_op_attr).
pub const WCC_DATA_MAX: u32 = 4 + 24 + POST_OP_ATTR_MAX;
/// Largest encoded `nfs_fh3`.
pub const FH_MAX: u32 = 4 + FHSIZE3 as u32;

/// nfsstat3 (RFC 1813 §2.6): 0 is NFS3_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NfsStat(pub u32);

impl NfsStat {
    /// NFS3_OK.
    pub const OK: NfsStat = NfsStat(0);
    /// NFS3ERR_PERM.
    pub const PERM: NfsStat = NfsStat(1);
    /// NFS3ERR_NOENT.
    pub const NOENT: NfsStat = NfsStat(2);
    /// NFS3ERR_IO.
    pub const IO: NfsStat = NfsStat(5);
    /// NFS3ERR_ACCES.
    pub const ACCES: NfsStat = NfsStat(13);
    /// NFS3ERR_EXIST.
    pub const EXIST: NfsStat = NfsStat(17);
    /// NFS3ERR_NOTDIR.
    pub const NOTDIR: NfsStat = NfsStat(20);
    /// NFS3ERR_ISDIR.
    pub const ISDIR: NfsStat = NfsStat(21);
    /// NFS3ERR_INVAL.
    pub const INVAL: NfsStat = NfsStat(22);
    /// NFS3ERR_FBIG.
    pub const FBIG: NfsStat = NfsStat(27);
    /// NFS3ERR_NOSPC.
    pub const NOSPC: NfsStat = NfsStat(28);
    /// NFS3ERR_ROFS.
    pub const ROFS: NfsStat = NfsStat(30);
    /// NFS3ERR_NAMETOOLONG.
    pub const NAMETOOLONG: NfsStat = NfsStat(63);
    /// NFS3ERR_XDEV.
    pub const XDEV: NfsStat = NfsStat(18);
    /// NFS3ERR_MLINK.
    pub const MLINK: NfsStat = NfsStat(31);
    /// NFS3ERR_NOTEMPTY.
    pub const NOTEMPTY: NfsStat = NfsStat(66);
    /// NFS3ERR_DQUOT.
    pub const DQUOT: NfsStat = NfsStat(69);
    /// NFS3ERR_STALE.
    pub const STALE: NfsStat = NfsStat(70);
    /// NFS3ERR_BADHANDLE.
    pub const BADHANDLE: NfsStat = NfsStat(10001);
    /// NFS3ERR_NOT_SYNC (SETATTR's guard did not match).
    pub const NOT_SYNC: NfsStat = NfsStat(10002);
    /// NFS3ERR_BAD_COOKIE.
    pub const BAD_COOKIE: NfsStat = NfsStat(10003);
    /// NFS3ERR_NOTSUPP.
    pub const NOTSUPP: NfsStat = NfsStat(10004);
    /// NFS3ERR_TOOSMALL.
    pub const TOOSMALL: NfsStat = NfsStat(10005);
    /// NFS3ERR_SERVERFAULT.
    pub const SERVERFAULT: NfsStat = NfsStat(10006);
    /// NFS3ERR_JUKEBOX: the server cannot answer now (a file being migrated, an export
    /// cache being refreshed, a server shutting down); RFC 1813 §2.6: retry later.
    pub const JUKEBOX: NfsStat = NfsStat(10008);

    /// The RFC 1813 name.
    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NFS3_OK",
            1 => "NFS3ERR_PERM",
            2 => "NFS3ERR_NOENT",
            5 => "NFS3ERR_IO",
            6 => "NFS3ERR_NXIO",
            13 => "NFS3ERR_ACCES",
            17 => "NFS3ERR_EXIST",
            18 => "NFS3ERR_XDEV",
            19 => "NFS3ERR_NODEV",
            20 => "NFS3ERR_NOTDIR",
            21 => "NFS3ERR_ISDIR",
            22 => "NFS3ERR_INVAL",
            27 => "NFS3ERR_FBIG",
            28 => "NFS3ERR_NOSPC",
            30 => "NFS3ERR_ROFS",
            31 => "NFS3ERR_MLINK",
            63 => "NFS3ERR_NAMETOOLONG",
            66 => "NFS3ERR_NOTEMPTY",
            69 => "NFS3ERR_DQUOT",
            70 => "NFS3ERR_STALE",
            71 => "NFS3ERR_REMOTE",
            10001 => "NFS3ERR_BADHANDLE",
            10002 => "NFS3ERR_NOT_SYNC",
            10003 => "NFS3ERR_BAD_COOKIE",
            10004 => "NFS3ERR_NOTSUPP",
            10005 => "NFS3ERR_TOOSMALL",
            10006 => "NFS3ERR_SERVERFAULT",
            10007 => "NFS3ERR_BADTYPE",
            10008 => "NFS3ERR_JUKEBOX",
            _ => "NFS3ERR_unknown",
        }
    }
}

impl std::fmt::Display for NfsStat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// ftype3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ftype {
    /// NF3REG.
    Reg,
    /// NF3DIR.
    Dir,
    /// NF3BLK.
    Blk,
    /// NF3CHR.
    Chr,
    /// NF3LNK.
    Lnk,
    /// NF3SOCK.
    Sock,
    /// NF3FIFO.
    Fifo,
}

impl Ftype {
    fn code(self) -> u32 {
        self as u32 + 1
    }
    fn from_code(v: u32) -> Result<Self, XdrError> {
        Ok(match v {
            1 => Ftype::Reg,
            2 => Ftype::Dir,
            3 => Ftype::Blk,
            4 => Ftype::Chr,
            5 => Ftype::Lnk,
            6 => Ftype::Sock,
            7 => Ftype::Fifo,
            value => return Err(XdrError::BadDiscriminant { what: "ftype3", value }),
        })
    }
    /// Lower-case name (`reg`, `dir`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Ftype::Reg => "reg",
            Ftype::Dir => "dir",
            Ftype::Blk => "blk",
            Ftype::Chr => "chr",
            Ftype::Lnk => "lnk",
            Ftype::Sock => "sock",
            Ftype::Fifo => "fifo",
        }
    }
}

/// nfs_fh3: an opaque file handle of at most 64 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Fh(pub Vec<u8>);

impl Fh {
    /// Lower-case hex.
    pub fn hex(&self) -> String {
        hex::encode(&self.0)
    }
}

impl XdrEncode for Fh {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_opaque(&self.0, FHSIZE3)
    }
}

impl<'a> XdrDecode<'a> for Fh {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(Fh(d.get_opaque(FHSIZE3)?.to_vec()))
    }
}

/// nfstime3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    /// Seconds.
    pub seconds: u32,
    /// Nanoseconds.
    pub nseconds: u32,
}

impl Time {
    /// Now.
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            seconds: d.as_secs() as u32,
            nseconds: d.subsec_nanos(),
        }
    }
}

impl XdrEncode for Time {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_u32(self.seconds)?;
        e.put_u32(self.nseconds)
    }
}

impl<'a> XdrDecode<'a> for Time {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(Time {
            seconds: d.get_u32()?,
            nseconds: d.get_u32()?,
        })
    }
}

/// fattr3 (RFC 1813 §2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fattr {
    /// type.
    pub ftype: Ftype,
    /// mode (permission bits).
    pub mode: u32,
    /// nlink.
    pub nlink: u32,
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
    /// size in bytes.
    pub size: u64,
    /// bytes used on disk.
    pub used: u64,
    /// rdev (specdata1, specdata2).
    pub rdev: (u32, u32),
    /// fsid.
    pub fsid: u64,
    /// fileid.
    pub fileid: u64,
    /// atime.
    pub atime: Time,
    /// mtime.
    pub mtime: Time,
    /// ctime.
    pub ctime: Time,
}

impl XdrEncode for Fattr {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_enum(self.ftype.code())?;
        e.put_u32(self.mode)?;
        e.put_u32(self.nlink)?;
        e.put_u32(self.uid)?;
        e.put_u32(self.gid)?;
        e.put_u64(self.size)?;
        e.put_u64(self.used)?;
        e.put_u32(self.rdev.0)?;
        e.put_u32(self.rdev.1)?;
        e.put_u64(self.fsid)?;
        e.put_u64(self.fileid)?;
        self.atime.encode(e)?;
        self.mtime.encode(e)?;
        self.ctime.encode(e)
    }
}

impl<'a> XdrDecode<'a> for Fattr {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(Fattr {
            ftype: Ftype::from_code(d.get_enum()?)?,
            mode: d.get_u32()?,
            nlink: d.get_u32()?,
            uid: d.get_u32()?,
            gid: d.get_u32()?,
            size: d.get_u64()?,
            used: d.get_u64()?,
            rdev: (d.get_u32()?, d.get_u32()?),
            fsid: d.get_u64()?,
            fileid: d.get_u64()?,
            atime: Time::decode(d)?,
            mtime: Time::decode(d)?,
            ctime: Time::decode(d)?,
        })
    }
}

pub(crate) fn put_post_op_attr<S: Sink>(e: &mut Encoder<S>, a: &Option<Fattr>) -> Result<(), XdrError> {
    e.put_optional(a.as_ref(), |e, a| a.encode(e))
}

pub(crate) fn get_post_op_attr(d: &mut Decoder<'_>) -> Result<Option<Fattr>, XdrError> {
    d.get_optional(Fattr::decode)
}

/// wcc_attr (pre-operation attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WccAttr {
    /// size.
    pub size: u64,
    /// mtime.
    pub mtime: Time,
    /// ctime.
    pub ctime: Time,
}

/// wcc_data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wcc {
    /// before.
    pub before: Option<WccAttr>,
    /// after.
    pub after: Option<Fattr>,
}

impl XdrEncode for Wcc {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_optional(self.before.as_ref(), |e, w| {
            e.put_u64(w.size)?;
            w.mtime.encode(e)?;
            w.ctime.encode(e)
        })?;
        put_post_op_attr(e, &self.after)
    }
}

impl<'a> XdrDecode<'a> for Wcc {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(Wcc {
            before: d.get_optional(|d| {
                Ok(WccAttr {
                    size: d.get_u64()?,
                    mtime: Time::decode(d)?,
                    ctime: Time::decode(d)?,
                })
            })?,
            after: get_post_op_attr(d)?,
        })
    }
}

/// How a sattr3 time is set (time_how).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetTime {
    /// DONT_CHANGE.
    #[default]
    DontChange,
    /// SET_TO_SERVER_TIME.
    Server,
    /// SET_TO_CLIENT_TIME.
    Client(Time),
}

/// sattr3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sattr {
    /// mode.
    pub mode: Option<u32>,
    /// uid.
    pub uid: Option<u32>,
    /// gid.
    pub gid: Option<u32>,
    /// size.
    pub size: Option<u64>,
    /// atime.
    pub atime: SetTime,
    /// mtime.
    pub mtime: SetTime,
}

impl XdrEncode for Sattr {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        e.put_optional(self.mode.as_ref(), |e, v| e.put_u32(*v))?;
        e.put_optional(self.uid.as_ref(), |e, v| e.put_u32(*v))?;
        e.put_optional(self.gid.as_ref(), |e, v| e.put_u32(*v))?;
        e.put_optional(self.size.as_ref(), |e, v| e.put_u64(*v))?;
        for t in [self.atime, self.mtime] {
            match t {
                SetTime::DontChange => e.put_enum(0)?,
                SetTime::Server => e.put_enum(1)?,
                SetTime::Client(t) => {
                    e.put_enum(2)?;
                    t.encode(e)?;
                }
            }
        }
        Ok(())
    }
}

impl<'a> XdrDecode<'a> for Sattr {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        let mode = d.get_optional(|d| d.get_u32())?;
        let uid = d.get_optional(|d| d.get_u32())?;
        let gid = d.get_optional(|d| d.get_u32())?;
        let size = d.get_optional(|d| d.get_u64())?;
        let mut t = [SetTime::DontChange; 2];
        for slot in &mut t {
            *slot = match d.get_enum()? {
                0 => SetTime::DontChange,
                1 => SetTime::Server,
                2 => SetTime::Client(Time::decode(d)?),
                value => {
                    return Err(XdrError::BadDiscriminant {
                        what: "time_how",
                        value,
                    });
                }
            };
        }
        Ok(Sattr {
            mode,
            uid,
            gid,
            size,
            atime: t[0],
            mtime: t[1],
        })
    }
}

/// diropargs3: a directory and a name in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirOp {
    /// Directory.
    pub dir: Fh,
    /// Name.
    pub name: Vec<u8>,
}

impl XdrEncode for DirOp {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.dir.encode(e)?;
        e.put_string(&self.name, MAX_NAME)
    }
}

impl<'a> XdrDecode<'a> for DirOp {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(DirOp {
            dir: Fh::decode(d)?,
            name: d.get_string(MAX_NAME)?.to_vec(),
        })
    }
}

/// The result of a procedure: `Ok(T)` for NFS3_OK, or the status and the
/// attributes that come with a failure (`post_op_attr` or `wcc_data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Res<T, F> {
    /// NFS3_OK.
    Ok(T),
    /// Any other status.
    Fail(NfsStat, F),
}

pub(crate) fn encode_res<S: Sink, T, F>(
    e: &mut Encoder<S>,
    r: &Res<T, F>,
    ok: impl FnOnce(&mut Encoder<S>, &T) -> Result<(), XdrError>,
    fail: impl FnOnce(&mut Encoder<S>, &F) -> Result<(), XdrError>,
) -> Result<(), XdrError> {
    match r {
        Res::Ok(t) => {
            e.put_enum(0)?;
            ok(e, t)
        }
        Res::Fail(s, f) => {
            e.put_enum(s.0)?;
            fail(e, f)
        }
    }
}

pub(crate) fn decode_res<'a, T, F>(
    d: &mut Decoder<'a>,
    ok: impl FnOnce(&mut Decoder<'a>) -> Result<T, XdrError>,
    fail: impl FnOnce(&mut Decoder<'a>) -> Result<F, XdrError>,
) -> Result<Res<T, F>, XdrError> {
    match d.get_enum()? {
        0 => Ok(Res::Ok(ok(d)?)),
        s => Ok(Res::Fail(NfsStat(s), fail(d)?)),
    }
}

/// GETATTR3res.
pub type GetattrRes = Res<Fattr, ()>;

impl XdrEncode for GetattrRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(e, self, |e, a| a.encode(e), |_, _| Ok(()))
    }
}

impl<'a> XdrDecode<'a> for GetattrRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(d, Fattr::decode, |_| Ok(()))
    }
}

/// LOOKUP3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOk {
    /// object.
    pub object: Fh,
    /// obj_attributes.
    pub obj_attributes: Option<Fattr>,
    /// dir_attributes.
    pub dir_attributes: Option<Fattr>,
}

/// LOOKUP3res (a failure carries dir_attributes).
pub type LookupRes = Res<LookupOk, Option<Fattr>>;

impl XdrEncode for LookupRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                o.object.encode(e)?;
                put_post_op_attr(e, &o.obj_attributes)?;
                put_post_op_attr(e, &o.dir_attributes)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for LookupRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(LookupOk {
                    object: Fh::decode(d)?,
                    obj_attributes: get_post_op_attr(d)?,
                    dir_attributes: get_post_op_attr(d)?,
                })
            },
            get_post_op_attr,
        )
    }
}

/// READ3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadArgs {
    /// file.
    pub file: Fh,
    /// offset.
    pub offset: u64,
    /// count.
    pub count: u32,
}

impl XdrEncode for ReadArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.file.encode(e)?;
        e.put_u64(self.offset)?;
        e.put_u32(self.count)
    }
}

impl<'a> XdrDecode<'a> for ReadArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(ReadArgs {
            file: Fh::decode(d)?,
            offset: d.get_u64()?,
            count: d.get_u32()?,
        })
    }
}

/// READ3resok; `data` is DDP-eligible (RFC 8267 §4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOk<D> {
    /// file_attributes.
    pub file_attributes: Option<Fattr>,
    /// count.
    pub count: u32,
    /// eof.
    pub eof: bool,
    /// data (a `&[u8]` borrowed from the reply, or owned).
    pub data: D,
}

/// READ3res.
pub type ReadRes<D> = Res<ReadOk<D>, Option<Fattr>>;

impl<D: AsRef<[u8]>> XdrEncode for ReadRes<D> {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                put_post_op_attr(e, &o.file_attributes)?;
                e.put_u32(o.count)?;
                e.put_bool(o.eof)?;
                e.put_opaque_ddp(o.data.as_ref(), MAX_DATA)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for ReadRes<&'a [u8]> {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(ReadOk {
                    file_attributes: get_post_op_attr(d)?,
                    count: d.get_u32()?,
                    eof: d.get_bool()?,
                    data: d.get_opaque_ddp(MAX_DATA)?,
                })
            },
            get_post_op_attr,
        )
    }
}

/// stable_how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    /// UNSTABLE.
    Unstable = 0,
    /// DATA_SYNC.
    DataSync = 1,
    /// FILE_SYNC.
    FileSync = 2,
}

impl Stable {
    pub(crate) fn from_code(v: u32) -> Result<Self, XdrError> {
        Ok(match v {
            0 => Stable::Unstable,
            1 => Stable::DataSync,
            2 => Stable::FileSync,
            value => {
                return Err(XdrError::BadDiscriminant {
                    what: "stable_how",
                    value,
                });
            }
        })
    }
}

/// WRITE3args; `data` is DDP-eligible (RFC 8267 §4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteArgs<'a> {
    /// file.
    pub file: Fh,
    /// offset.
    pub offset: u64,
    /// count.
    pub count: u32,
    /// stable.
    pub stable: Stable,
    /// data.
    pub data: &'a [u8],
}

impl XdrEncode for WriteArgs<'_> {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.file.encode(e)?;
        e.put_u64(self.offset)?;
        e.put_u32(self.count)?;
        e.put_enum(self.stable as u32)?;
        e.put_opaque_ddp(self.data, MAX_DATA)
    }
}

impl<'a> XdrDecode<'a> for WriteArgs<'a> {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(WriteArgs {
            file: Fh::decode(d)?,
            offset: d.get_u64()?,
            count: d.get_u32()?,
            stable: Stable::from_code(d.get_enum()?)?,
            data: d.get_opaque_ddp(MAX_DATA)?,
        })
    }
}

/// WRITE3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOk {
    /// file_wcc.
    pub file_wcc: Wcc,
    /// count.
    pub count: u32,
    /// committed.
    pub committed: Stable,
    /// verf.
    pub verf: [u8; VERFSIZE],
}

/// WRITE3res.
pub type WriteRes = Res<WriteOk, Wcc>;

impl XdrEncode for WriteRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                o.file_wcc.encode(e)?;
                e.put_u32(o.count)?;
                e.put_enum(o.committed as u32)?;
                e.put_opaque_fixed(&o.verf)
            },
            |e, w| w.encode(e),
        )
    }
}

pub(crate) fn get_verf(d: &mut Decoder<'_>) -> Result<[u8; VERFSIZE], XdrError> {
    let v = d.get_opaque_fixed(VERFSIZE)?;
    let mut a = [0u8; VERFSIZE];
    a.copy_from_slice(v);
    Ok(a)
}

impl<'a> XdrDecode<'a> for WriteRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(WriteOk {
                    file_wcc: Wcc::decode(d)?,
                    count: d.get_u32()?,
                    committed: Stable::from_code(d.get_enum()?)?,
                    verf: get_verf(d)?,
                })
            },
            Wcc::decode,
        )
    }
}

/// createhow3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateHow {
    /// UNCHECKED.
    Unchecked(Sattr),
    /// GUARDED.
    Guarded(Sattr),
    /// EXCLUSIVE.
    Exclusive([u8; VERFSIZE]),
}

/// CREATE3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateArgs {
    /// where.
    pub where_: DirOp,
    /// how.
    pub how: CreateHow,
}

impl XdrEncode for CreateArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.where_.encode(e)?;
        match &self.how {
            CreateHow::Unchecked(s) => {
                e.put_enum(0)?;
                s.encode(e)
            }
            CreateHow::Guarded(s) => {
                e.put_enum(1)?;
                s.encode(e)
            }
            CreateHow::Exclusive(v) => {
                e.put_enum(2)?;
                e.put_opaque_fixed(v)
            }
        }
    }
}

impl<'a> XdrDecode<'a> for CreateArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        let where_ = DirOp::decode(d)?;
        let how = match d.get_enum()? {
            0 => CreateHow::Unchecked(Sattr::decode(d)?),
            1 => CreateHow::Guarded(Sattr::decode(d)?),
            2 => CreateHow::Exclusive(get_verf(d)?),
            value => {
                return Err(XdrError::BadDiscriminant {
                    what: "createmode3",
                    value,
                });
            }
        };
        Ok(CreateArgs { where_, how })
    }
}

/// CREATE3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateOk {
    /// obj (post_op_fh3).
    pub obj: Option<Fh>,
    /// obj_attributes.
    pub obj_attributes: Option<Fattr>,
    /// dir_wcc.
    pub dir_wcc: Wcc,
}

/// CREATE3res.
pub type CreateRes = Res<CreateOk, Wcc>;

impl XdrEncode for CreateRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                e.put_optional(o.obj.as_ref(), |e, f| f.encode(e))?;
                put_post_op_attr(e, &o.obj_attributes)?;
                o.dir_wcc.encode(e)
            },
            |e, w| w.encode(e),
        )
    }
}

impl<'a> XdrDecode<'a> for CreateRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(CreateOk {
                    obj: d.get_optional(Fh::decode)?,
                    obj_attributes: get_post_op_attr(d)?,
                    dir_wcc: Wcc::decode(d)?,
                })
            },
            Wcc::decode,
        )
    }
}

/// READDIRPLUS3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirplusArgs {
    /// dir.
    pub dir: Fh,
    /// cookie.
    pub cookie: u64,
    /// cookieverf.
    pub cookieverf: [u8; VERFSIZE],
    /// dircount.
    pub dircount: u32,
    /// maxcount.
    pub maxcount: u32,
}

impl XdrEncode for ReaddirplusArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.dir.encode(e)?;
        e.put_u64(self.cookie)?;
        e.put_opaque_fixed(&self.cookieverf)?;
        e.put_u32(self.dircount)?;
        e.put_u32(self.maxcount)
    }
}

impl<'a> XdrDecode<'a> for ReaddirplusArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(ReaddirplusArgs {
            dir: Fh::decode(d)?,
            cookie: d.get_u64()?,
            cookieverf: get_verf(d)?,
            dircount: d.get_u32()?,
            maxcount: d.get_u32()?,
        })
    }
}

/// entryplus3 (without the link to the next one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPlus {
    /// fileid.
    pub fileid: u64,
    /// name.
    pub name: Vec<u8>,
    /// cookie.
    pub cookie: u64,
    /// name_attributes.
    pub attributes: Option<Fattr>,
    /// name_handle.
    pub handle: Option<Fh>,
}

impl EntryPlus {
    /// Bytes this entry takes in a READDIRPLUS3resok (with its "next" word).
    pub fn encoded_len(&self) -> usize {
        4 + 8
            + 4
            + crate::xdr::roundup(self.name.len()).unwrap_or(usize::MAX / 2)
            + 8
            + 4
            + self.attributes.map_or(0, |_| FATTR3_LEN as usize)
            + 4
            + self
                .handle
                .as_ref()
                .map_or(0, |h| 4 + crate::xdr::roundup(h.0.len()).unwrap_or(0))
    }
}

/// READDIRPLUS3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirplusOk {
    /// dir_attributes.
    pub dir_attributes: Option<Fattr>,
    /// cookieverf.
    pub cookieverf: [u8; VERFSIZE],
    /// entries (the XDR linked list, flattened).
    pub entries: Vec<EntryPlus>,
    /// eof.
    pub eof: bool,
}

/// READDIRPLUS3res.
pub type ReaddirplusRes = Res<ReaddirplusOk, Option<Fattr>>;

/// Most entries one READDIRPLUS reply may carry (bounds the decoder's work).
pub const MAX_DIR_ENTRIES: usize = 1 << 16;

impl XdrEncode for ReaddirplusRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                put_post_op_attr(e, &o.dir_attributes)?;
                e.put_opaque_fixed(&o.cookieverf)?;
                for en in &o.entries {
                    e.put_bool(true)?;
                    e.put_u64(en.fileid)?;
                    e.put_string(&en.name, MAX_NAME)?;
                    e.put_u64(en.cookie)?;
                    put_post_op_attr(e, &en.attributes)?;
                    e.put_optional(en.handle.as_ref(), |e, f| f.encode(e))?;
                }
                e.put_bool(false)?;
                e.put_bool(o.eof)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for ReaddirplusRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                let dir_attributes = get_post_op_attr(d)?;
                let cookieverf = get_verf(d)?;
                let mut entries = Vec::new();
                while d.get_bool()? {
                    if entries.len() >= MAX_DIR_ENTRIES {
                        return Err(XdrError::TooLong {
                            len: entries.len() + 1,
                            max: MAX_DIR_ENTRIES,
                        });
                    }
                    entries.push(EntryPlus {
                        fileid: d.get_u64()?,
                        name: d.get_string(MAX_NAME)?.to_vec(),
                        cookie: d.get_u64()?,
                        attributes: get_post_op_attr(d)?,
                        handle: d.get_optional(Fh::decode)?,
                    });
                }
                Ok(ReaddirplusOk {
                    dir_attributes,
                    cookieverf,
                    entries,
                    eof: d.get_bool()?,
                })
            },
            get_post_op_attr,
        )
    }
}

/// FSINFO3resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsinfoOk {
    /// obj_attributes.
    pub obj_attributes: Option<Fattr>,
    /// rtmax.
    pub rtmax: u32,
    /// rtpref.
    pub rtpref: u32,
    /// rtmult.
    pub rtmult: u32,
    /// wtmax.
    pub wtmax: u32,
    /// wtpref.
    pub wtpref: u32,
    /// wtmult.
    pub wtmult: u32,
    /// dtpref.
    pub dtpref: u32,
    /// maxfilesize.
    pub maxfilesize: u64,
    /// time_delta.
    pub time_delta: Time,
    /// properties.
    pub properties: u32,
}

/// FSINFO3res.
pub type FsinfoRes = Res<FsinfoOk, Option<Fattr>>;

impl XdrEncode for FsinfoRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                put_post_op_attr(e, &o.obj_attributes)?;
                for v in [o.rtmax, o.rtpref, o.rtmult, o.wtmax, o.wtpref, o.wtmult, o.dtpref] {
                    e.put_u32(v)?;
                }
                e.put_u64(o.maxfilesize)?;
                o.time_delta.encode(e)?;
                e.put_u32(o.properties)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for FsinfoRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(FsinfoOk {
                    obj_attributes: get_post_op_attr(d)?,
                    rtmax: d.get_u32()?,
                    rtpref: d.get_u32()?,
                    rtmult: d.get_u32()?,
                    wtmax: d.get_u32()?,
                    wtpref: d.get_u32()?,
                    wtmult: d.get_u32()?,
                    dtpref: d.get_u32()?,
                    maxfilesize: d.get_u64()?,
                    time_delta: Time::decode(d)?,
                    properties: d.get_u32()?,
                })
            },
            get_post_op_attr,
        )
    }
}

/// COMMIT3args (RFC 1813 §3.3.21): flush `count` bytes from `offset` (0 and 0: the whole file)
/// of UNSTABLE writes to stable storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitArgs {
    /// file.
    pub file: Fh,
    /// offset.
    pub offset: u64,
    /// count.
    pub count: u32,
}

impl XdrEncode for CommitArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.file.encode(e)?;
        e.put_u64(self.offset)?;
        e.put_u32(self.count)
    }
}

impl<'a> XdrDecode<'a> for CommitArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(CommitArgs {
            file: Fh::decode(d)?,
            offset: d.get_u64()?,
            count: d.get_u32()?,
        })
    }
}

/// COMMIT3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOk {
    /// file_wcc.
    pub file_wcc: Wcc,
    /// verf: must equal the verifier of the UNSTABLE WRITEs, else the server lost them.
    pub verf: [u8; VERFSIZE],
}

/// COMMIT3res.
pub type CommitRes = Res<CommitOk, Wcc>;

impl XdrEncode for CommitRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                o.file_wcc.encode(e)?;
                e.put_opaque_fixed(&o.verf)
            },
            |e, w| w.encode(e),
        )
    }
}

impl<'a> XdrDecode<'a> for CommitRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(CommitOk {
                    file_wcc: Wcc::decode(d)?,
                    verf: get_verf(d)?,
                })
            },
            Wcc::decode,
        )
    }
}

/// REMOVE3res (RFC 1813 §3.3.12): the directory's wcc_data either way.
pub type RemoveRes = Res<Wcc, Wcc>;

impl XdrEncode for RemoveRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(e, self, |e, w| w.encode(e), |e, w| w.encode(e))
    }
}

impl<'a> XdrDecode<'a> for RemoveRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(d, Wcc::decode, Wcc::decode)
    }
}
