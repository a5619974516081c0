//! Address-range buses for port I/O and MMIO exits.

use std::sync::{Arc, Mutex};

/// A device reachable through a [`Bus`]. Offsets are relative to the device's base.
pub trait BusDevice: Send {
    /// Handles a read of `data.len()` bytes at `offset`; fills `data`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Handles a write of `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors registering a device range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range overlaps an existing one or is empty/overflowing.
    #[error("bus range {0:#x}+{1:#x} is invalid or overlaps another device")]
    Overlap(u64, u64),
}

struct Range {
    base: u64,
    len: u64,
    dev: Arc<Mutex<dyn BusDevice>>,
}

/// A set of non-overlapping device ranges.
#[derive(Default)]
pub struct Bus {
    ranges: Vec<Range>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `dev` at `[base, base + len)`.
    pub fn insert(
        &mut self,
        dev: Arc<Mutex<dyn BusDevice>>,
        base: u64,
        len: u64,
    ) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::Overlap(base, len))?;
        if self
            .ranges
            .iter()
            .any(|r| base < r.base + r.len && r.base < end)
        {
            return Err(BusError::Overlap(base, len));
        }
        self.ranges.push(Range { base, len, dev });
        self.ranges.sort_by_key(|r| r.base);
        Ok(())
    }

    fn find(&self, addr: u64, size: usize) -> Option<(&Range, u64)> {
        let idx = self.ranges.partition_point(|r| r.base <= addr);
        let r = self.ranges.get(idx.checked_sub(1)?)?;
        let off = addr - r.base;
        // The whole access must lie inside the device window.
        if off.checked_add(size as u64)? <= r.len {
            Some((r, off))
        } else {
            None
        }
    }

    /// Dispatches a read; returns false (and leaves `data` zeroed) when nothing is mapped.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((r, off)) => {
                r.dev
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .read(off, data);
                true
            }
            None => {
                data.fill(0);
                false
            }
        }
    }

    /// Dispatches a write; returns false when nothing is mapped.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr, data.len()) {
            Some((r, off)) => {
                r.dev
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .write(off, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Rec(Vec<(u64, Vec<u8>)>);
    impl BusDevice for Rec {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.0.push((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatch_and_overlap() {
        let mut bus = Bus::new();
        let a = Arc::new(Mutex::new(Rec::default()));
        bus.insert(a.clone(), 0x3f8, 8).unwrap();
        assert!(bus.insert(a.clone(), 0x3fc, 8).is_err());
        assert!(bus.insert(a.clone(), 0x3f0, 9).is_err());
        assert!(bus.insert(a.clone(), u64::MAX, 2).is_err());
        assert!(bus.insert(a.clone(), 0x100, 0).is_err());
        bus.insert(a.clone(), 0x400, 4).unwrap();
        let mut d = [0xffu8; 1];
        assert!(bus.read(0x3fa, &mut d));
        assert_eq!(d[0], 2);
        assert!(!bus.read(0x3f7, &mut d));
        assert_eq!(d[0], 0);
        // Access straddling the end of a window is not dispatched.
        let mut d4 = [0u8; 4];
        assert!(!bus.read(0x3fe, &mut d4));
        assert!(bus.write(0x401, &[7]));
        assert_eq!(a.lock().unwrap().0, vec![(1, vec![7])]);
    }
}
