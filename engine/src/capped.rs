//! Bounded collection of a VM's output streams: a buffer that refuses to exceed its cap
//! (an error, never a silent truncation) and the tail of a stream kept for reports.

/// Default per-node output cap: 16 MiB.
pub const DEFAULT_MAX_OUTPUT: u64 = 16 * 1024 * 1024;

/// Collects a stream up to a cap; beyond it the collector remembers that it overflowed
/// (an error for the node, never a silent truncation).
#[derive(Debug, Clone)]
pub struct CappedBuf {
    buf: Vec<u8>,
    cap: u64,
    total: u64,
}

impl CappedBuf {
    /// An empty collector holding at most `cap` bytes.
    pub fn new(cap: u64) -> CappedBuf {
        CappedBuf {
            buf: Vec::new(),
            cap,
            total: 0,
        }
    }

    /// Appends `data` (bytes beyond the cap are counted, not stored).
    pub fn push(&mut self, data: &[u8]) {
        self.total = self.total.saturating_add(data.len() as u64);
        let room = self.cap.saturating_sub(self.buf.len() as u64) as usize;
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// `true` once more than `cap` bytes were pushed.
    pub fn overflowed(&self) -> bool {
        self.total > self.cap
    }

    /// Bytes pushed in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The collected bytes, or an error text when the cap was exceeded.
    pub fn into_result(self, what: &str) -> Result<Vec<u8>, String> {
        if self.overflowed() {
            Err(over_cap(what, self.total, self.cap))
        } else {
            Ok(self.buf)
        }
    }
}

/// The message for an output over the cap.
pub fn over_cap(what: &str, size: u64, cap: u64) -> String {
    format!(
        "{what} is larger than the output cap ({size} > {cap} bytes; raise it with --max-output)"
    )
}

/// The last `max` bytes of a stream (stderr tails for reports).
#[derive(Debug, Clone)]
pub struct Tail {
    buf: std::collections::VecDeque<u8>,
    max: usize,
}

impl Tail {
    /// An empty tail keeping `max` bytes.
    pub fn new(max: usize) -> Tail {
        Tail {
            buf: std::collections::VecDeque::new(),
            max,
        }
    }

    /// Appends bytes, dropping the oldest beyond `max`.
    pub fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(self.max)..];
        self.buf.extend(data.iter().copied());
        while self.buf.len() > self.max {
            self.buf.pop_front();
        }
    }

    /// The tail as (lossy) text.
    pub fn text(&self) -> String {
        let v: Vec<u8> = self.buf.iter().copied().collect();
        String::from_utf8_lossy(&v).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_buffer_errors_instead_of_truncating() {
        let mut b = CappedBuf::new(4);
        b.push(b"ab");
        b.push(b"cd");
        assert!(!b.overflowed());
        b.push(b"e");
        assert!(b.overflowed());
        assert_eq!(b.total(), 5);
        assert!(b.into_result("stdout").unwrap_err().contains("5 > 4"));
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(5);
        t.push(b"hello ");
        t.push(b"world");
        assert_eq!(t.text(), "world");
        t.push(b"0123456789");
        assert_eq!(t.text(), "56789");
    }
}
