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

pub mod diff;
mod memory_file;

pub use memory_file::*;

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
/// Version 7: the restore page (`SnapshotState::restore_page`, reserved in e820); the `p9`
/// share slots only in VMs configured with `share_slots`.
pub const FORMAT_VERSION: u32 = 7;
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
    // A full snapshot over a layered one: the directory must not keep its memory diff.
    remove_stale(&dir.join(diff::DIFF_FILE))?;
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
    /// Its identity as the base of a layered snapshot (from the state file as verified).
    pub id: diff::BaseId,
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
    if !memory_path.exists() && dir.join(diff::DIFF_FILE).exists() {
        return Err(SnapshotError::BadHeader(format!(
            "{} is a layered snapshot (a memory diff over a base snapshot): restore it with \
             its base",
            dir.display()
        )));
    }
    let memory_file = File::open(&memory_path).map_err(io_err(&memory_path))?;
    verify_memory(&memory_file, &memory_path, &header, check)?;
    let id = diff::BaseId::of(&header, &data);
    Ok(LoadedSnapshot {
        header,
        state,
        memory_path,
        memory_file,
        id,
    })
}

#[cfg(test)]
mod tests;
