//! Replays the `p9_message` seed corpus (`vmm/fuzz/corpus/p9_message`, written by
//! `vmm/fuzz/gen_p9_corpus.py`) through the fuzz target's entry point, with its invariants
//! and what the named seeds must produce, so regressions show up in a plain `cargo test`.

use std::path::{Path, PathBuf};

use voidbox_vmm::devices::p9::fuzz::{fuzz_messages, FuzzReport};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/p9_message")
}

fn run(name: &str) -> FuzzReport {
    let data = std::fs::read(corpus().join(name)).unwrap();
    fuzz_messages(&data).unwrap_or_else(|| panic!("{name}: no report"))
}

/// The errno of each reply (`Some(0)` for a reply that is not an `Rlerror`).
fn errnos(r: &FuzzReport) -> Vec<Option<i32>> {
    r.replies
        .iter()
        .map(|m| {
            m.as_ref().map(|m| {
                if m[4] == 7 {
                    i32::from_le_bytes([m[7], m[8], m[9], m[10]])
                } else {
                    0
                }
            })
        })
        .collect()
}

#[test]
fn replay_p9_message_corpus() {
    let mut n = 0;
    for entry in std::fs::read_dir(corpus()).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = fuzz_messages(&data).unwrap_or_else(|| panic!("{}: no report", path.display()));
        assert!(r.replies_well_formed, "{}: {r:?}", path.display());
        assert!(r.outside_untouched, "{}: escaped the share", path.display());
        assert!(
            r.read_only_untouched,
            "{}: read-only share changed",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 10, "corpus too small: {n}");
}

#[test]
fn named_seeds_do_what_they_say() {
    let (ok, eperm, einval, erofs) = (
        Some(0),
        Some(libc::EPERM),
        Some(libc::EINVAL),
        Some(libc::EROFS),
    );
    assert_eq!(errnos(&run("read_file")), [ok; 5]);
    let r = run("dotdot_walk");
    assert_eq!(errnos(&r), [ok, ok, eperm, eperm]);
    assert_eq!(
        errnos(&run("slash_names")),
        [ok, ok, einval, einval, einval, einval]
    );
    let r = run("ro_refusals");
    let e = errnos(&r);
    assert_eq!(&e[..3], [ok; 3]);
    assert!(e[3..].iter().all(|e| *e == erofs), "{e:?}");
    assert_eq!(r.stats.refused, e.len() as u64 - 3);
    let e = errnos(&run("create_write"));
    assert!(e.iter().all(|e| *e == ok), "{e:?}");
    let e = errnos(&run("chown"));
    assert_eq!(e, [ok, ok, ok, eperm, ok, ok]);
    let e = errnos(&run("unbound"));
    assert_eq!(
        e,
        [
            ok,
            Some(libc::ENOENT),
            Some(libc::EBADF),
            Some(libc::EBADF),
            ok
        ]
    );
    let e = errnos(&run("short_and_bad"));
    assert_eq!(e[0], None, "shorter than a header: no reply");
    assert!(e[1..].iter().all(|e| e.is_some_and(|e| e != 0)), "{e:?}");
}
