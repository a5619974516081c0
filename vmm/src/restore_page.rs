//! The VMM's side of the restore page ([`voidbox_protocol::restore_page`]): noting at
//! snapshot time whether the guest armed it, and filling it before a restored guest's first
//! instruction with its [`RestoreGrant`] and the host's clock.
//!
//! The page lives at a fixed guest-physical range that the e820 map reserves
//! ([`crate::boot::RESTORE_PAGE_START`]); every access goes through `vm-memory`, which
//! refuses a range outside guest RAM. The guest wrote what is there, so it is parsed as
//! hostile: only a well-formed armed page is filled.

use std::time::{SystemTime, UNIX_EPOCH};

use vm_memory::{Bytes, GuestAddress};
use voidbox_protocol::restore_page::{self, RestoreGrant, GPA, LEN};

use crate::memory::GuestMem;

/// Why the page could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RestorePageError {
    /// The range is not in guest memory.
    #[error("restore page at {GPA:#x}+{LEN:#x} is outside guest memory: {0}")]
    Memory(String),
    /// The guest left something other than an armed page, or the grant does not fit.
    #[error("{0}")]
    Page(#[from] restore_page::PageError),
    /// The host clock is before the epoch.
    #[error("host clock: {0}")]
    Clock(String),
}

fn read(mem: &GuestMem) -> Result<Vec<u8>, RestorePageError> {
    let mut page = vec![0u8; LEN];
    mem.read_slice(&mut page, GuestAddress(GPA))
        .map_err(|e| RestorePageError::Memory(e.to_string()))?;
    Ok(page)
}

/// Whether the guest armed its restore page (checked at snapshot time: a snapshot records
/// it, and a restore of it then needs a grant). A page in any other shape is "not armed".
pub fn is_armed(mem: &GuestMem) -> bool {
    read(mem).is_ok_and(|p| restore_page::armed_nonce(&p).is_ok())
}

/// Fills the armed page with `grant` and the host's current wall-clock time. Call with the
/// vCPUs stopped, right before they run. Refused (nothing written) unless the page is armed.
pub fn fill(mem: &GuestMem, grant: &RestoreGrant) -> Result<(), RestorePageError> {
    let page = read(mem)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| RestorePageError::Clock(e.to_string()))?;
    let now = u64::try_from(now.as_nanos()).map_err(|e| RestorePageError::Clock(e.to_string()))?;
    let filled = restore_page::fill(&page, grant, now)?;
    mem.write_slice(&filled, GuestAddress(GPA))
        .map_err(|e| RestorePageError::Memory(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_guest_memory;
    use voidbox_protocol::restore_page::{armed, Reading, NONCE_LEN};
    use voidbox_protocol::{SessionSecret, Zeroizing};

    fn grant() -> RestoreGrant {
        RestoreGrant::new(
            SessionSecret::from_bytes([9; 32]),
            Zeroizing::new(vec![1; 64]),
            None,
        )
        .unwrap()
    }

    #[test]
    fn fills_only_an_armed_page() {
        let mem = create_guest_memory(32 << 20).unwrap();
        assert!(!is_armed(&mem));
        let e = fill(&mem, &grant()).unwrap_err();
        assert!(e.to_string().contains("never armed"), "{e}");
        let nonce = [6u8; NONCE_LEN];
        mem.write_slice(&armed(&nonce), GuestAddress(GPA)).unwrap();
        assert!(is_armed(&mem));
        fill(&mem, &grant()).unwrap();
        let page = read(&mem).unwrap();
        let Reading::Filled(d) = restore_page::read(&page, &nonce).unwrap() else {
            panic!("not filled");
        };
        assert_eq!(d.grant, grant());
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(now >= d.unix_time_ns && now - d.unix_time_ns < 60_000_000_000);
        // Filled is not armed: a second fill (a stale page) is refused.
        assert!(!is_armed(&mem));
        assert!(fill(&mem, &grant()).is_err());
    }
}
