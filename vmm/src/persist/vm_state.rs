//! Snapshot state of the VM itself (not of a vCPU): the in-kernel interrupt controllers (PIC
//! master, PIC slave, IOAPIC), the in-kernel PIT and the KVM clock.
//!
//! Restore order (after the vCPUs were created and given their CPUID): PIT, then the clock
//! with flags 0 (guest time continues exactly where the snapshot left it), then the irqchip.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_PIT_FLAGS_HPET_LEGACY, KVM_PIT_FLAGS_SPEAKER_DATA_ON,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

use super::raw::Raw;
use super::PersistError;

const NAME: &str = "vm";

/// Why capturing or restoring VM state failed.
#[derive(Debug, thiserror::Error)]
pub enum VmStateError {
    /// A KVM ioctl failed.
    #[error("{what} failed: {source}")]
    Ioctl {
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
}

fn io(what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VmStateError {
    move |source| VmStateError::Ioctl { what, source }
}

/// Serializable VM-level state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    /// Master 8259 PIC.
    pub pic_master: Raw<kvm_irqchip>,
    /// Slave 8259 PIC.
    pub pic_slave: Raw<kvm_irqchip>,
    /// IOAPIC.
    pub ioapic: Raw<kvm_irqchip>,
    /// 8254 PIT.
    pub pit: Raw<kvm_pit_state2>,
    /// KVM clock (guest time).
    pub clock: Raw<kvm_clock_data>,
}

fn get_chip(vm: &VmFd, chip_id: u32) -> Result<Raw<kvm_irqchip>, VmStateError> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip).map_err(io("KVM_GET_IRQCHIP"))?;
    Ok(Raw(chip))
}

impl VmState {
    /// Captures the VM state (every vCPU paused).
    pub fn capture(vm: &VmFd) -> Result<Self, VmStateError> {
        Ok(Self {
            pic_master: get_chip(vm, KVM_IRQCHIP_PIC_MASTER)?,
            pic_slave: get_chip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
            ioapic: get_chip(vm, KVM_IRQCHIP_IOAPIC)?,
            pit: Raw(vm.get_pit2().map_err(io("KVM_GET_PIT2"))?),
            clock: Raw(vm.get_clock().map_err(io("KVM_GET_CLOCK"))?),
        })
    }

    /// Checks a state read from an untrusted snapshot.
    pub fn validate(&self) -> Result<(), PersistError> {
        for (chip, want, name) in [
            (&self.pic_master, KVM_IRQCHIP_PIC_MASTER, "PIC master"),
            (&self.pic_slave, KVM_IRQCHIP_PIC_SLAVE, "PIC slave"),
            (&self.ioapic, KVM_IRQCHIP_IOAPIC, "IOAPIC"),
        ] {
            if chip.0.chip_id != want {
                return Err(PersistError::invalid(
                    NAME,
                    format!("{name} saved with chip id {}", chip.0.chip_id),
                ));
            }
        }
        let known = KVM_PIT_FLAGS_HPET_LEGACY | KVM_PIT_FLAGS_SPEAKER_DATA_ON;
        if self.pit.0.flags & !known != 0 {
            return Err(PersistError::invalid(
                NAME,
                format!("PIT flags {:#x}", self.pit.0.flags),
            ));
        }
        Ok(())
    }

    /// Restores PIT, clock (flags 0: continue from the saved guest time) and irqchip.
    pub fn restore(&self, vm: &VmFd) -> Result<(), VmStateError> {
        vm.set_pit2(&self.pit.0).map_err(io("KVM_SET_PIT2"))?;
        let clock = kvm_clock_data {
            clock: self.clock.0.clock,
            ..Default::default()
        };
        vm.set_clock(&clock).map_err(io("KVM_SET_CLOCK"))?;
        for chip in [&self.pic_master, &self.pic_slave, &self.ioapic] {
            vm.set_irqchip(&chip.0).map_err(io("KVM_SET_IRQCHIP"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> VmState {
        let chip = |chip_id| {
            Raw(kvm_irqchip {
                chip_id,
                ..Default::default()
            })
        };
        VmState {
            pic_master: chip(KVM_IRQCHIP_PIC_MASTER),
            pic_slave: chip(KVM_IRQCHIP_PIC_SLAVE),
            ioapic: chip(KVM_IRQCHIP_IOAPIC),
            pit: Raw(kvm_pit_state2::default()),
            clock: Raw(kvm_clock_data {
                clock: 123_456_789,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn round_trip_and_validation() {
        let s = sample();
        let json = serde_json::to_string(&s).unwrap();
        let back: VmState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.clock.0.clock, 123_456_789);
        back.validate().unwrap();

        let mut bad = s.clone();
        bad.ioapic.0.chip_id = 0;
        assert!(bad.validate().is_err());
        let mut bad = s.clone();
        bad.pic_slave.0.chip_id = 7;
        assert!(bad.validate().is_err());
        let mut bad = s;
        bad.pit.0.flags = 0x80;
        assert!(bad.validate().is_err());
    }
}
