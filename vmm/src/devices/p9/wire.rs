//! The few pieces of the 9P2000.L wire format the device reads and writes itself: the
//! message header, the type numbers (Linux's `include/net/9p/9p.h`), a bounds-checked
//! little-endian reader for the requests it checks before the server sees them, and the
//! replies it answers on its own (`Rlerror`, `Rversion`, empty replies).
//!
//! Every message is `size[4] type[1] tag[2] body`, integers little-endian, strings `len[2]`
//! plus UTF-8 bytes; `size` counts the whole message.

/// Length of the message header (`size[4] type[1] tag[2]`).
pub const HEADER_LEN: usize = 7;
/// Length of an `Rlerror` reply (header + `ecode[4]`).
pub const RLERROR_LEN: usize = HEADER_LEN + 4;
/// Header of an `Rread`/`Rreaddir` reply before its data (header + `count[4]`).
pub const RDATA_HEADER_LEN: usize = HEADER_LEN + 4;
/// Most names in one `Twalk` (the protocol's `MAXWELEM`).
pub const MAX_WALK_NAMES: usize = 16;
/// Longest file name accepted (Linux's `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// The `msize` below which a `Tversion` is refused (what the p9 server requires).
pub const MIN_MSIZE: u32 = 256;
/// The protocol version the device speaks.
pub const VERSION_9P2000_L: &[u8] = b"9P2000.L";

/// Message types (T-messages; each reply is its request's type + 1).
#[allow(missing_docs)]
pub mod ty {
    pub const RLERROR: u8 = 7;
    pub const TSTATFS: u8 = 8;
    pub const TLOPEN: u8 = 12;
    pub const TLCREATE: u8 = 14;
    pub const TSYMLINK: u8 = 16;
    pub const TMKNOD: u8 = 18;
    pub const TRENAME: u8 = 20;
    pub const TREADLINK: u8 = 22;
    pub const TGETATTR: u8 = 24;
    pub const TSETATTR: u8 = 26;
    pub const TXATTRWALK: u8 = 30;
    pub const TXATTRCREATE: u8 = 32;
    pub const TREADDIR: u8 = 40;
    pub const TFSYNC: u8 = 50;
    pub const TLOCK: u8 = 52;
    pub const TGETLOCK: u8 = 54;
    pub const TLINK: u8 = 70;
    pub const TMKDIR: u8 = 72;
    pub const TRENAMEAT: u8 = 74;
    pub const TUNLINKAT: u8 = 76;
    pub const TVERSION: u8 = 100;
    pub const TAUTH: u8 = 102;
    pub const TATTACH: u8 = 104;
    pub const TFLUSH: u8 = 108;
    pub const TWALK: u8 = 110;
    pub const TOPEN: u8 = 112;
    pub const TCREATE: u8 = 114;
    pub const TREAD: u8 = 116;
    pub const TWRITE: u8 = 118;
    pub const TCLUNK: u8 = 120;
    pub const TREMOVE: u8 = 122;
    pub const TWSTAT: u8 = 126;
}

/// `Tlopen`/`Tlcreate` flags (Linux's `P9_DOTL_*`, octal like `open(2)`'s).
#[allow(missing_docs)]
pub mod open_flags {
    pub const ACCMODE: u32 = 0o3;
    pub const CREATE: u32 = 0o100;
    pub const TRUNC: u32 = 0o1000;
    pub const APPEND: u32 = 0o2000;
}

/// `Tsetattr` `valid` bits.
#[allow(missing_docs)]
pub mod setattr {
    pub const UID: u32 = 0x2;
    pub const GID: u32 = 0x4;
    pub const CTIME: u32 = 0x40;
}

/// Byte offsets inside a request of the fields the device rewrites.
pub mod offset {
    /// `count[4]` of a `Tread` or `Treaddir` (after `fid[4] offset[8]`).
    pub const IO_COUNT: usize = super::HEADER_LEN + 12;
    /// `valid[4]` of a `Tsetattr` (after `fid[4]`).
    pub const SETATTR_VALID: usize = super::HEADER_LEN + 4;
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The whole message's length, as it claims.
    pub size: u32,
    /// Message type.
    pub ty: u8,
    /// Tag, echoed by the reply.
    pub tag: u16,
}

impl Header {
    /// Reads the header at the start of `b` (`None` when `b` is shorter than one).
    pub fn parse(b: &[u8]) -> Option<Header> {
        let h = b.get(..HEADER_LEN)?;
        Some(Header {
            size: u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
            ty: h[4],
            tag: u16::from_le_bytes([h[5], h[6]]),
        })
    }
}

/// A request body too short for what its type must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

/// Bounds-checked reader over a message body.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Reads `msg` from just after its header.
    pub fn body(msg: &'a [u8]) -> Self {
        Self {
            buf: msg,
            pos: HEADER_LEN,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        let end = self.pos.checked_add(n).ok_or(Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(Truncated)?;
        self.pos = end;
        Ok(s)
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    /// A `u16`.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Skips `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<(), Truncated> {
        self.take(n).map(drop)
    }

    /// A string's raw bytes (not checked for UTF-8).
    pub fn string(&mut self) -> Result<&'a [u8], Truncated> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// A reply header for `len` bytes in total.
fn header(out: &mut Vec<u8>, len: usize, ty: u8, tag: u16) {
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.push(ty);
    out.extend_from_slice(&tag.to_le_bytes());
}

/// `Rlerror` with `errno` for the request tagged `tag`.
pub fn rlerror(tag: u16, errno: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(RLERROR_LEN);
    header(&mut out, RLERROR_LEN, ty::RLERROR, tag);
    out.extend_from_slice(&(errno as u32).to_le_bytes());
    out
}

/// A reply without a body (`Rflush`, `Rsetattr`, …) to a request of type `request`.
pub fn empty_reply(request: u8, tag: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    header(&mut out, HEADER_LEN, request.wrapping_add(1), tag);
    out
}

/// `Rversion` with `msize` and `version`.
pub fn rversion(tag: u16, msize: u32, version: &[u8]) -> Vec<u8> {
    let len = HEADER_LEN + 4 + 2 + version.len();
    let mut out = Vec::with_capacity(len);
    header(&mut out, len, ty::TVERSION + 1, tag);
    out.extend_from_slice(&msize.to_le_bytes());
    out.extend_from_slice(&(version.len() as u16).to_le_bytes());
    out.extend_from_slice(version);
    out
}

/// Why a name in a request is refused, as an errno: empty, `.` or `..`, containing `/` or
/// NUL, not UTF-8, or longer than [`MAX_NAME_LEN`]. A name names one entry of the directory
/// it is resolved in, never a path.
pub fn check_name(name: &[u8]) -> Result<(), i32> {
    if name == b"." || name == b".." {
        return Err(libc::EPERM);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(libc::EINVAL);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(libc::ENAMETOOLONG);
    }
    if std::str::from_utf8(name).is_err() {
        return Err(libc::EINVAL);
    }
    Ok(())
}
