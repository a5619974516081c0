//! How commands print: progress on stderr and the format of listings on stdout, the same
//! for every command group (`image`, `snapshot`, `oci`, `runtimes`, …).

/// How to report progress on stderr (builds, pulls, pushes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar on a terminal, plain lines otherwise.
    #[default]
    Auto,
    /// Plain lines only.
    Plain,
    /// Nothing.
    Quiet,
}

/// Output format of listings and checks (`ls`, `verify`, `probe`, …).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Text for people.
    #[default]
    Human,
    /// JSON on stdout.
    Json,
}
