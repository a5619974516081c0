//! Replays every file of the `decode` fuzz corpus (`fuzz/corpus/decode/`) through the
//! fuzz harness: no panic, and seeds whose names state an expected outcome get it.

#[path = "../fuzz/fuzz_targets/harness.rs"]
mod harness;

use std::path::PathBuf;

use voidbox_protocol::ProtocolError;

#[test]
fn replay_decode_corpus() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    entries.sort();
    assert!(entries.len() >= 30, "corpus too small: {}", entries.len());
    let mut valid_types = std::collections::HashSet::new();
    for path in &entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let data = std::fs::read(path).expect("read corpus file");
        let results = harness::check(&data);
        let first_err = results.iter().find_map(|r| r.as_ref().err());
        let ok = |pred: &dyn Fn(&ProtocolError) -> bool| first_err.is_some_and(pred);
        if name.starts_with("valid-") {
            assert!(first_err.is_none(), "{name}: {first_err:?}");
            assert!(!results.is_empty(), "{name}: no message");
            for m in results.iter().flatten() {
                valid_types.insert(m.message_type());
            }
        } else if name.starts_with("truncated-") {
            assert!(
                ok(&|e| matches!(e, ProtocolError::Truncated { .. })),
                "{name}: {results:?}"
            );
        } else if name.starts_with("oversized-") {
            assert!(
                ok(&|e| matches!(e, ProtocolError::Oversized { .. })),
                "{name}: {results:?}"
            );
        } else if name.starts_with("unknown-") {
            assert!(
                ok(&|e| matches!(e, ProtocolError::UnknownType(_))),
                "{name}: {results:?}"
            );
        } else if name.starts_with("malformed-") {
            assert!(
                ok(&|e| matches!(e, ProtocolError::Malformed { .. })),
                "{name}: {results:?}"
            );
            assert!(results
                .iter()
                .all(|r| r.as_ref().err().is_none_or(|e| !e.is_fatal())));
        } else if name.starts_with("trailing-") {
            assert!(results.first().is_some_and(|r| r.is_ok()), "{name}");
            assert!(first_err.is_some(), "{name}: trailing bytes not reported");
        }
        // Anything else (garbage-*, files added by fuzzing): only "no panic".
    }
    assert_eq!(
        valid_types.len(),
        voidbox_protocol::MessageType::ALL.len(),
        "every type has a valid seed"
    );
}

#[path = "../fuzz/fuzz_targets/restore_page_harness.rs"]
mod restore_page_harness;

/// Replays the `restore_page` fuzz corpus: no panic, and `armed-`, `filled-` and `refused-`
/// seeds are read as their names say.
#[test]
fn replay_restore_page_corpus() {
    use voidbox_protocol::restore_page::Reading;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/restore_page");
    let mut seen = [0usize; 3];
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let data = std::fs::read(&path).expect("read corpus file");
        let r = restore_page_harness::check(&data);
        if name.starts_with("armed-") {
            assert!(matches!(r, Ok(Reading::Armed)), "{name}: {r:?}");
            seen[0] += 1;
        } else if name.starts_with("filled-") {
            assert!(matches!(r, Ok(Reading::Filled(_))), "{name}: {r:?}");
            seen[1] += 1;
        } else if name.starts_with("refused-") {
            assert!(r.is_err(), "{name}: accepted");
            seen[2] += 1;
        }
    }
    assert!(seen.iter().all(|n| *n >= 2), "corpus too small: {seen:?}");
}
