//! Command-line interface (clap).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// voidbox — declarative pipelines, every node in a fresh KVM micro-VM.
#[derive(Debug, Parser)]
#[command(name = "voidbox", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage the guest image (kernel + initramfs).
    #[command(subcommand)]
    Image(crate::image::ImageCommand),
}

/// Entry point of the `voidbox` binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match cli.command {
        Command::Image(cmd) => crate::image::run_cli(cmd),
    }
}
