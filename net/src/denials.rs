//! Denials aggregated by destination, port, protocol and reason (bounded).

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::{Denial, Protocol};

/// Destination under which denials are counted once the table is full.
const OVERFLOW: &str = "other";

type Key = (String, u16, Protocol, Cow<'static, str>);

/// At most `cap` distinct entries; later distinct ones count under [`OVERFLOW`].
pub(crate) struct DenialLog {
    entries: BTreeMap<Key, u64>,
    cap: usize,
}

impl DenialLog {
    pub(crate) fn new(cap: usize) -> DenialLog {
        DenialLog {
            entries: BTreeMap::new(),
            cap,
        }
    }

    pub(crate) fn record(
        &mut self,
        destination: String,
        port: u16,
        protocol: Protocol,
        reason: Cow<'static, str>,
    ) {
        let key = (destination, port, protocol, reason);
        if let Some(n) = self.entries.get_mut(&key) {
            *n = n.saturating_add(1);
            return;
        }
        let key = if self.entries.len() < self.cap {
            key
        } else {
            (OVERFLOW.to_string(), 0, protocol, key.3)
        };
        let n = self.entries.entry(key).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// Sorted by destination, port, protocol (then reason).
    pub(crate) fn list(&self) -> Vec<Denial> {
        self.entries
            .iter()
            .map(|((destination, port, protocol, reason), count)| Denial {
                destination: destination.clone(),
                port: *port,
                protocol: *protocol,
                reason: reason.to_string(),
                count: *count,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_sorts_and_bounds() {
        let mut log = DenialLog::new(2);
        log.record("9.9.9.9".into(), 80, Protocol::Tcp, "x".into());
        log.record("1.1.1.1".into(), 80, Protocol::Tcp, "x".into());
        log.record("9.9.9.9".into(), 80, Protocol::Tcp, "x".into());
        log.record("5.5.5.5".into(), 80, Protocol::Tcp, "x".into());
        log.record("6.6.6.6".into(), 81, Protocol::Tcp, "x".into());
        let list = log.list();
        let got: Vec<(&str, u64)> = list
            .iter()
            .map(|d| (d.destination.as_str(), d.count))
            .collect();
        assert_eq!(got, [("1.1.1.1", 1), ("9.9.9.9", 2), ("other", 2)]);
    }
}
