//! Progress output on stderr: an indicatif bar on a terminal, plain phase lines
//! (with a heartbeat during the kernel compile) otherwise, or nothing.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::output::ProgressMode;

/// Progress reporter of one build.
pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    start: Instant,
    phase_start: Instant,
    last_beat: Instant,
    steps: u64,
}

/// Interval of the "files compiled" lines when there is no bar.
const HEARTBEAT: Duration = Duration::from_secs(30);

impl Progress {
    /// A reporter for `mode`.
    pub fn new(mode: ProgressMode) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (mode == ProgressMode::Auto && tty).then(|| {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress {
            bar,
            quiet: mode == ProgressMode::Quiet,
            start: Instant::now(),
            phase_start: Instant::now(),
            last_beat: Instant::now(),
            steps: 0,
        }
    }

    /// Prints a line.
    pub fn line(&self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }

    /// Starts a phase: prints `[i/n] what` and shows a spinner.
    pub fn phase(&mut self, i: usize, n: usize, what: &str) {
        self.phase_start = Instant::now();
        self.last_beat = Instant::now();
        self.steps = 0;
        self.line(&format!("[{i}/{n}] {what}"));
        if let Some(b) = &self.bar {
            b.set_length(0);
            b.set_position(0);
            b.set_style(
                ProgressStyle::with_template("  {spinner} {elapsed_precise} {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.set_message(what.to_string());
        }
    }

    /// Switches the bar to a determinate compile progress of about `total` steps.
    pub fn start_compile(&mut self, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
            b.set_position(0);
            b.set_style(
                ProgressStyle::with_template(
                    "  {bar:30} {pos}/~{len} {elapsed_precise} (eta {eta}) {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        }
    }

    /// One compile step done (`what` is the make output line).
    pub fn compile_step(&mut self, what: &str) {
        self.steps += 1;
        match &self.bar {
            Some(b) => {
                if b.length().is_some_and(|l| self.steps > l) {
                    b.set_length(self.steps + 50);
                }
                b.set_position(self.steps);
                b.set_message(what.trim().to_string());
            }
            None if !self.quiet && self.last_beat.elapsed() >= HEARTBEAT => {
                self.last_beat = Instant::now();
                eprintln!(
                    "      … {} files compiled ({:.0}s)",
                    self.steps,
                    self.phase_start.elapsed().as_secs_f64()
                );
            }
            None => {}
        }
    }

    /// Updates the spinner message.
    pub fn detail(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        }
    }

    /// Time since the reporter was created.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
