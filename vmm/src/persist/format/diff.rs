//! Layered snapshots: a snapshot whose memory is a diff ([`DIFF_FILE`]) over the memory file
//! of a full base snapshot.
//!
//! A layered snapshot directory holds a [`STATE_FILE`] like any snapshot (same format
//! version, same key) and a `memory.diff` instead of a `memory.bin`:
//!
//! `DIFF_MAGIC (8) | diff version (u32 LE) | header length (u32 LE) | header (JSON) |
//! SHA-256 of everything before it (32) | zero padding to the next page boundary |
//! page data`.
//!
//! The header ([`DiffHeader`]) names the base ([`BaseId`]: its memory size, its memory
//! digest and the SHA-256 of its whole state file), lists the page runs (memory-file page
//! indices, sorted, non-overlapping, each inside one RAM region) and the length and SHA-256 of
//! the page data, which holds the runs' pages back to back, page-aligned, so each run can be
//! mapped straight from the file. The state file's `memory_sha256` is the diff's header
//! checksum, which binds the state to exactly this diff (and, through it, to its data and its
//! base).
//!
//! Like a full snapshot, everything is verified before anything is restored ([`load_layered`]):
//! the state file, the base's state file and whole memory digest, the diff's header checksum,
//! bounds and runs, its exact length, its data checksum, that the diff was taken over this
//! very base, and that the state belongs to this diff.

use super::*;

/// Name of the memory diff inside a layered snapshot directory.
pub const DIFF_FILE: &str = "memory.diff";
/// First bytes of a memory diff.
pub const DIFF_MAGIC: [u8; 8] = *b"VBXDIFF\0";
/// Current (and only accepted) memory diff version.
pub const DIFF_VERSION: u32 = 1;
/// Most runs a diff may have (bounds the header and the mappings a restore makes).
pub const MAX_RUNS: usize = 8192;
/// Largest diff header accepted (a run is at most ~45 bytes of JSON).
pub const MAX_DIFF_HEADER_LEN: u32 = 1 << 20;

const PAGE: u64 = PAGE_SIZE as u64;

/// Which full snapshot a diff was taken over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseId {
    /// Guest memory size of the base (and of the layered snapshot).
    pub memory_size: u64,
    /// The base's memory digest (its header's `memory_sha256`), hex.
    pub memory_sha256: String,
    /// SHA-256 of the base's whole state file, hex.
    pub state_sha256: String,
}

impl BaseId {
    /// The identity of the base snapshot with this (verified) header and state file bytes.
    pub fn of(header: &SnapshotHeader, state_file: &[u8]) -> Self {
        Self {
            memory_size: header.key.memory_size,
            memory_sha256: header.memory_sha256.clone(),
            state_sha256: hex(&Sha256::digest(state_file)),
        }
    }
}

/// A run of consecutive memory-file pages stored in the diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffRun {
    /// First page (memory-file offset / [`PAGE_SIZE`]).
    pub page: u64,
    /// Number of pages (at least one).
    pub pages: u64,
}

/// The header of a memory diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffHeader {
    /// The base snapshot the diff overlays.
    pub base: BaseId,
    /// Page runs in ascending order, non-overlapping, each within one RAM region.
    pub runs: Vec<DiffRun>,
    /// Length of the page data (the runs' pages × [`PAGE_SIZE`]).
    pub data_len: u64,
    /// SHA-256 of the page data, hex.
    pub data_sha256: String,
}

/// A verified diff header and where its data starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedDiff {
    /// The header.
    pub header: DiffHeader,
    /// File offset of the first run's data (page-aligned).
    pub data_offset: u64,
    /// The header checksum (what the layered snapshot's state file records as its memory
    /// digest).
    pub digest: [u8; 32],
}

impl ParsedDiff {
    /// Each run as `(memory-file offset, length, diff-file offset)`, in order.
    pub fn extents(&self) -> Vec<(u64, u64, u64)> {
        let mut at = self.data_offset;
        self.header
            .runs
            .iter()
            .map(|r| {
                let e = (r.page * PAGE, r.pages * PAGE, at);
                at += r.pages * PAGE;
                e
            })
            .collect()
    }
}

/// Where the page data of a diff whose header is `hlen` bytes starts.
fn data_offset(hlen: u64) -> u64 {
    ((PREFIX_LEN + DIGEST_LEN) as u64 + hlen).div_ceil(PAGE) * PAGE
}

/// The longest head (everything before the data) a valid diff has.
fn max_head() -> u64 {
    data_offset(u64::from(MAX_DIFF_HEADER_LEN))
}

fn bad(what: impl Into<String>) -> SnapshotError {
    SnapshotError::BadHeader(format!("memory diff: {}", what.into()))
}

/// The RAM regions of `memory_size` bytes as memory-file page ranges `[start, end)`.
fn region_pages(memory_size: u64) -> Result<Vec<(u64, u64)>, SnapshotError> {
    let mut out = Vec::new();
    let mut at = 0;
    for r in memory_layout(memory_size)? {
        out.push((at / PAGE, (at + r.size) / PAGE));
        at += r.size;
    }
    Ok(out)
}

/// Checks the runs against the memory size: at most [`MAX_RUNS`], each non-empty, in
/// ascending order, non-overlapping, each inside one RAM region; returns their page count.
pub fn check_runs(runs: &[DiffRun], memory_size: u64) -> Result<u64, SnapshotError> {
    if runs.len() > MAX_RUNS {
        return Err(SnapshotError::TooLarge {
            what: "memory diff run table",
            len: runs.len() as u64,
            limit: MAX_RUNS as u64,
        });
    }
    let regions = region_pages(memory_size)?;
    let mut next = 0u64;
    let mut total = 0u64;
    for (i, r) in runs.iter().enumerate() {
        let end = r
            .page
            .checked_add(r.pages)
            .ok_or_else(|| bad(format!("run {i} overflows")))?;
        if r.pages == 0 {
            return Err(bad(format!("run {i} is empty")));
        }
        if r.page < next {
            return Err(bad(format!(
                "run {i} (page {}) is out of order or overlaps the previous one",
                r.page
            )));
        }
        if !regions.iter().any(|&(s, e)| r.page >= s && end <= e) {
            return Err(bad(format!(
                "run {i} (pages {}..{end}) is not inside one RAM region of {memory_size} bytes",
                r.page
            )));
        }
        next = end;
        total += r.pages;
    }
    Ok(total)
}

/// Parses and verifies the head of a diff file of `file_len` bytes: magic, version, header
/// bound and checksum, the runs, the zero padding, and that the file is exactly as long as
/// the header says. `head` is the file's start (at least up to the data, when the file is
/// that long). The page data is not read: see [`verify_data`].
pub fn parse_head(head: &[u8], file_len: u64) -> Result<ParsedDiff, SnapshotError> {
    let mut rest = head;
    let magic = take(&mut rest, DIFF_MAGIC.len(), "memory diff magic")?;
    if magic != DIFF_MAGIC {
        return Err(bad("not a voidbox memory diff (bad magic)"));
    }
    let version = le_u32(take(&mut rest, 4, "memory diff version")?);
    if version != DIFF_VERSION {
        return Err(bad(format!(
            "version {version} is not supported (this VMM reads version {DIFF_VERSION})"
        )));
    }
    let hlen = le_u32(take(&mut rest, 4, "memory diff header length")?);
    if hlen > MAX_DIFF_HEADER_LEN {
        return Err(SnapshotError::TooLarge {
            what: "memory diff header",
            len: u64::from(hlen),
            limit: u64::from(MAX_DIFF_HEADER_LEN),
        });
    }
    let hbytes = take(&mut rest, hlen as usize, "memory diff header")?;
    let stored = take(&mut rest, DIGEST_LEN, "memory diff header checksum")?;
    let digest: [u8; 32] = Sha256::digest(&head[..PREFIX_LEN + hbytes.len()]).into();
    if digest.as_slice() != stored {
        return Err(SnapshotError::Checksum("memory diff header"));
    }
    let header: DiffHeader = serde_json::from_slice(hbytes).map_err(|e| bad(e.to_string()))?;
    let pages = check_runs(&header.runs, header.base.memory_size)?;
    if header.data_len != pages * PAGE {
        return Err(bad(format!(
            "data length {} is not the runs' {pages} pages",
            header.data_len
        )));
    }
    let data_offset = data_offset(u64::from(hlen));
    let pad = (data_offset - (PREFIX_LEN + DIGEST_LEN) as u64 - u64::from(hlen)) as usize;
    let padding = take(&mut rest, pad, "memory diff padding")?;
    if !is_zero(padding) {
        return Err(bad("non-zero padding before the page data"));
    }
    let want = data_offset + header.data_len;
    if file_len != want {
        return Err(mismatch("memory diff length", want, file_len));
    }
    Ok(ParsedDiff {
        header,
        data_offset,
        digest,
    })
}

/// Verifies the page data of `f` (at `path`, for messages) against the parsed header.
pub fn verify_data(f: &File, path: &Path, diff: &ParsedDiff) -> Result<(), SnapshotError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let end = diff.data_offset + diff.header.data_len;
    let mut off = diff.data_offset;
    while off < end {
        let n = usize::try_from((end - off).min(COPY_CHUNK as u64)).unwrap_or(COPY_CHUNK);
        f.read_exact_at(&mut buf[..n], off).map_err(io_err(path))?;
        hasher.update(&buf[..n]);
        off += n as u64;
    }
    if hex(&hasher.finalize()) != diff.header.data_sha256 {
        return Err(SnapshotError::Checksum("memory diff data"));
    }
    Ok(())
}

/// Parses and verifies a whole diff held in memory (tests and fuzzing): [`parse_head`] and
/// the data checksum.
pub fn decode_diff(data: &[u8]) -> Result<ParsedDiff, SnapshotError> {
    let diff = parse_head(data, data.len() as u64)?;
    let start = usize::try_from(diff.data_offset).map_err(|_| bad("data offset"))?;
    let body = data
        .get(start..)
        .ok_or(SnapshotError::Truncated("memory diff data"))?;
    if hex(&Sha256::digest(body)) != diff.header.data_sha256 {
        return Err(SnapshotError::Checksum("memory diff data"));
    }
    Ok(diff)
}

/// Turns sorted, distinct memory-file page indices into runs, never crossing a RAM region
/// boundary of `memory_size`. While there are more than `max_runs` runs, neighbouring runs
/// in the same region are merged across ever larger gaps of unchanged pages (stored too:
/// harmless, they hold the base's bytes), so the count stays bounded.
pub fn coalesce(
    pages: &[u64],
    memory_size: u64,
    max_runs: usize,
) -> Result<Vec<DiffRun>, SnapshotError> {
    let regions = region_pages(memory_size)?;
    let region_of = |p: u64| regions.iter().position(|&(s, e)| p >= s && p < e);
    let mut runs: Vec<(usize, DiffRun)> = Vec::new();
    for &p in pages {
        let reg = region_of(p).ok_or_else(|| bad(format!("page {p} is outside guest memory")))?;
        match runs.last_mut() {
            Some((r, last)) if *r == reg && last.page + last.pages == p => last.pages += 1,
            Some((_, last)) if p < last.page + last.pages => {
                return Err(bad(format!("page {p} is out of order")))
            }
            _ => runs.push((reg, DiffRun { page: p, pages: 1 })),
        }
    }
    let mut gap = 1u64;
    while runs.len() > max_runs.max(regions.len()) {
        let mut merged: Vec<(usize, DiffRun)> = Vec::with_capacity(runs.len());
        for (reg, run) in runs {
            match merged.last_mut() {
                Some((r, last)) if *r == reg && run.page - (last.page + last.pages) <= gap => {
                    last.pages = run.page + run.pages - last.page;
                }
                _ => merged.push((reg, run)),
            }
        }
        runs = merged;
        gap = gap.saturating_mul(2);
    }
    Ok(runs.into_iter().map(|(_, r)| r).collect())
}

/// Reads the memory-file byte range `[off, off + buf.len())` of guest memory laid out by
/// [`memory_layout`] (`regions` with their file offsets); the range lies in one region.
fn read_file_range(
    mem: &GuestMem,
    regions: &[(u64, SavedRegion)],
    off: u64,
    buf: &mut [u8],
) -> Result<(), String> {
    let (file_start, r) = regions
        .iter()
        .find(|(s, r)| off >= *s && off + buf.len() as u64 <= s + r.size)
        .ok_or_else(|| format!("memory-file range at {off:#x} is not in one region"))?;
    let gpa = r.guest_addr + (off - file_start);
    mem.read_slice(buf, GuestAddress(gpa))
        .map_err(|e| format!("reading guest memory at {gpa:#x}: {e}"))
}

/// Writes the diff of `mem` (the pages of `runs`) over the base `base` to `path` (created
/// new, mode 0600). Returns its header checksum and the number of pages written.
pub fn write_diff(
    path: &Path,
    mem: &GuestMem,
    base: &BaseId,
    runs: &[DiffRun],
) -> Result<([u8; 32], u64), SnapshotError> {
    let pages = check_runs(runs, base.memory_size)?;
    let mut header = DiffHeader {
        base: base.clone(),
        runs: runs.to_vec(),
        data_len: pages * PAGE,
        // Placeholder of the final length: the data goes in first, after the header.
        data_sha256: "0".repeat(64),
    };
    let placeholder = serde_json::to_vec(&header).map_err(|e| bad(e.to_string()))?;
    let hlen = placeholder.len() as u64;
    if hlen > u64::from(MAX_DIFF_HEADER_LEN) {
        return Err(SnapshotError::TooLarge {
            what: "memory diff header",
            len: hlen,
            limit: u64::from(MAX_DIFF_HEADER_LEN),
        });
    }
    let data_start = data_offset(hlen);
    let mut regions = Vec::new();
    let mut at = 0u64;
    for r in memory_layout(base.memory_size)? {
        regions.push((at, r));
        at += r.size;
    }
    let f = create_private(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; COPY_CHUNK];
    let mut out = data_start;
    for run in runs {
        let (mut off, end) = (run.page * PAGE, (run.page + run.pages) * PAGE);
        while off < end {
            let n = usize::try_from((end - off).min(COPY_CHUNK as u64)).unwrap_or(COPY_CHUNK);
            let chunk = &mut buf[..n];
            read_file_range(mem, &regions, off, chunk)
                .map_err(|e| io_err(path)(io::Error::other(e)))?;
            hasher.update(&chunk[..]);
            f.write_all_at(chunk, out).map_err(io_err(path))?;
            off += n as u64;
            out += n as u64;
        }
    }
    header.data_sha256 = hex(&hasher.finalize());
    let hbytes = serde_json::to_vec(&header).map_err(|e| bad(e.to_string()))?;
    if hbytes.len() as u64 != hlen {
        return Err(bad("header length changed while writing"));
    }
    let mut head = Vec::with_capacity(PREFIX_LEN + hbytes.len() + DIGEST_LEN);
    head.extend_from_slice(&DIFF_MAGIC);
    head.extend_from_slice(&DIFF_VERSION.to_le_bytes());
    head.extend_from_slice(&(hlen as u32).to_le_bytes());
    head.extend_from_slice(&hbytes);
    let digest: [u8; 32] = Sha256::digest(&head).into();
    head.extend_from_slice(&digest);
    // The padding up to the data is a hole (reads as zeros); the length is set exactly.
    f.write_all_at(&head, 0).map_err(io_err(path))?;
    f.set_len(data_start + pages * PAGE).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))?;
    Ok((digest, pages))
}

/// What [`save_layered`] wrote.
#[derive(Debug, Clone)]
pub struct SavedLayered {
    /// The state file's header.
    pub header: SnapshotHeader,
    /// Size of the state file.
    pub state_file_bytes: u64,
    /// Pages in the diff (written ones and the unchanged gaps between close runs).
    pub diff_pages: u64,
    /// Runs in the diff.
    pub runs: usize,
    /// Bytes allocated on disk by both files (blocks × 512).
    pub disk_bytes: u64,
}

/// Writes a layered snapshot into `dir` (created mode 0700 if missing): the memory diff of
/// `mem` over `base` (the sorted memory-file page indices `pages` that differ from it), then
/// the state file bound to it, each through a temporary file and a rename. A stale
/// `memory.bin` in `dir` is removed first, so the directory is unambiguously layered.
pub fn save_layered(
    dir: &Path,
    key: &SnapshotKey,
    state: &[u8],
    mem: &GuestMem,
    base: &BaseId,
    pages: &[u64],
) -> Result<SavedLayered, SnapshotError> {
    if base.memory_size != key.memory_size {
        return Err(mismatch(
            "base memory size",
            key.memory_size,
            base.memory_size,
        ));
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    let runs = coalesce(pages, key.memory_size, MAX_RUNS)?;
    let diff_path = dir.join(DIFF_FILE);
    let diff_tmp = diff_path.with_extension("tmp");
    let (digest, diff_pages) = write_diff(&diff_tmp, mem, base, &runs)?;
    remove_stale(&dir.join(MEMORY_FILE))?;
    fs::rename(&diff_tmp, &diff_path).map_err(io_err(&diff_path))?;
    let bytes = encode(key, state, key.memory_size, &digest)?;
    let state_path = dir.join(STATE_FILE);
    write_atomic(&state_path, &bytes)?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    let (header, _) = decode(&bytes, None)?;
    let mut disk_bytes = 0;
    for p in [&diff_path, &state_path] {
        disk_bytes += fs::metadata(p).map_err(io_err(p))?.blocks() * 512;
    }
    Ok(SavedLayered {
        header,
        state_file_bytes: bytes.len() as u64,
        diff_pages,
        runs: runs.len(),
        disk_bytes,
    })
}

/// A verified memory diff, open.
#[derive(Debug)]
pub struct LoadedDiff {
    /// The parsed header.
    pub diff: ParsedDiff,
    /// The diff file as verified (map this one).
    pub file: File,
    /// Its path (for messages).
    pub path: PathBuf,
}

/// Opens and verifies the memory diff at `path` completely (head, length, data checksum).
pub fn load_diff(path: &Path) -> Result<LoadedDiff, SnapshotError> {
    let file = File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(io_err(path)(io::Error::other("not a regular file")));
    }
    let len = meta.len();
    let head_len = usize::try_from(len.min(max_head())).unwrap_or(0);
    let mut head = vec![0u8; head_len];
    file.read_exact_at(&mut head, 0).map_err(io_err(path))?;
    // A short head parses as truncated; the rest of the data is read by verify_data.
    let diff = parse_head(&head, len)?;
    verify_data(&file, path, &diff)?;
    Ok(LoadedDiff {
        diff,
        file,
        path: path.to_path_buf(),
    })
}

/// A fully verified layered snapshot, ready to restore.
#[derive(Debug)]
pub struct LayeredSnapshot {
    /// The layered snapshot's state file header.
    pub header: SnapshotHeader,
    /// Its state blob (checksum verified).
    pub state: Vec<u8>,
    /// The base snapshot, verified completely (its memory file is what gets mapped).
    pub base: LoadedSnapshot,
    /// The diff, verified completely, taken over `base`.
    pub diff: LoadedDiff,
}

/// Whether `dir` holds a layered snapshot (a memory diff and no memory file).
pub fn is_layered(dir: &Path) -> bool {
    dir.join(DIFF_FILE).exists() && !dir.join(MEMORY_FILE).exists()
}

/// Reads and verifies the layered snapshot in `dir` over the full snapshot in `base_dir`
/// against `expected`: both state files, the base's memory, the diff, that the diff was
/// taken over this base, and that the state belongs to this diff.
pub fn load_layered(
    dir: &Path,
    base_dir: &Path,
    expected: &SnapshotKey,
) -> Result<LayeredSnapshot, SnapshotError> {
    let diff_path = dir.join(DIFF_FILE);
    if !diff_path.exists() && dir.join(MEMORY_FILE).exists() {
        return Err(SnapshotError::BadHeader(format!(
            "{} is a full snapshot, not a layered one: restore it without a base",
            dir.display()
        )));
    }
    let data = read_state_file(&dir.join(STATE_FILE))?;
    let (header, state) = decode(&data, Some(expected))?;
    let state = state.to_vec();
    if is_layered(base_dir) {
        return Err(SnapshotError::BadHeader(format!(
            "the base {} is itself a layered snapshot; a diff's base must be a full snapshot",
            base_dir.display()
        )));
    }
    let base = load(base_dir, expected, MemoryCheck::Full).map_err(|e| match e {
        SnapshotError::Io { path, source } => SnapshotError::BadHeader(format!(
            "the base snapshot of {} cannot be read: {}: {source}",
            dir.display(),
            path.display()
        )),
        e => e,
    })?;
    let diff = load_diff(&diff_path)?;
    if diff.diff.header.base != base.id {
        return Err(SnapshotError::Mismatch {
            field: "base snapshot",
            expected: format!(
                "the one the diff in {} was taken over (memory {}, state {})",
                dir.display(),
                short(&diff.diff.header.base.memory_sha256),
                short(&diff.diff.header.base.state_sha256)
            ),
            found: format!(
                "{} (memory {}, state {})",
                base_dir.display(),
                short(&base.id.memory_sha256),
                short(&base.id.state_sha256)
            ),
        });
    }
    if header.memory_sha256 != hex(&diff.diff.digest) {
        return Err(SnapshotError::Checksum(
            "layered snapshot (state file and memory diff are not of one snapshot)",
        ));
    }
    Ok(LayeredSnapshot {
        header,
        state,
        base,
        diff,
    })
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod tests;
