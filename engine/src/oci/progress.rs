//! Progress of one pull on stderr ([`PullReporter`]): an indicatif bar on a terminal (bytes
//! downloaded of the total, layers done of the total, the phase), one plain line per phase
//! otherwise (CI logs), or nothing — the [`ProgressMode`] convention of `voidbox image`.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use voidbox_oci::PullProgress;

use crate::output::ProgressMode;
use crate::units::human_size;

/// Reports the progress of pulling one reference; a [`PullProgress`] for
/// [`voidbox_oci::Store::pull`].
pub struct PullReporter {
    reference: String,
    out: Output,
    layers: Mutex<Layers>,
    bytes: AtomicU64,
    started: Instant,
}

enum Output {
    Bar(ProgressBar),
    Lines(Mutex<Box<dyn Write + Send>>),
    Quiet,
}

#[derive(Default)]
struct Layers {
    total: usize,
    done: usize,
    bytes: u64,
}

impl PullReporter {
    /// A reporter for `reference`: a bar when `mode` is `Auto` and stderr is a terminal,
    /// plain lines on stderr for `Auto` elsewhere and for `Plain`, nothing for `Quiet`.
    pub fn new(mode: ProgressMode, reference: &str) -> PullReporter {
        let out = match mode {
            ProgressMode::Quiet => Output::Quiet,
            ProgressMode::Auto if std::io::stderr().is_terminal() => {
                let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                bar.enable_steady_tick(Duration::from_millis(120));
                Output::Bar(bar)
            }
            _ => Output::Lines(Mutex::new(Box::new(std::io::stderr()))),
        };
        PullReporter::with_output(out, reference)
    }

    fn with_output(out: Output, reference: &str) -> PullReporter {
        if let Output::Bar(bar) = &out {
            bar.set_prefix(reference.to_string());
        }
        PullReporter {
            reference: reference.to_string(),
            out,
            layers: Mutex::new(Layers::default()),
            bytes: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// Removes the bar (plain lines need no ending).
    pub fn finish(&self) {
        if let Output::Bar(bar) = &self.out {
            bar.finish_and_clear();
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn line(&self, text: &str) {
        if let Output::Lines(w) = &self.out {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(w, "pulling {}: {text}", self.reference);
            let _ = w.flush();
        }
    }

    fn downloading_message(&self) -> String {
        let l = self.counts();
        format!("downloading, layers {}/{}", l.done, l.total)
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner())
}

impl PullProgress for PullReporter {
    fn layers(&self, total: usize, bytes: u64) {
        {
            let mut l = self.counts();
            l.total = total;
            l.bytes = bytes;
        }
        if let Output::Bar(bar) = &self.out {
            bar.set_length(bytes);
            bar.set_position(self.bytes.load(Ordering::Relaxed));
        }
    }

    fn bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
        if let Output::Bar(bar) = &self.out {
            bar.inc(n);
        }
    }

    fn layer_done(&self, _digest: &str) {
        self.counts().done += 1;
        if let Output::Bar(bar) = &self.out {
            bar.set_message(self.downloading_message());
        }
    }

    fn phase(&self, what: &str) {
        match &self.out {
            Output::Quiet => {}
            Output::Bar(bar) if what == "downloading" => {
                bar.set_style(style(
                    "{spinner} {prefix} {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
                ));
                bar.set_message(self.downloading_message());
            }
            Output::Bar(bar) => {
                bar.set_style(style("{spinner} {prefix} {msg} {elapsed}"));
                bar.set_message(what.to_string());
            }
            Output::Lines(_) => {
                let text = match what {
                    "downloading" => {
                        let l = self.counts();
                        format!(
                            "downloading {} layer{}, {}",
                            l.total,
                            if l.total == 1 { "" } else { "s" },
                            human_size(l.bytes)
                        )
                    }
                    "unpacking" => format!(
                        "unpacking ({} downloaded in {:.1}s)",
                        human_size(self.bytes.load(Ordering::Relaxed)),
                        self.started.elapsed().as_secs_f64()
                    ),
                    "converting" => "converting to an erofs disk".to_string(),
                    other => other.to_string(),
                };
                self.line(&text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn drive(r: &PullReporter) {
        r.phase("resolving");
        r.layers(2, 3 << 20);
        r.phase("downloading");
        r.bytes(1 << 20);
        r.layer_done("sha256:aa");
        r.bytes(2 << 20);
        r.layer_done("sha256:bb");
        r.phase("unpacking");
        r.phase("converting");
    }

    #[test]
    fn plain_mode_prints_one_line_per_phase() {
        let sink = Shared::default();
        let r = PullReporter::with_output(
            Output::Lines(Mutex::new(Box::new(sink.clone()))),
            "reg:5000/app:v1",
        );
        drive(&r);
        r.phase("cached");
        r.finish();
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert_eq!(lines[0], "pulling reg:5000/app:v1: resolving");
        assert_eq!(
            lines[1],
            "pulling reg:5000/app:v1: downloading 2 layers, 3.0M"
        );
        assert!(
            lines[2].starts_with("pulling reg:5000/app:v1: unpacking (3.0M downloaded in "),
            "{text}"
        );
        assert_eq!(
            lines[3],
            "pulling reg:5000/app:v1: converting to an erofs disk"
        );
        assert_eq!(lines[4], "pulling reg:5000/app:v1: cached");
    }

    #[test]
    fn bar_tracks_bytes_layers_and_phase() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        let r = PullReporter::with_output(Output::Bar(bar.clone()), "app:v1");
        assert_eq!(bar.prefix(), "app:v1");
        r.phase("resolving");
        assert_eq!(bar.message(), "resolving");
        r.layers(2, 3 << 20);
        r.phase("downloading");
        assert_eq!(bar.length(), Some(3 << 20));
        assert_eq!(bar.message(), "downloading, layers 0/2");
        r.bytes(1 << 20);
        r.layer_done("sha256:aa");
        assert_eq!(bar.position(), 1 << 20);
        assert_eq!(bar.message(), "downloading, layers 1/2");
        r.bytes(2 << 20);
        r.layer_done("sha256:bb");
        assert_eq!(bar.position(), 3 << 20);
        assert_eq!(bar.message(), "downloading, layers 2/2");
        r.phase("unpacking");
        assert_eq!(bar.message(), "unpacking");
        r.finish();
        assert!(bar.is_finished());
    }

    #[test]
    fn quiet_mode_says_nothing_and_keeps_count() {
        let r = PullReporter::new(ProgressMode::Quiet, "app:v1");
        drive(&r);
        assert!(matches!(r.out, Output::Quiet));
        assert_eq!(r.bytes.load(Ordering::Relaxed), 3 << 20);
        assert_eq!(r.counts().done, 2);
    }
}
