//! `voidbox-vmm`: runs one micro-VM in this process.
//!
//! Usage: `voidbox-vmm [--config-fd N] [--status-fd N] [--parent-pid PID]`; see
//! [`voidbox_vmm::process`] and `vmm/README.md`.

fn main() {
    voidbox_vmm::entry::main_with_args(std::env::args().skip(1).collect());
}
