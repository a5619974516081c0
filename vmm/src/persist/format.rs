//! On-disk snapshot container.
//!
//! A snapshot is two files in one directory:
//!
//! * [`STATE_FILE`]: `MAGIC (8) | format version (u32 LE) | header length (u32 LE) |
//!   header (JSON) | SHA-256 of everything before it (32) | state blob`. The header records
//!   what the snapshot was taken of (memory size, vCPU count, device set, guest image hash),
//!   the length and SHA-256 of the state blob, the guest RAM regions, and the length and
//!   SHA-256 of the memory file.
//! * [`MEMORY_FILE`]: the guest RAM regions ([`crate::memory::ram_regions`]: below the 32-bit
//!   MMIO gap, then from 4 GiB up) back to back in guest-physical order, written sparsely
//!   (zero pages are holes), each region mapped `MAP_PRIVATE` from its file offset on restore.
//!   Its digest ([`MemoryDigest`]) covers the non-zero pages only (indexed by file offset), so
//!   verifying it reads just the file's data extents.
//!
//! Both files are created mode 0600: guest memory holds the guest's session secret.
//!
//! Snapshot files are untrusted input: every length is bounded before anything is allocated,
//! all checksums and the expected configuration are verified by [`load`] before it returns,
//! and a snapshot that fails any check is refused with a [`SnapshotError`], so a caller that
//! only restores from a successful [`load`] never half-restores a VM.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sha2::{Digest, Sha256};
use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMem;

/// First bytes of a state file.
pub const MAGIC: [u8; 8] = *b"VBXSNAP\0";
/// Current (and only accepted) format version. Bump on any incompatible change to the
/// container or to the serialized state.
/// Version 2: the memory digest covers non-zero pages only ([`MemoryDigest`]).
/// Version 3: guest RAM in up to two regions (split at the 32-bit MMIO gap), recorded in the
/// header ([`SnapshotHeader::memory_regions`]) and stored back to back in the memory file.
/// Version 4: virtio-blk disks in the device state (`block` slots before `vsock`).
/// Version 5: the virtio-net device in the device state (a `net` slot after the disks).
/// Version 6: the virtio-9p share slots in the device state (four `p9` slots after vsock).
pub const FORMAT_VERSION: u32 = 6;
/// Largest header accepted.
pub const MAX_HEADER_LEN: u32 = 64 * 1024;
/// Largest state blob accepted (the real one is ≈10 KB per vCPU plus device buffers).
pub const MAX_STATE_LEN: u64 = 64 * 1024 * 1024;
/// Name of the state file inside a snapshot directory.
pub const STATE_FILE: &str = "state.snap";
/// Name of the memory file inside a snapshot directory.
pub const MEMORY_FILE: &str = "memory.bin";
/// Granularity of sparse memory writes.
pub const PAGE_SIZE: usize = 4096;

const PREFIX_LEN: usize = MAGIC.len() + 4 + 4;
const DIGEST_LEN: usize = 32;
const COPY_CHUNK: usize = 1 << 20;

/// What a snapshot was taken of. A snapshot restores only into an identical configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotKey {
    /// Guest memory size in bytes.
    pub memory_size: u64,
    /// Number of vCPUs.
    pub vcpus: u32,
    /// Device set, in bus order (e.g. `["serial", "vsock"]`).
    pub devices: Vec<String>,
    /// Opaque hash identifying the guest image (kernel, initrd, command line).
    pub image_hash: String,
}

/// The verified header of a state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotHeader {
    /// What the snapshot was taken of.
    pub key: SnapshotKey,
    /// VMM version that wrote it (informational).
    pub vmm_version: String,
    /// Length of the state blob.
    pub state_len: u64,
    /// SHA-256 of the state blob, hex.
    pub state_sha256: String,
    /// Guest RAM regions in guest-physical order, as stored back to back in the memory file;
    /// must be the layout of `key.memory_size` ([`crate::memory::ram_regions`]).
    pub memory_regions: Vec<SavedRegion>,
    /// Length of the memory file (equals `key.memory_size`).
    pub memory_len: u64,
    /// [`MemoryDigest`] of the memory file (SHA-256 over its non-zero pages, each prefixed by
    /// its page index), hex.
    pub memory_sha256: String,
}

/// One guest RAM region of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedRegion {
    /// Guest-physical start.
    pub guest_addr: u64,
    /// Length in bytes.
    pub size: u64,
}

/// The regions a guest of `memory_size` bytes has (and its memory file holds).
pub fn memory_layout(memory_size: u64) -> Result<Vec<SavedRegion>, SnapshotError> {
    let regions = crate::memory::ram_regions(memory_size)
        .map_err(|e| SnapshotError::BadHeader(format!("memory size {memory_size}: {e}")))?;
    Ok(regions
        .iter()
        .map(|r| SavedRegion {
            guest_addr: r.start,
            size: r.size,
        })
        .collect())
}

/// Why a snapshot was refused.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading or writing a snapshot file failed.
    #[error("snapshot file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Not a voidbox snapshot.
    #[error("not a voidbox snapshot (bad magic)")]
    BadMagic,
    /// Written by an incompatible VMM.
    #[error(
        "snapshot format version {found} is not supported (this VMM reads version {supported}); \
         take the snapshot again with this version"
    )]
    UnsupportedVersion {
        /// Version in the file.
        found: u32,
        /// Version this VMM reads.
        supported: u32,
    },
    /// The file ends early.
    #[error("snapshot truncated: {0}")]
    Truncated(&'static str),
    /// Data after the state blob.
    #[error("snapshot has trailing data")]
    TrailingData,
    /// A length field exceeds its bound.
    #[error("snapshot {what} length {len} exceeds the limit {limit}")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Length found.
        len: u64,
        /// Limit.
        limit: u64,
    },
    /// The header does not parse.
    #[error("snapshot header invalid: {0}")]
    BadHeader(String),
    /// A checksum does not match.
    #[error("snapshot {0} checksum mismatch (corrupt snapshot)")]
    Checksum(&'static str),
    /// The snapshot was taken of a different configuration.
    #[error("snapshot does not match this VM: {field} is {found}, expected {expected}")]
    Mismatch {
        /// Which field.
        field: &'static str,
        /// Expected value.
        expected: String,
        /// Value in the snapshot.
        found: String,
    },
    /// The state blob does not deserialize into the expected state.
    #[error("snapshot state invalid: {0}")]
    BadState(String),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Serializes `state` into a blob for [`encode`].
pub fn encode_state<T: Serialize>(state: &T) -> Result<Vec<u8>, SnapshotError> {
    serde_json::to_vec(state).map_err(|e| SnapshotError::BadState(e.to_string()))
}

/// Deserializes a (verified) blob. Unknown fields are the state type's business
/// (`deny_unknown_fields` on the state structs).
pub fn decode_state<T: DeserializeOwned>(blob: &[u8]) -> Result<T, SnapshotError> {
    serde_json::from_slice(blob).map_err(|e| SnapshotError::BadState(e.to_string()))
}

/// Builds a state file's contents.
pub fn encode(
    key: &SnapshotKey,
    state: &[u8],
    memory_len: u64,
    memory_sha256: &[u8; 32],
) -> Result<Vec<u8>, SnapshotError> {
    let state_len = state.len() as u64;
    if state_len > MAX_STATE_LEN {
        return Err(SnapshotError::TooLarge {
            what: "state",
            len: state_len,
            limit: MAX_STATE_LEN,
        });
    }
    let header = SnapshotHeader {
        key: key.clone(),
        vmm_version: env!("CARGO_PKG_VERSION").to_string(),
        state_len,
        state_sha256: hex(&Sha256::digest(state)),
        memory_regions: memory_layout(key.memory_size)?,
        memory_len,
        memory_sha256: hex(memory_sha256),
    };
    let hbytes =
        serde_json::to_vec(&header).map_err(|e| SnapshotError::BadHeader(e.to_string()))?;
    let hlen = u32::try_from(hbytes.len())
        .ok()
        .filter(|&l| l <= MAX_HEADER_LEN)
        .ok_or(SnapshotError::TooLarge {
            what: "header",
            len: hbytes.len() as u64,
            limit: u64::from(MAX_HEADER_LEN),
        })?;
    let mut out = Vec::with_capacity(PREFIX_LEN + hbytes.len() + DIGEST_LEN + state.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&hlen.to_le_bytes());
    out.extend_from_slice(&hbytes);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out.extend_from_slice(state);
    Ok(out)
}

fn take<'a>(buf: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], SnapshotError> {
    if buf.len() < n {
        return Err(SnapshotError::Truncated(what));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn mismatch(field: &'static str, expected: impl ToString, found: impl ToString) -> SnapshotError {
    SnapshotError::Mismatch {
        field,
        expected: expected.to_string(),
        found: found.to_string(),
    }
}

/// Checks `found` against `expected`, field by field.
pub fn check_key(expected: &SnapshotKey, found: &SnapshotKey) -> Result<(), SnapshotError> {
    if expected.memory_size != found.memory_size {
        return Err(mismatch(
            "memory size",
            expected.memory_size,
            found.memory_size,
        ));
    }
    if expected.vcpus != found.vcpus {
        return Err(mismatch("vCPU count", expected.vcpus, found.vcpus));
    }
    if expected.devices != found.devices {
        return Err(mismatch(
            "device set",
            expected.devices.join(","),
            found.devices.join(","),
        ));
    }
    if expected.image_hash != found.image_hash {
        return Err(mismatch(
            "guest image",
            &expected.image_hash,
            &found.image_hash,
        ));
    }
    Ok(())
}

/// Parses and verifies a state file's contents: magic, version, bounds, header checksum,
/// state checksum, and (when given) the expected configuration. Returns the header and the
/// state blob.
pub fn decode<'a>(
    data: &'a [u8],
    expected: Option<&SnapshotKey>,
) -> Result<(SnapshotHeader, &'a [u8]), SnapshotError> {
    let mut rest = data;
    let magic = take(&mut rest, MAGIC.len(), "magic")?;
    if magic != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = le_u32(take(&mut rest, 4, "version")?);
    if version != FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let hlen = le_u32(take(&mut rest, 4, "header length")?);
    if hlen > MAX_HEADER_LEN {
        return Err(SnapshotError::TooLarge {
            what: "header",
            len: u64::from(hlen),
            limit: u64::from(MAX_HEADER_LEN),
        });
    }
    let hbytes = take(&mut rest, hlen as usize, "header")?;
    let digest = take(&mut rest, DIGEST_LEN, "header checksum")?;
    let covered = &data[..PREFIX_LEN + hbytes.len()];
    if Sha256::digest(covered).as_slice() != digest {
        return Err(SnapshotError::Checksum("header"));
    }
    let header: SnapshotHeader =
        serde_json::from_slice(hbytes).map_err(|e| SnapshotError::BadHeader(e.to_string()))?;
    if header.state_len > MAX_STATE_LEN {
        return Err(SnapshotError::TooLarge {
            what: "state",
            len: header.state_len,
            limit: MAX_STATE_LEN,
        });
    }
    if header.memory_len != header.key.memory_size {
        return Err(SnapshotError::BadHeader(format!(
            "memory file length {} differs from memory size {}",
            header.memory_len, header.key.memory_size
        )));
    }
    if header.memory_regions != memory_layout(header.key.memory_size)? {
        return Err(SnapshotError::BadHeader(format!(
            "memory regions {:?} are not the layout of {} bytes of guest memory",
            header.memory_regions, header.key.memory_size
        )));
    }
    let state_len = usize::try_from(header.state_len).map_err(|_| SnapshotError::TooLarge {
        what: "state",
        len: header.state_len,
        limit: MAX_STATE_LEN,
    })?;
    let state = take(&mut rest, state_len, "state")?;
    if !rest.is_empty() {
        return Err(SnapshotError::TrailingData);
    }
    if hex(&Sha256::digest(state)) != header.state_sha256 {
        return Err(SnapshotError::Checksum("state"));
    }
    if let Some(exp) = expected {
        check_key(exp, &header.key)?;
    }
    Ok((header, state))
}

/// Reads a state file, refusing files longer than any valid one before reading them.
pub fn read_state_file(path: &Path) -> Result<Vec<u8>, SnapshotError> {
    let f = File::open(path).map_err(io_err(path))?;
    let limit = (PREFIX_LEN + DIGEST_LEN) as u64 + u64::from(MAX_HEADER_LEN) + MAX_STATE_LEN;
    let mut data = Vec::new();
    // Read one byte past the limit to detect oversized files without trusting metadata.
    f.take(limit + 1)
        .read_to_end(&mut data)
        .map_err(io_err(path))?;
    if data.len() as u64 > limit {
        return Err(SnapshotError::TooLarge {
            what: "state file",
            len: data.len() as u64,
            limit,
        });
    }
    Ok(data)
}

/// Removes a stale temporary file (a crashed earlier save); absence is fine.
fn remove_stale(path: &Path) -> Result<(), SnapshotError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(path)(e)),
        _ => Ok(()),
    }
}

/// Creates `path` new, mode 0600 (snapshot files hold the guest's secrets).
fn create_private(path: &Path) -> Result<File, SnapshotError> {
    remove_stale(path)?;
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename), mode 0600.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SnapshotError> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = create_private(&tmp)?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// SHA-256 over the non-zero pages of guest memory, each prefixed by its page index
/// (u64 LE), in ascending order. All-zero pages (holes in the memory file) contribute
/// nothing, so verifying costs only the file's data, not the guest's memory size.
#[derive(Default)]
pub struct MemoryDigest {
    hasher: Sha256,
    next_page: u64,
}

impl MemoryDigest {
    /// A digest over no pages yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds page `index` (exactly [`PAGE_SIZE`] bytes) if it is non-zero. Pages must come in
    /// ascending order; a page at or below one already added is ignored.
    pub fn add_page(&mut self, index: u64, page: &[u8]) {
        if index < self.next_page || is_zero(page) {
            return;
        }
        self.hasher.update(index.to_le_bytes());
        self.hasher.update(page);
        self.next_page = index + 1;
    }

    /// The digest.
    pub fn finish(self) -> [u8; 32] {
        self.hasher.finalize().into()
    }
}

/// True when `x` is a multiple of [`PAGE_SIZE`] (a power of two).
fn page_aligned(x: u64) -> bool {
    x & (PAGE_SIZE as u64 - 1) == 0
}

/// True when every byte of `buf` is zero.
pub fn is_zero(buf: &[u8]) -> bool {
    let (head, body, tail) = {
        // SAFETY: every bit pattern is a valid u128; align_to only reinterprets the aligned
        // middle of the byte slice, which stays borrowed immutably for the call.
        unsafe { buf.align_to::<u128>() }
    };
    head.iter().all(|&b| b == 0) && body.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// Writes guest memory (`size` bytes laid out by [`memory_layout`], each region at its file
/// offset) to `path` (created new, mode 0600) as a sparse file (all-zero pages are left as
/// holes) and returns its [`MemoryDigest`].
pub fn write_memory_file(
    mem: &GuestMem,
    size: u64,
    path: &Path,
) -> Result<[u8; 32], SnapshotError> {
    if !page_aligned(size) {
        return Err(SnapshotError::BadHeader(format!(
            "memory size {size} is not a multiple of the page size"
        )));
    }
    let layout = memory_layout(size)?;
    let f = create_private(path)?;
    f.set_len(size).map_err(io_err(path))?;
    let mut digest = MemoryDigest::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut file_off = 0u64;
    for region in layout {
        let mut off = 0u64;
        while off < region.size {
            let n =
                usize::try_from((region.size - off).min(COPY_CHUNK as u64)).unwrap_or(COPY_CHUNK);
            let chunk = &mut buf[..n];
            let gpa = region.guest_addr + off;
            mem.read_slice(chunk, GuestAddress(gpa)).map_err(|e| {
                io_err(path)(io::Error::other(format!(
                    "reading guest memory at {gpa:#x}: {e}"
                )))
            })?;
            for (i, page) in chunk.chunks(PAGE_SIZE).enumerate() {
                if !is_zero(page) {
                    let at = file_off + off + (i * PAGE_SIZE) as u64;
                    digest.add_page(at / PAGE_SIZE as u64, page);
                    f.write_all_at(page, at).map_err(io_err(path))?;
                }
            }
            off += n as u64;
        }
        file_off += region.size;
    }
    f.sync_all().map_err(io_err(path))?;
    Ok(digest.finish())
}

/// How much of the memory file [`load`] verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryCheck {
    /// Length and [`MemoryDigest`] (reads only the file's data extents: milliseconds for a
    /// freshly booted guest). Restores always use this.
    Full,
    /// Length only (tests and tools).
    LengthOnly,
}

/// `lseek(fd, off, whence)`; `None` at ENXIO (no data/hole at or after `off`).
fn seek(f: &File, off: u64, whence: libc::c_int) -> Result<Option<u64>, io::Error> {
    let off = libc::off_t::try_from(off).map_err(|_| io::Error::other("offset too large"))?;
    // SAFETY: lseek on a descriptor owned by `f`; it only moves the file offset.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(r as u64))
}

/// Data extents of `f` within `[0, len)`, as page-aligned `[start, end)` ranges. A file
/// system without SEEK_DATA support reports one extent covering everything.
fn data_extents(f: &File, len: u64) -> Result<Vec<(u64, u64)>, io::Error> {
    let page = PAGE_SIZE as u64;
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut off = 0u64;
    while off < len {
        let Some(start) = seek(f, off, libc::SEEK_DATA)? else {
            break;
        };
        if start >= len {
            break;
        }
        let end = seek(f, start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        let (s, e) = (start / page * page, end.div_ceil(page) * page);
        match out.last_mut() {
            Some(last) if last.1 >= s => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
        off = end.max(start + 1);
    }
    Ok(out)
}

/// Computes the [`MemoryDigest`] of a memory file of `len` bytes, reading only its data.
pub fn digest_memory_file(f: &File, len: u64) -> Result<[u8; 32], io::Error> {
    let mut digest = MemoryDigest::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    for (start, end) in data_extents(f, len)? {
        let end = end.min(len);
        let mut off = start;
        while off < end {
            let n = usize::try_from((end - off).min(COPY_CHUNK as u64)).unwrap_or(COPY_CHUNK);
            let chunk = &mut buf[..n];
            f.read_exact_at(chunk, off)?;
            for (i, page) in chunk.chunks(PAGE_SIZE).enumerate() {
                digest.add_page((off + (i * PAGE_SIZE) as u64) / PAGE_SIZE as u64, page);
            }
            off += n as u64;
        }
    }
    Ok(digest.finish())
}

/// Verifies the memory file at `path` against the header.
pub fn verify_memory_file(
    path: &Path,
    header: &SnapshotHeader,
    check: MemoryCheck,
) -> Result<(), SnapshotError> {
    let f = File::open(path).map_err(io_err(path))?;
    verify_memory(&f, path, header, check)
}

/// Verifies the open memory file `f` (at `path`, for messages) against the header.
pub fn verify_memory(
    f: &File,
    path: &Path,
    header: &SnapshotHeader,
    check: MemoryCheck,
) -> Result<(), SnapshotError> {
    let meta = f.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(io_err(path)(io::Error::other("not a regular file")));
    }
    let len = meta.len();
    if len != header.memory_len {
        return Err(mismatch("memory file length", header.memory_len, len));
    }
    if !page_aligned(len) {
        return Err(SnapshotError::BadHeader(format!(
            "memory length {len} is not a multiple of the page size"
        )));
    }
    if check == MemoryCheck::Full {
        let digest = digest_memory_file(f, len).map_err(io_err(path))?;
        if hex(&digest) != header.memory_sha256 {
            return Err(SnapshotError::Checksum("memory"));
        }
    }
    Ok(())
}

/// What [`save`] wrote.
#[derive(Debug, Clone)]
pub struct SavedSnapshot {
    /// The header written.
    pub header: SnapshotHeader,
    /// Size of the state file.
    pub state_file_bytes: u64,
    /// Bytes allocated on disk by both files (blocks × 512).
    pub disk_bytes: u64,
}

/// Writes a complete snapshot into `dir` (created mode 0700 if missing): the memory file
/// first, then the state file, each through a temporary file and a rename (so a state file
/// only exists next to a complete memory file, and a memory file mapped by a running VM is
/// never truncated under it). Both files are mode 0600.
pub fn save(
    dir: &Path,
    key: &SnapshotKey,
    state: &[u8],
    mem: &GuestMem,
) -> Result<SavedSnapshot, SnapshotError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    let mem_path = dir.join(MEMORY_FILE);
    let mem_tmp = mem_path.with_extension("tmp");
    let digest = write_memory_file(mem, key.memory_size, &mem_tmp)?;
    fs::rename(&mem_tmp, &mem_path).map_err(io_err(&mem_path))?;
    let bytes = encode(key, state, key.memory_size, &digest)?;
    let state_path = dir.join(STATE_FILE);
    write_atomic(&state_path, &bytes)?;
    // Persist the renames.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    let (header, _) = decode(&bytes, None)?;
    let mut disk_bytes = 0;
    for p in [&mem_path, &state_path] {
        disk_bytes += fs::metadata(p).map_err(io_err(p))?.blocks() * 512;
    }
    Ok(SavedSnapshot {
        header,
        state_file_bytes: bytes.len() as u64,
        disk_bytes,
    })
}

/// A fully verified snapshot, ready to restore.
#[derive(Debug)]
pub struct LoadedSnapshot {
    /// The header.
    pub header: SnapshotHeader,
    /// The state blob (checksum verified).
    pub state: Vec<u8>,
    /// The memory file (length, and with [`MemoryCheck::Full`] checksum, verified).
    pub memory_path: PathBuf,
    /// The memory file as verified (map this one, not a second open of the path).
    pub memory_file: File,
}

/// Reads and verifies the snapshot in `dir` against `expected`. Nothing about a VM is touched;
/// restore only from the returned value.
pub fn load(
    dir: &Path,
    expected: &SnapshotKey,
    check: MemoryCheck,
) -> Result<LoadedSnapshot, SnapshotError> {
    let data = read_state_file(&dir.join(STATE_FILE))?;
    let (header, state) = decode(&data, Some(expected))?;
    let state = state.to_vec();
    let memory_path = dir.join(MEMORY_FILE);
    let memory_file = File::open(&memory_path).map_err(io_err(&memory_path))?;
    verify_memory(&memory_file, &memory_path, &header, check)?;
    Ok(LoadedSnapshot {
        header,
        state,
        memory_path,
        memory_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;

    const MEM: u64 = 1 << 20;

    fn key() -> SnapshotKey {
        SnapshotKey {
            memory_size: MEM,
            vcpus: 1,
            devices: vec!["serial".into(), "vsock".into()],
            image_hash: "abc123".into(),
        }
    }

    fn sample() -> Vec<u8> {
        encode(&key(), b"{\"x\":1}", MEM, &[7u8; 32]).unwrap()
    }

    fn header_len(data: &[u8]) -> usize {
        le_u32(&data[12..16]) as usize
    }

    #[test]
    fn round_trip() {
        let data = sample();
        let (h, state) = decode(&data, Some(&key())).unwrap();
        assert_eq!(state, b"{\"x\":1}");
        assert_eq!(h.key, key());
        assert_eq!(h.memory_sha256, hex(&[7u8; 32]));
        assert_eq!(h.state_len, 7);
    }

    #[test]
    fn bad_magic_and_version() {
        let mut data = sample();
        data[0] ^= 1;
        assert!(matches!(decode(&data, None), Err(SnapshotError::BadMagic)));
        // Version 1 (whole-file memory digest), 2 (one memory region), 3 (no disks), 4 (no
        // network device), 5 (no share slots) and a future version are all refused.
        for v in [1u32, 2, 3, 4, 5, FORMAT_VERSION + 1] {
            let mut data = sample();
            data[8..12].copy_from_slice(&v.to_le_bytes());
            assert!(matches!(
                decode(&data, None),
                Err(SnapshotError::UnsupportedVersion {
                    found,
                    supported: FORMAT_VERSION
                }) if found == v
            ));
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let data = sample();
        for n in 0..data.len() {
            let r = decode(&data[..n], None);
            assert!(
                matches!(
                    r,
                    Err(SnapshotError::Truncated(_)) | Err(SnapshotError::Checksum(_))
                ),
                "truncated to {n}: {r:?}"
            );
        }
        let mut long = data.clone();
        long.push(0);
        assert!(matches!(
            decode(&long, None),
            Err(SnapshotError::TrailingData)
        ));
    }

    #[test]
    fn every_bit_flip_is_refused() {
        let data = sample();
        for i in 0..data.len() {
            for bit in [0u8, 3, 7] {
                let mut d = data.clone();
                d[i] ^= 1 << bit;
                assert!(
                    decode(&d, Some(&key())).is_err(),
                    "flip at byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn corrupt_state_and_header_checksums() {
        let mut data = sample();
        let last = data.len() - 1;
        data[last] ^= 0x20;
        assert!(matches!(
            decode(&data, None),
            Err(SnapshotError::Checksum("state"))
        ));
        let mut data = sample();
        data[PREFIX_LEN + 2] ^= 0x01;
        assert!(matches!(
            decode(&data, None),
            Err(SnapshotError::Checksum("header"))
        ));
    }

    #[test]
    fn huge_lengths_are_refused_before_allocation() {
        let mut data = sample();
        data[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&data, None),
            Err(SnapshotError::TooLarge { what: "header", .. })
        ));
        // A header that claims a giant state, with a valid header checksum.
        let mut h = sample_header();
        h.state_len = u64::MAX;
        let d = encode_header(&h);
        assert!(matches!(
            decode(&d, None),
            Err(SnapshotError::TooLarge { what: "state", .. })
        ));
    }

    /// The header of [`sample`].
    fn sample_header() -> SnapshotHeader {
        let data = sample();
        let hl = header_len(&data);
        serde_json::from_slice(&data[16..16 + hl]).unwrap()
    }

    /// Magic, version, `h` and a valid header checksum: a state file up to its state.
    fn encode_header(h: &SnapshotHeader) -> Vec<u8> {
        let hb = serde_json::to_vec(h).unwrap();
        let mut d = Vec::new();
        d.extend_from_slice(&MAGIC);
        d.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        d.extend_from_slice(&(hb.len() as u32).to_le_bytes());
        d.extend_from_slice(&hb);
        let dg = Sha256::digest(&d);
        d.extend_from_slice(&dg);
        d
    }

    /// A state file whose header was changed by `f`, with valid checksums.
    fn with_header(f: impl FnOnce(&mut SnapshotHeader)) -> Vec<u8> {
        let mut h = sample_header();
        f(&mut h);
        let state = b"{\"x\":1}";
        h.state_len = state.len() as u64;
        let mut d = encode_header(&h);
        d.extend_from_slice(state);
        d
    }

    #[test]
    fn memory_regions_must_be_the_layout_of_the_memory_size() {
        let (h, _) = decode(&sample(), None).unwrap();
        assert_eq!(
            h.memory_regions,
            [SavedRegion {
                guest_addr: 0,
                size: MEM
            }]
        );
        decode(&with_header(|_| {}), None).unwrap();
        for bad in [
            vec![],
            vec![SavedRegion {
                guest_addr: 0,
                size: MEM / 2,
            }],
            vec![SavedRegion {
                guest_addr: 1 << 32,
                size: MEM,
            }],
            vec![
                SavedRegion {
                    guest_addr: 0,
                    size: MEM,
                },
                SavedRegion {
                    guest_addr: 1 << 32,
                    size: 0,
                },
            ],
        ] {
            let d = with_header(|h| h.memory_regions = bad.clone());
            assert!(
                matches!(decode(&d, None), Err(SnapshotError::BadHeader(_))),
                "{bad:?}"
            );
        }
        // A key whose size has no layout (not page-aligned) is refused too.
        let d = with_header(|h| {
            h.key.memory_size = MEM + 1;
            h.memory_len = MEM + 1;
        });
        assert!(matches!(decode(&d, None), Err(SnapshotError::BadHeader(_))));
    }

    #[test]
    fn guest_above_the_mmio_gap_saves_and_restores_both_regions() {
        use crate::memory::{map_guest_memory_file, HIGH_RAM_START, MMIO_GAP_START};
        const SIZE: u64 = 4 << 30;
        let dir = tempfile::tempdir().unwrap();
        let k = SnapshotKey {
            memory_size: SIZE,
            ..key()
        };
        let mem = create_guest_memory(SIZE).unwrap();
        mem.write_slice(b"low", GuestAddress(0x2000)).unwrap();
        mem.write_slice(b"below gap", GuestAddress(MMIO_GAP_START - 9))
            .unwrap();
        mem.write_slice(b"above gap", GuestAddress(HIGH_RAM_START))
            .unwrap();
        mem.write_slice(b"top", GuestAddress(HIGH_RAM_START + (1 << 30) - 3))
            .unwrap();
        let saved = save(dir.path(), &k, b"{}", &mem).unwrap();
        assert_eq!(saved.header.memory_len, SIZE);
        assert_eq!(saved.header.memory_regions.len(), 2);
        assert!(saved.disk_bytes < 1 << 20, "{}", saved.disk_bytes);
        // In the file the high region follows the low one.
        let mp = dir.path().join(MEMORY_FILE);
        let f = File::open(&mp).unwrap();
        let mut b = [0u8; 9];
        f.read_exact_at(&mut b, MMIO_GAP_START).unwrap();
        assert_eq!(&b, b"above gap");
        // Verified and mapped back at the right guest addresses.
        let snap = load(dir.path(), &k, MemoryCheck::Full).unwrap();
        let m = map_guest_memory_file(snap.memory_file, SIZE).unwrap();
        for (at, want) in [
            (0x2000, &b"low"[..]),
            (MMIO_GAP_START - 9, b"below gap"),
            (HIGH_RAM_START, b"above gap"),
            (HIGH_RAM_START + (1 << 30) - 3, b"top"),
        ] {
            let mut got = vec![0u8; want.len()];
            m.read_slice(&mut got, GuestAddress(at)).unwrap();
            assert_eq!(got, want, "at {at:#x}");
        }
        // A changed byte in the high region is caught; a smaller guest is refused.
        let fw = OpenOptions::new().write(true).open(&mp).unwrap();
        fw.write_all_at(b"A", MMIO_GAP_START).unwrap();
        assert!(matches!(
            load(dir.path(), &k, MemoryCheck::Full),
            Err(SnapshotError::Checksum("memory"))
        ));
        let small = SnapshotKey {
            memory_size: 3 << 30,
            ..key()
        };
        assert!(matches!(
            load(dir.path(), &small, MemoryCheck::LengthOnly),
            Err(SnapshotError::Mismatch { .. })
        ));
    }

    #[test]
    fn mismatched_configuration_is_refused() {
        let data = sample();
        for (k, field) in [
            (
                SnapshotKey {
                    memory_size: 2 * MEM,
                    ..key()
                },
                "memory size",
            ),
            (SnapshotKey { vcpus: 2, ..key() }, "vCPU count"),
            (
                SnapshotKey {
                    devices: vec!["serial".into()],
                    ..key()
                },
                "device set",
            ),
            (
                SnapshotKey {
                    image_hash: "other".into(),
                    ..key()
                },
                "guest image",
            ),
        ] {
            match decode(&data, Some(&k)) {
                Err(SnapshotError::Mismatch { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn save_and_load_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mem = create_guest_memory(MEM).unwrap();
        mem.write_slice(b"hello guest", GuestAddress(0x3000))
            .unwrap();
        mem.write_slice(&[0xff; 10], GuestAddress(MEM - 10))
            .unwrap();
        let state = encode_state(&vec![1u32, 2, 3]).unwrap();
        save(dir.path(), &key(), &state, &mem).unwrap();

        let snap = load(dir.path(), &key(), MemoryCheck::Full).unwrap();
        let v: Vec<u32> = decode_state(&snap.state).unwrap();
        assert_eq!(v, vec![1, 2, 3]);
        let bytes = fs::read(&snap.memory_path).unwrap();
        assert_eq!(bytes.len() as u64, MEM);
        assert_eq!(&bytes[0x3000..0x3000 + 11], b"hello guest");
        assert_eq!(&bytes[(MEM - 10) as usize..], &[0xff; 10]);
        assert!(bytes[..0x3000].iter().all(|&b| b == 0));

        // Mismatched configuration.
        let k2 = SnapshotKey { vcpus: 4, ..key() };
        assert!(matches!(
            load(dir.path(), &k2, MemoryCheck::LengthOnly),
            Err(SnapshotError::Mismatch { .. })
        ));

        // Corrupt memory: caught by the full check only; truncated memory by both.
        let mp = dir.path().join(MEMORY_FILE);
        let f = OpenOptions::new().write(true).open(&mp).unwrap();
        f.write_all_at(b"X", 0x3000).unwrap();
        assert!(load(dir.path(), &key(), MemoryCheck::LengthOnly).is_ok());
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::Full),
            Err(SnapshotError::Checksum("memory"))
        ));
        f.set_len(MEM - 4096).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::LengthOnly),
            Err(SnapshotError::Mismatch { .. })
        ));

        // Truncated and missing state files.
        let sp = dir.path().join(STATE_FILE);
        let data = fs::read(&sp).unwrap();
        fs::write(&sp, &data[..data.len() - 1]).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::LengthOnly),
            Err(SnapshotError::Truncated(_))
        ));
        fs::remove_file(&sp).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::LengthOnly),
            Err(SnapshotError::Io { .. })
        ));
    }

    #[test]
    fn memory_digest_covers_data_pages_only() {
        let dir = tempfile::tempdir().unwrap();
        let mem = create_guest_memory(MEM).unwrap();
        mem.write_slice(b"page one", GuestAddress(0x1000)).unwrap();
        mem.write_slice(b"page nine", GuestAddress(0x9ff0)).unwrap();
        let hdr = save(dir.path(), &key(), b"{}", &mem).unwrap();
        let mp = dir.path().join(MEMORY_FILE);
        let f = File::open(&mp).unwrap();
        // The digest of the file equals the one computed while writing, and equals a digest
        // over the two non-zero pages (index-prefixed) computed by hand.
        let from_file = digest_memory_file(&f, MEM).unwrap();
        assert_eq!(hex(&from_file), hdr.header.memory_sha256);
        let mut by_hand = Sha256::new();
        let bytes = fs::read(&mp).unwrap();
        for idx in [1u64, 9] {
            by_hand.update(idx.to_le_bytes());
            let at = idx as usize * PAGE_SIZE;
            by_hand.update(&bytes[at..at + PAGE_SIZE]);
        }
        assert_eq!(from_file, <[u8; 32]>::from(by_hand.finalize()));
        // Sparse: only the two data pages are allocated (file systems may round up).
        assert!(hdr.disk_bytes < MEM / 2, "{}", hdr.disk_bytes);
        // Zeros written into a hole change nothing (the content is the same).
        let fw = OpenOptions::new().write(true).open(&mp).unwrap();
        fw.write_all_at(&[0u8; PAGE_SIZE], 0x20000).unwrap();
        load(dir.path(), &key(), MemoryCheck::Full).unwrap();
        // Same bytes moved to another page: refused (page indices are hashed).
        fw.write_all_at(&[0u8; PAGE_SIZE], 0x9000).unwrap();
        fw.write_all_at(&bytes[0x9000..0xa000], 0xa000).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::Full),
            Err(SnapshotError::Checksum("memory"))
        ));
    }

    #[test]
    fn corrupt_memory_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mem = create_guest_memory(MEM).unwrap();
        mem.write_slice(&[0xab; 100], GuestAddress(0x5000)).unwrap();
        save(dir.path(), &key(), b"{}", &mem).unwrap();
        let mp = dir.path().join(MEMORY_FILE);
        let pristine = fs::read(&mp).unwrap();
        let restore = || fs::write(&mp, &pristine).unwrap();
        let f = OpenOptions::new().write(true).open(&mp).unwrap();
        // A data page changed.
        f.write_all_at(&[0xac], 0x5010).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::Full),
            Err(SnapshotError::Checksum("memory"))
        ));
        // A hole turned non-zero (first and last page too).
        for at in [0u64, 0x7000, MEM - 1] {
            restore();
            load(dir.path(), &key(), MemoryCheck::Full).unwrap();
            let f = OpenOptions::new().write(true).open(&mp).unwrap();
            f.write_all_at(&[1], at).unwrap();
            assert!(
                matches!(
                    load(dir.path(), &key(), MemoryCheck::Full),
                    Err(SnapshotError::Checksum("memory"))
                ),
                "non-zero byte at {at:#x} not detected"
            );
        }
        // A data page zeroed.
        restore();
        let f = OpenOptions::new().write(true).open(&mp).unwrap();
        f.write_all_at(&[0u8; 100], 0x5000).unwrap();
        assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
        // Truncated or extended.
        restore();
        let f = OpenOptions::new().write(true).open(&mp).unwrap();
        f.set_len(MEM - PAGE_SIZE as u64).unwrap();
        assert!(matches!(
            load(dir.path(), &key(), MemoryCheck::Full),
            Err(SnapshotError::Mismatch { .. })
        ));
        f.set_len(MEM + PAGE_SIZE as u64).unwrap();
        assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
        // Replaced by a directory.
        fs::remove_file(&mp).unwrap();
        fs::create_dir(&mp).unwrap();
        assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
    }

    #[test]
    fn snapshot_files_are_private_and_resaving_is_safe() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("a/b");
        let mem = create_guest_memory(MEM).unwrap();
        mem.write_slice(b"secret", GuestAddress(0)).unwrap();
        save(&snap, &key(), b"{}", &mem).unwrap();
        for f in [STATE_FILE, MEMORY_FILE] {
            let m = fs::metadata(snap.join(f)).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f}");
        }
        let m = fs::metadata(&snap).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        // Saving again over an existing snapshot (with a stale temporary file) works and
        // leaves no temporary files.
        fs::write(snap.join("memory.tmp"), b"stale").unwrap();
        mem.write_slice(b"newer", GuestAddress(0)).unwrap();
        save(&snap, &key(), b"{}", &mem).unwrap();
        load(&snap, &key(), MemoryCheck::Full).unwrap();
        let mut names: Vec<String> = fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [MEMORY_FILE, STATE_FILE]);
        assert_eq!(&fs::read(snap.join(MEMORY_FILE)).unwrap()[..5], b"newer");
    }

    #[test]
    fn zero_check() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 4097]));
        for i in [0usize, 1, 15, 16, 17, 4095, 4096] {
            let mut v = vec![0u8; 4097];
            v[i] = 1;
            assert!(!is_zero(&v), "{i}");
            assert!(!is_zero(&v[1..]) || i == 0, "{i}");
        }
    }

    #[test]
    fn garbage_state_blob_is_a_typed_error() {
        let r: Result<Vec<u32>, _> = decode_state(b"\xff\x00not json");
        assert!(matches!(r, Err(SnapshotError::BadState(_))));
    }
}
