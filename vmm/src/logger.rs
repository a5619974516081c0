//! A minimal `log` backend writing to the VMM's stderr (never the guest console).

use std::io::Write;

struct StderrLogger {
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let mut err = std::io::stderr().lock();
            // Logging must never take the VMM down; a failed stderr write is dropped.
            let _ = writeln!(
                err,
                "voidbox-vmm[{}] {}: {}",
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Installs the stderr logger once; later calls are no-ops.
pub fn init(level: log::LevelFilter) {
    let logger = Box::new(StderrLogger { level });
    if log::set_boxed_logger(logger).is_ok() {
        log::set_max_level(level);
    }
}
