//! The guest's side of the restore page ([`voidbox_protocol::restore_page`]).
//!
//! PID 1 maps the e820-reserved page through `/dev/mem` at boot and arms it with a random
//! nonce. A VM restored from a snapshot wakes up with the page filled by the VMM; before the
//! first connection after the resume is authenticated, [`RestorePage::take`] copies it out,
//! clears it (the new secret does not stay in guest memory outside the agent) and arms it
//! again with a new nonce, so a later snapshot of this VM works the same way and a replayed
//! page is stale. In host mode (tests) the page is a file given with `--restore-page`.
//!
//! The mapping is only ever accessed with volatile reads and writes of whole bytes: the VMM
//! changes it behind the program's back while the VM is paused.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

use voidbox_protocol::restore_page::{self, Delivery, PageError, Reading, LEN, NONCE_LEN};
use voidbox_protocol::Zeroizing;

/// Where PID 1 finds the page.
pub const DEV_MEM: &str = "/dev/mem";

/// A mapped restore page, armed with this agent's nonce.
pub struct RestorePage {
    map: NonNull<u8>,
    nonce: [u8; NONCE_LEN],
}

// SAFETY: the mapping is plain shared memory owned by this value; the agent serializes
// every access behind a mutex (`&mut self` for anything that reads or writes it).
unsafe impl Send for RestorePage {}

impl RestorePage {
    /// Maps [`LEN`] bytes of `path` at `offset` (`/dev/mem` at the page's guest-physical
    /// address as PID 1; a file of at least [`LEN`] bytes at 0 in host mode) and arms it.
    pub fn open(path: &Path, offset: u64) -> io::Result<RestorePage> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_SYNC)
            .open(path)?;
        // A regular file (host mode) must hold the whole page: touching a mapping past the
        // end of a file faults.
        let meta = file.metadata()?;
        if meta.is_file() && meta.len() < offset.saturating_add(LEN as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {} bytes, the restore page needs {LEN} from offset {offset}",
                    path.display(),
                    meta.len()
                ),
            ));
        }
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: a fresh shared mapping of LEN bytes of an open file; the kernel checks the
        // range (for /dev/mem: that it is not RAM). Nothing else aliases it in this process.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap at 0"))?;
        let mut page = RestorePage {
            map,
            nonce: [0; NONCE_LEN],
        };
        page.rearm()?;
        Ok(page)
    }

    /// A copy of the page (zeroed when dropped).
    fn copy(&self) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(vec![0u8; LEN]);
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: `i < LEN`, inside the live mapping.
            *b = unsafe { std::ptr::read_volatile(self.map.as_ptr().add(i)) };
        }
        out
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate().take(LEN.saturating_sub(at)) {
            // SAFETY: `at + i < LEN`, inside the live mapping.
            unsafe { std::ptr::write_volatile(self.map.as_ptr().add(at + i), *b) };
        }
    }

    /// Clears the page and arms it with a new random nonce.
    fn rearm(&mut self) -> io::Result<()> {
        let mut nonce = [0u8; NONCE_LEN];
        // Uniqueness, not secrecy: GRND_INSECURE never blocks, even before the CRNG is ready.
        // SAFETY: getrandom writes at most `nonce.len()` bytes into `nonce`.
        let n =
            unsafe { libc::getrandom(nonce.as_mut_ptr().cast(), nonce.len(), libc::GRND_INSECURE) };
        if n != nonce.len() as isize {
            return Err(io::Error::last_os_error());
        }
        self.write(0, &[0u8; LEN]);
        self.write(0, &restore_page::armed(&nonce));
        self.nonce = nonce;
        Ok(())
    }

    /// Reads the page: `None` while it is still armed (no restore since the last look), the
    /// delivery of a restore, or why the page was refused. Anything but "still armed" leaves
    /// the page cleared and armed again.
    pub fn take(&mut self) -> Result<Option<Delivery>, PageError> {
        let page = self.copy();
        let r = restore_page::read(&page, &self.nonce);
        if matches!(r, Ok(Reading::Armed)) {
            return Ok(None);
        }
        if let Err(e) = self.rearm() {
            crate::log!("cannot re-arm the restore page: {e}");
        }
        match r? {
            Reading::Filled(d) => Ok(Some(*d)),
            Reading::Armed => Ok(None),
        }
    }
}

impl Drop for RestorePage {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this value owns, once.
        unsafe { libc::munmap(self.map.as_ptr().cast(), LEN) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use voidbox_protocol::restore_page::{fill, RestoreGrant, HEADER_LEN};
    use voidbox_protocol::SessionSecret;

    const NOW: u64 = 1_750_000_000_000_000_000;

    fn page_file() -> (tempfile::NamedTempFile, RestorePage) {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(LEN as u64).unwrap();
        let p = RestorePage::open(f.path(), 0).unwrap();
        (f, p)
    }

    fn grant() -> RestoreGrant {
        RestoreGrant::new(
            SessionSecret::from_bytes([5; 32]),
            Zeroizing::new(vec![3; 48]),
            None,
        )
        .unwrap()
    }

    /// What the VMM does: fill the armed page in place.
    fn vmm_fill(f: &tempfile::NamedTempFile) -> Vec<u8> {
        let armed = std::fs::read(f.path()).unwrap();
        let filled = fill(&armed, &grant(), NOW).unwrap();
        std::os::unix::fs::FileExt::write_all_at(f.as_file(), &filled, 0).unwrap();
        filled.to_vec()
    }

    #[test]
    fn armed_at_open_filled_by_the_vmm_then_cleared_and_rearmed() {
        let (f, mut p) = page_file();
        let armed = std::fs::read(f.path()).unwrap();
        assert_eq!(restore_page::armed_nonce(&armed), Ok(p.nonce));
        assert!(p.take().unwrap().is_none(), "armed: nothing to take");
        let first_nonce = p.nonce;
        vmm_fill(&f);
        let d = p.take().unwrap().expect("a delivery");
        assert_eq!(d.grant, grant());
        assert_eq!(d.unix_time_ns, NOW);
        // Cleared (no secret left behind) and armed with a new nonce.
        let after = std::fs::read(f.path()).unwrap();
        assert!(after[HEADER_LEN..].iter().all(|b| *b == 0));
        assert_ne!(p.nonce, first_nonce);
        assert_eq!(restore_page::armed_nonce(&after), Ok(p.nonce));
        assert!(p.take().unwrap().is_none());
    }

    #[test]
    fn a_replayed_page_is_stale_and_a_torn_one_refused() {
        let (f, mut p) = page_file();
        let filled = vmm_fill(&f);
        assert!(p.take().unwrap().is_some());
        // The same filled page again: filled for the old nonce.
        std::os::unix::fs::FileExt::write_all_at(f.as_file(), &filled, 0).unwrap();
        assert_eq!(p.take().unwrap_err(), PageError::Nonce);
        // Refusal re-arms too: the next look finds an armed page.
        assert!(p.take().unwrap().is_none());
        let mut torn = vmm_fill(&f);
        torn[HEADER_LEN + 3] ^= 1;
        std::os::unix::fs::FileExt::write_all_at(f.as_file(), &torn, 0).unwrap();
        assert_eq!(p.take().unwrap_err(), PageError::Checksum);
        std::os::unix::fs::FileExt::write_all_at(f.as_file(), &[0; LEN], 0).unwrap();
        assert_eq!(p.take().unwrap_err(), PageError::NotArmed);
    }

    #[test]
    fn a_short_file_cannot_be_mapped_past_its_end_unnoticed() {
        let f = tempfile::NamedTempFile::new().unwrap();
        // An empty file maps, but touching it would fault: refuse it up front instead.
        let e = RestorePage::open(f.path(), 0).err().expect("refused");
        assert!(e.to_string().contains("bytes"), "{e}");
    }
}
