//! A disk's backing file: opened and locked before seccomp, then read and written at
//! explicit offsets straight into and out of guest memory (`preadv`/`pwritev` on iovecs that
//! point into the guest's mapping: no host bounce buffer).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use vm_memory::{GuestMemoryBackend, VolatileSlice};

use super::request::{Segment, SECTOR_SIZE};
use crate::config::DiskConfig;
use crate::memory::GuestMem;

/// Why a disk cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The file cannot be opened or inspected.
    #[error("disk {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Another process holds a conflicting lock.
    #[error(
        "disk {path} is in use by another VM ({held}): \
         a read-write disk belongs to one VM at a time"
    )]
    Locked {
        /// The file.
        path: PathBuf,
        /// How the other VM holds it.
        held: &'static str,
    },
    /// Not a regular file.
    #[error("disk {path} is not a regular file")]
    NotRegular {
        /// The file.
        path: PathBuf,
    },
    /// Empty, or not a whole number of 512-byte sectors.
    #[error("disk {path} is {size} bytes: a disk must be a non-empty multiple of 512 bytes")]
    BadSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
}

impl DiskError {
    /// True when the disk's configuration is at fault (its size), not the host.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            DiskError::BadSize { .. } | DiskError::NotRegular { .. }
        )
    }
}

/// An open, locked, sized backing file.
#[derive(Debug)]
pub struct Disk {
    file: File,
    path: PathBuf,
    capacity: u64,
    read_only: bool,
}

impl Disk {
    /// Opens `cfg.path` (`O_RDONLY` or `O_RDWR`, always `O_CLOEXEC`), locks it
    /// (`flock`: shared for a read-only disk, exclusive for a read-write one, never waiting)
    /// and checks its size.
    pub fn open(cfg: &DiskConfig) -> Result<Disk, DiskError> {
        let path = &cfg.path;
        let file = OpenOptions::new()
            .read(true)
            .write(!cfg.read_only)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| DiskError::Open {
                path: path.clone(),
                source,
            })?;
        let op = if cfg.read_only {
            libc::LOCK_SH
        } else {
            libc::LOCK_EX
        };
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                DiskError::Locked {
                    path: path.clone(),
                    held: if cfg.read_only {
                        "attached read-write there"
                    } else {
                        "attached there"
                    },
                }
            } else {
                DiskError::Open {
                    path: path.clone(),
                    source: e,
                }
            });
        }
        Disk::from_file(file, path, cfg.read_only)
    }

    /// A disk backed by an already open `file` (checked: a regular file whose size is a
    /// non-empty multiple of 512 bytes). `path` is for messages only.
    pub fn from_file(file: File, path: &Path, read_only: bool) -> Result<Disk, DiskError> {
        let meta = file.metadata().map_err(|source| DiskError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        if !meta.is_file() {
            return Err(DiskError::NotRegular {
                path: path.to_path_buf(),
            });
        }
        let size = meta.len();
        if size == 0 || !size.is_multiple_of(SECTOR_SIZE) {
            return Err(DiskError::BadSize {
                path: path.to_path_buf(),
                size,
            });
        }
        Ok(Disk {
            file,
            path: path.to_path_buf(),
            capacity: size / SECTOR_SIZE,
            read_only,
        })
    }

    /// Size in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Offered and opened read-only.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The configured path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The backing file's descriptor (for the seccomp filter).
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Reads from byte `offset` of the file into the guest buffers `segs`, completely.
    pub fn read_to_guest(&self, mem: &GuestMem, segs: &[Segment], offset: u64) -> io::Result<()> {
        self.transfer(mem, segs, offset, Direction::ToGuest)
    }

    /// Writes the guest buffers `segs` to byte `offset` of the file, completely.
    pub fn write_from_guest(
        &self,
        mem: &GuestMem,
        segs: &[Segment],
        offset: u64,
    ) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.transfer(mem, segs, offset, Direction::FromGuest)
    }

    /// Makes completed writes durable (`fdatasync`); nothing to do for a read-only disk.
    pub fn flush(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data()
    }

    fn transfer(
        &self,
        mem: &GuestMem,
        segs: &[Segment],
        offset: u64,
        dir: Direction,
    ) -> io::Result<()> {
        let slices = guest_slices(mem, segs)?;
        let mut iovs: Vec<libc::iovec> = slices
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.ptr_guard_mut().as_ptr().cast(),
                iov_len: s.len(),
            })
            .collect();
        // Guest memory has no dirty bitmap (`GuestMemoryMmap<()>`): nothing to mark.
        vectored_io(self.file.as_raw_fd(), &mut iovs, offset, dir)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToGuest,
    FromGuest,
}

/// The guest memory behind `segs`, as host slices (a segment that crosses a region boundary
/// gives several). Fails when any byte is outside guest memory.
fn guest_slices<'m>(mem: &'m GuestMem, segs: &[Segment]) -> io::Result<Vec<VolatileSlice<'m>>> {
    let mut out = Vec::with_capacity(segs.len());
    for s in segs {
        for slice in mem.get_slices(s.addr, s.len as usize) {
            out.push(slice.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?);
        }
    }
    Ok(out)
}

/// `preadv`/`pwritev` over `iovs` from `offset` until every byte moved (short transfers and
/// EINTR continue; end of file is an error).
fn vectored_io(
    fd: RawFd,
    mut iovs: &mut [libc::iovec],
    mut offset: u64,
    dir: Direction,
) -> io::Result<()> {
    // IOV_MAX on Linux.
    const MAX_IOVS: usize = 1024;
    while let Some(first) = iovs.first() {
        if first.iov_len == 0 {
            iovs = &mut iovs[1..];
            continue;
        }
        let count = iovs.len().min(MAX_IOVS) as libc::c_int;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: every iovec points into guest memory that `mem` (borrowed by the caller for
        // the whole call) keeps mapped, within one region and bounds-checked by
        // `get_slices`; `count` iovecs are initialised. The kernel reads or writes only those
        // ranges. The guest may touch the same memory concurrently, as with any DMA.
        let n = unsafe {
            match dir {
                Direction::ToGuest => libc::preadv(fd, iovs.as_ptr(), count, off),
                Direction::FromGuest => libc::pwritev(fd, iovs.as_ptr(), count, off),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(match dir {
                Direction::ToGuest => io::ErrorKind::UnexpectedEof,
                Direction::FromGuest => io::ErrorKind::WriteZero,
            }));
        }
        let mut done = n as usize;
        offset += done as u64;
        while done > 0 {
            let Some(first) = iovs.first_mut() else {
                break;
            };
            if done >= first.iov_len {
                done -= first.iov_len;
                iovs = &mut iovs[1..];
            } else {
                // SAFETY: `done < iov_len`, so the advanced pointer stays inside the buffer.
                first.iov_base = unsafe { first.iov_base.cast::<u8>().add(done) }.cast();
                first.iov_len -= done;
                done = 0;
            }
        }
    }
    Ok(())
}
