//! Arguments and results of the NFSv3 procedures the client half of [`crate::nfs3`] does not
//! call (RFC 1813 §3.3): SETATTR, ACCESS, READLINK, MKDIR, SYMLINK, RMDIR, RENAME, LINK,
//! READDIR, FSSTAT, PATHCONF. Arguments encode and decode (tests call them over the wire);
//! results encode (the server's side) and decode their status.

use crate::nfs3::types::{decode_res, encode_res, get_post_op_attr, get_verf, put_post_op_attr};
use crate::nfs3::{DirOp, Fattr, Fh, MAX_NAME, Res, Sattr, Time, VERFSIZE, Wcc};
use crate::xdr::{Decoder, Encoder, Sink, XdrDecode, XdrEncode, XdrError};

/// Largest symbolic link text (Linux PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// SETATTR3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetattrArgs {
    /// object.
    pub object: Fh,
    /// new_attributes.
    pub new_attributes: Sattr,
    /// guard: the object's ctime must equal this (else NFS3ERR_NOT_SYNC).
    pub guard: Option<Time>,
}

impl XdrEncode for SetattrArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.object.encode(e)?;
        self.new_attributes.encode(e)?;
        e.put_optional(self.guard.as_ref(), |e, t| t.encode(e))
    }
}

impl<'a> XdrDecode<'a> for SetattrArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(SetattrArgs {
            object: Fh::decode(d)?,
            new_attributes: Sattr::decode(d)?,
            guard: d.get_optional(Time::decode)?,
        })
    }
}

/// A result that is a `wcc_data` either way (SETATTR, REMOVE, RMDIR).
pub type WccRes = Res<Wcc, Wcc>;

/// ACCESS3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessArgs {
    /// object.
    pub object: Fh,
    /// access: ACCESS3_* bits asked about.
    pub access: u32,
}

/// ACCESS3_* bits (RFC 1813 §3.3.4).
pub mod access {
    /// ACCESS3_READ.
    pub const READ: u32 = 0x01;
    /// ACCESS3_LOOKUP.
    pub const LOOKUP: u32 = 0x02;
    /// ACCESS3_MODIFY.
    pub const MODIFY: u32 = 0x04;
    /// ACCESS3_EXTEND.
    pub const EXTEND: u32 = 0x08;
    /// ACCESS3_DELETE.
    pub const DELETE: u32 = 0x10;
    /// ACCESS3_EXECUTE.
    pub const EXECUTE: u32 = 0x20;
}

impl XdrEncode for AccessArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.object.encode(e)?;
        e.put_u32(self.access)
    }
}

impl<'a> XdrDecode<'a> for AccessArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(AccessArgs {
            object: Fh::decode(d)?,
            access: d.get_u32()?,
        })
    }
}

/// ACCESS3res: (obj_attributes, access granted) or obj_attributes.
pub type AccessRes = Res<(Option<Fattr>, u32), Option<Fattr>>;

impl XdrEncode for AccessRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, (a, bits)| {
                put_post_op_attr(e, a)?;
                e.put_u32(*bits)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for AccessRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(d, |d| Ok((get_post_op_attr(d)?, d.get_u32()?)), get_post_op_attr)
    }
}

/// READLINK3res: (symlink_attributes, data) or symlink_attributes.
pub type ReadlinkRes = Res<(Option<Fattr>, Vec<u8>), Option<Fattr>>;

impl XdrEncode for ReadlinkRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, (a, data)| {
                put_post_op_attr(e, a)?;
                e.put_string(data, MAX_PATH)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for ReadlinkRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| Ok((get_post_op_attr(d)?, d.get_string(MAX_PATH)?.to_vec())),
            get_post_op_attr,
        )
    }
}

/// MKDIR3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MkdirArgs {
    /// where.
    pub where_: DirOp,
    /// attributes.
    pub attributes: Sattr,
}

impl XdrEncode for MkdirArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.where_.encode(e)?;
        self.attributes.encode(e)
    }
}

impl<'a> XdrDecode<'a> for MkdirArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(MkdirArgs {
            where_: DirOp::decode(d)?,
            attributes: Sattr::decode(d)?,
        })
    }
}

/// SYMLINK3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymlinkArgs {
    /// where.
    pub where_: DirOp,
    /// symlink.symlink_attributes.
    pub attributes: Sattr,
    /// symlink.symlink_data: the link's text.
    pub data: Vec<u8>,
}

impl XdrEncode for SymlinkArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.where_.encode(e)?;
        self.attributes.encode(e)?;
        e.put_string(&self.data, MAX_PATH)
    }
}

impl<'a> XdrDecode<'a> for SymlinkArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(SymlinkArgs {
            where_: DirOp::decode(d)?,
            attributes: Sattr::decode(d)?,
            data: d.get_string(MAX_PATH)?.to_vec(),
        })
    }
}

/// RENAME3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameArgs {
    /// from.
    pub from: DirOp,
    /// to.
    pub to: DirOp,
}

impl XdrEncode for RenameArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.from.encode(e)?;
        self.to.encode(e)
    }
}

impl<'a> XdrDecode<'a> for RenameArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(RenameArgs {
            from: DirOp::decode(d)?,
            to: DirOp::decode(d)?,
        })
    }
}

/// RENAME3res: (fromdir_wcc, todir_wcc) either way.
pub type RenameRes = Res<(Wcc, Wcc), (Wcc, Wcc)>;

impl XdrEncode for RenameRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        let both = |e: &mut Encoder<S>, (a, b): &(Wcc, Wcc)| {
            a.encode(e)?;
            b.encode(e)
        };
        encode_res(e, self, both, both)
    }
}

impl<'a> XdrDecode<'a> for RenameRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| Ok((Wcc::decode(d)?, Wcc::decode(d)?)),
            |d| Ok((Wcc::decode(d)?, Wcc::decode(d)?)),
        )
    }
}

/// LINK3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkArgs {
    /// file.
    pub file: Fh,
    /// link.
    pub link: DirOp,
}

impl XdrEncode for LinkArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.file.encode(e)?;
        self.link.encode(e)
    }
}

impl<'a> XdrDecode<'a> for LinkArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(LinkArgs {
            file: Fh::decode(d)?,
            link: DirOp::decode(d)?,
        })
    }
}

/// LINK3res: (file_attributes, linkdir_wcc) either way.
pub type LinkRes = Res<(Option<Fattr>, Wcc), (Option<Fattr>, Wcc)>;

impl XdrEncode for LinkRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        let both = |e: &mut Encoder<S>, (a, w): &(Option<Fattr>, Wcc)| {
            put_post_op_attr(e, a)?;
            w.encode(e)
        };
        encode_res(e, self, both, both)
    }
}

impl<'a> XdrDecode<'a> for LinkRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| Ok((get_post_op_attr(d)?, Wcc::decode(d)?)),
            |d| Ok((get_post_op_attr(d)?, Wcc::decode(d)?)),
        )
    }
}

/// READDIR3args.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirArgs {
    /// dir.
    pub dir: Fh,
    /// cookie.
    pub cookie: u64,
    /// cookieverf.
    pub cookieverf: [u8; VERFSIZE],
    /// count: the largest READDIR3resok the client takes.
    pub count: u32,
}

impl XdrEncode for ReaddirArgs {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        self.dir.encode(e)?;
        e.put_u64(self.cookie)?;
        e.put_opaque_fixed(&self.cookieverf)?;
        e.put_u32(self.count)
    }
}

impl<'a> XdrDecode<'a> for ReaddirArgs {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        Ok(ReaddirArgs {
            dir: Fh::decode(d)?,
            cookie: d.get_u64()?,
            cookieverf: get_verf(d)?,
            count: d.get_u32()?,
        })
    }
}

/// entry3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// fileid.
    pub fileid: u64,
    /// name.
    pub name: Vec<u8>,
    /// cookie.
    pub cookie: u64,
}

impl Entry {
    /// Bytes this entry takes in a READDIR3resok (with its "next" word).
    pub fn encoded_len(&self) -> usize {
        4 + 8 + 4 + crate::xdr::roundup(self.name.len()).unwrap_or(usize::MAX / 2) + 8
    }
}

/// READDIR3resok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaddirOk {
    /// dir_attributes.
    pub dir_attributes: Option<Fattr>,
    /// cookieverf.
    pub cookieverf: [u8; VERFSIZE],
    /// entries.
    pub entries: Vec<Entry>,
    /// eof.
    pub eof: bool,
}

/// READDIR3res.
pub type ReaddirRes = Res<ReaddirOk, Option<Fattr>>;

impl XdrEncode for ReaddirRes {
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
                }
                e.put_bool(false)?;
                e.put_bool(o.eof)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for ReaddirRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                let dir_attributes = get_post_op_attr(d)?;
                let cookieverf = get_verf(d)?;
                let mut entries = Vec::new();
                while d.get_bool()? {
                    if entries.len() >= crate::nfs3::MAX_DIR_ENTRIES {
                        return Err(XdrError::TooLong {
                            len: entries.len() + 1,
                            max: crate::nfs3::MAX_DIR_ENTRIES,
                        });
                    }
                    entries.push(Entry {
                        fileid: d.get_u64()?,
                        name: d.get_string(MAX_NAME)?.to_vec(),
                        cookie: d.get_u64()?,
                    });
                }
                Ok(ReaddirOk {
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

/// FSSTAT3resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsstatOk {
    /// obj_attributes.
    pub obj_attributes: Option<Fattr>,
    /// tbytes.
    pub tbytes: u64,
    /// fbytes.
    pub fbytes: u64,
    /// abytes.
    pub abytes: u64,
    /// tfiles.
    pub tfiles: u64,
    /// ffiles.
    pub ffiles: u64,
    /// afiles.
    pub afiles: u64,
    /// invarsec.
    pub invarsec: u32,
}

/// FSSTAT3res.
pub type FsstatRes = Res<FsstatOk, Option<Fattr>>;

impl XdrEncode for FsstatRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                put_post_op_attr(e, &o.obj_attributes)?;
                for v in [o.tbytes, o.fbytes, o.abytes, o.tfiles, o.ffiles, o.afiles] {
                    e.put_u64(v)?;
                }
                e.put_u32(o.invarsec)
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for FsstatRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(FsstatOk {
                    obj_attributes: get_post_op_attr(d)?,
                    tbytes: d.get_u64()?,
                    fbytes: d.get_u64()?,
                    abytes: d.get_u64()?,
                    tfiles: d.get_u64()?,
                    ffiles: d.get_u64()?,
                    afiles: d.get_u64()?,
                    invarsec: d.get_u32()?,
                })
            },
            get_post_op_attr,
        )
    }
}

/// PATHCONF3resok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathconfOk {
    /// obj_attributes.
    pub obj_attributes: Option<Fattr>,
    /// linkmax.
    pub linkmax: u32,
    /// name_max.
    pub name_max: u32,
    /// no_trunc.
    pub no_trunc: bool,
    /// chown_restricted.
    pub chown_restricted: bool,
    /// case_insensitive.
    pub case_insensitive: bool,
    /// case_preserving.
    pub case_preserving: bool,
}

/// PATHCONF3res.
pub type PathconfRes = Res<PathconfOk, Option<Fattr>>;

impl XdrEncode for PathconfRes {
    fn encode<S: Sink>(&self, e: &mut Encoder<S>) -> Result<(), XdrError> {
        encode_res(
            e,
            self,
            |e, o| {
                put_post_op_attr(e, &o.obj_attributes)?;
                e.put_u32(o.linkmax)?;
                e.put_u32(o.name_max)?;
                for b in [o.no_trunc, o.chown_restricted, o.case_insensitive, o.case_preserving] {
                    e.put_bool(b)?;
                }
                Ok(())
            },
            put_post_op_attr,
        )
    }
}

impl<'a> XdrDecode<'a> for PathconfRes {
    fn decode(d: &mut Decoder<'a>) -> Result<Self, XdrError> {
        decode_res(
            d,
            |d| {
                Ok(PathconfOk {
                    obj_attributes: get_post_op_attr(d)?,
                    linkmax: d.get_u32()?,
                    name_max: d.get_u32()?,
                    no_trunc: d.get_bool()?,
                    chown_restricted: d.get_bool()?,
                    case_insensitive: d.get_bool()?,
                    case_preserving: d.get_bool()?,
                })
            },
            get_post_op_attr,
        )
    }
}
