//! Snapshot state of the UART: every register plus the receive FIFO (bytes the host sent
//! that the guest has not read yet; losing them would lose a command sent just before the
//! snapshot). The console log sink is host-side and not part of the state.

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::Serial;
use vmm_sys_util::eventfd::EventFd;

use super::{ConsoleLog, EventFdTrigger, SerialDevice};
use crate::persist::PersistError;

/// Size of the 8250's receive FIFO as emulated by vm-superio.
pub const RX_FIFO_SIZE: usize = 64;
const NAME: &str = "serial";

/// Serializable UART state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialDeviceState {
    /// Divisor latch, low byte.
    pub baud_divisor_low: u8,
    /// Divisor latch, high byte.
    pub baud_divisor_high: u8,
    /// IER.
    pub interrupt_enable: u8,
    /// IIR.
    pub interrupt_identification: u8,
    /// LCR.
    pub line_control: u8,
    /// LSR.
    pub line_status: u8,
    /// MCR.
    pub modem_control: u8,
    /// MSR.
    pub modem_status: u8,
    /// Scratch register.
    pub scratch: u8,
    /// Received bytes not yet read by the guest (at most [`RX_FIFO_SIZE`]).
    pub rx_fifo: Vec<u8>,
}

impl From<SerialState> for SerialDeviceState {
    fn from(s: SerialState) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            rx_fifo: s.in_buffer,
        }
    }
}

impl From<&SerialDeviceState> for SerialState {
    fn from(s: &SerialDeviceState) -> Self {
        Self {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.rx_fifo.clone(),
        }
    }
}

impl SerialDevice {
    /// Captures the UART state (the vCPUs must be paused).
    pub fn save(&self) -> SerialDeviceState {
        self.serial.state().into()
    }

    /// A UART in `state`, raising `irq_evt` and writing to `out`. A pending interrupt in the
    /// saved state is re-raised on `irq_evt`.
    pub fn restore(
        state: &SerialDeviceState,
        irq_evt: EventFd,
        out: ConsoleLog,
    ) -> Result<Self, PersistError> {
        if state.rx_fifo.len() > RX_FIFO_SIZE {
            return Err(PersistError::invalid(
                NAME,
                format!(
                    "receive FIFO holds {} bytes (max {RX_FIFO_SIZE})",
                    state.rx_fifo.len()
                ),
            ));
        }
        let serial = Serial::from_state(
            &SerialState::from(state),
            EventFdTrigger(irq_evt),
            vm_superio::serial::NoEvents,
            out,
        )
        .map_err(|e| PersistError::invalid(NAME, format!("{e:?}")))?;
        Ok(Self { serial })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::BusDevice;

    fn evt() -> EventFd {
        EventFd::new(libc::EFD_NONBLOCK).unwrap()
    }

    fn read(dev: &mut SerialDevice, off: u64) -> u8 {
        let mut d = [0u8; 1];
        dev.read(off, &mut d);
        d[0]
    }

    #[test]
    fn round_trip_keeps_registers_and_unread_input() {
        let mut dev = SerialDevice::new(evt(), ConsoleLog::new(None, None));
        // Program the line: DLAB, divisor 3, 8N1, RDA interrupt, scratch, loopback off.
        dev.write(3, &[0x80]);
        dev.write(0, &[3]);
        dev.write(1, &[0]);
        dev.write(3, &[0x03]);
        dev.write(1, &[0x01]);
        dev.write(7, &[0x5a]);
        dev.write(4, &[0x0b]);
        dev.serial.enqueue_raw_bytes(b"ls -l\n").unwrap();

        let state = dev.save();
        assert_eq!(state.rx_fifo, b"ls -l\n");
        // Through serde, as a snapshot would.
        let json = serde_json::to_vec(&state).unwrap();
        let state2: SerialDeviceState = serde_json::from_slice(&json).unwrap();
        assert_eq!(state, state2);

        let irq = evt();
        let mut restored = SerialDevice::restore(
            &state2,
            irq.try_clone().unwrap(),
            ConsoleLog::new(None, None),
        )
        .unwrap();
        // Pending RDA interrupt is re-raised.
        assert_eq!(irq.read().unwrap(), 1);
        assert_eq!(restored.save(), state);
        // Both devices now behave identically, register by register.
        for off in [1u64, 2, 3, 4, 5, 6, 7] {
            assert_eq!(read(&mut dev, off), read(&mut restored, off), "reg {off}");
        }
        for &b in b"ls -l\n" {
            assert_eq!(read(&mut dev, 0), b);
            assert_eq!(read(&mut restored, 0), b);
        }
        assert_eq!(dev.save(), restored.save());
    }

    #[test]
    fn oversized_fifo_is_refused() {
        let dev = SerialDevice::new(evt(), ConsoleLog::new(None, None));
        let mut state = dev.save();
        state.rx_fifo = vec![0; RX_FIFO_SIZE + 1];
        assert!(matches!(
            SerialDevice::restore(&state, evt(), ConsoleLog::new(None, None)),
            Err(PersistError::Invalid { .. })
        ));
        state.rx_fifo.truncate(RX_FIFO_SIZE);
        assert!(SerialDevice::restore(&state, evt(), ConsoleLog::new(None, None)).is_ok());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<SerialDeviceState, _> = serde_json::from_str(
            r#"{"baud_divisor_low":0,"baud_divisor_high":0,"interrupt_enable":0,
            "interrupt_identification":0,"line_control":0,"line_status":0,"modem_control":0,
            "modem_status":0,"scratch":0,"rx_fifo":[],"extra":1}"#,
        );
        assert!(r.is_err());
    }
}
