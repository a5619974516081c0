//! The sliver of the i8042 keyboard controller a Linux guest uses to reset itself
//! (`reboot=k`: write 0xFE to port 0x64).

use std::sync::mpsc::Sender;

use crate::bus::BusDevice;
use crate::exit::{Outcome, VmEvent};

/// Port 0x60..=0x64 (data at offset 0, command/status at offset 4).
pub const I8042_BASE: u64 = 0x60;
/// Size of the port window.
pub const I8042_LEN: u64 = 5;
const CMD_RESET_CPU: u8 = 0xfe;

/// Minimal i8042: reads return "no data", a 0xFE command reports a guest reset.
pub struct I8042 {
    events: Sender<VmEvent>,
    reset_seen: bool,
}

impl I8042 {
    /// Reports a reset on `events`.
    pub fn new(events: Sender<VmEvent>) -> Self {
        Self {
            events,
            reset_seen: false,
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == 4 && data.first() == Some(&CMD_RESET_CPU) && !self.reset_seen {
            self.reset_seen = true;
            // The receiver only disappears when the VMM is exiting anyway.
            let _ = self.events.send(VmEvent::Stopped(Outcome::GuestReset));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_reported_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut d = I8042::new(tx);
        d.write(0, &[0xfe]);
        assert!(rx.try_recv().is_err());
        d.write(4, &[0xfe]);
        d.write(4, &[0xfe]);
        assert_eq!(
            rx.try_recv().unwrap(),
            VmEvent::Stopped(Outcome::GuestReset)
        );
        assert!(rx.try_recv().is_err());
    }
}
