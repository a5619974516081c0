//! The `voidbox` command-line tool.

fn main() -> std::process::ExitCode {
    voidbox::cli::main()
}
