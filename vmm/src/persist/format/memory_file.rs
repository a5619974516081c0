//! The memory file of a snapshot: guest RAM written sparsely (zero pages are holes), its
//! digest over the non-zero pages, and its verification, which reads only the file's data
//! extents.

use super::*;

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
