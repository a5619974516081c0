//! The guest image (kernel + initramfs) builder and cache. Owned by the image work (issue #3).

/// `voidbox image` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Build the guest image (kernel + initramfs) into the cache.
    Build,
}

/// Runs an `voidbox image` subcommand.
pub fn run_cli(_cmd: ImageCommand) -> std::process::ExitCode {
    eprintln!("error: `voidbox image` is not built yet");
    std::process::ExitCode::from(3)
}
