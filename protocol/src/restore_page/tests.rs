use super::*;
use crate::policy::ResourceLimits;

const NOW: u64 = 1_700_000_000_000_000_000;

fn grant(policy: Option<GuestPolicy>) -> RestoreGrant {
    RestoreGrant::new(
        SessionSecret::from_bytes([7; SECRET_LEN]),
        Zeroizing::new(vec![0xa5; 64]),
        policy,
    )
    .unwrap()
}

fn page_with(bytes: &[u8]) -> Vec<u8> {
    let mut page = vec![0u8; LEN];
    page[..bytes.len()].copy_from_slice(bytes);
    page
}

fn policy() -> GuestPolicy {
    GuestPolicy {
        allowlist: Some(vec!["sh".into(), "/usr/bin/env".into()]),
        rlimits: ResourceLimits::DEFAULT,
        default_timeout_secs: Some(30),
        ..GuestPolicy::default()
    }
}

#[test]
fn layout_fits_below_the_ebda() {
    assert!(GPA.is_multiple_of(4096));
    assert!(
        GPA + LEN as u64 <= 0x9_f000,
        "the page ends before the EBDA's page"
    );
    assert_eq!(HEADER_LEN + MAX_PAYLOAD, LEN);
}

#[test]
fn armed_then_filled_then_read_round_trips() {
    let nonce = [3u8; NONCE_LEN];
    let armed_page = page_with(&armed(&nonce));
    assert_eq!(armed_nonce(&armed_page), Ok(nonce));
    assert!(matches!(read(&armed_page, &nonce), Ok(Reading::Armed)));

    let filled = fill(&armed_page, &grant(Some(policy())), NOW).unwrap();
    let page = page_with(&filled);
    let Reading::Filled(d) = read(&page, &nonce).unwrap() else {
        panic!("not filled");
    };
    assert_eq!(d.unix_time_ns, NOW);
    assert_eq!(d.grant, grant(Some(policy())));
    // A filled page is not armed: the VMM refuses to fill it again (stale page).
    assert!(matches!(
        armed_nonce(&page),
        Err(PageError::State { got: 2, .. })
    ));
    assert!(fill(&page, &grant(None), NOW).is_err());
    // Without a policy.
    let page = page_with(&fill(&armed_page, &grant(None), NOW).unwrap());
    let Reading::Filled(d) = read(&page, &nonce).unwrap() else {
        panic!("not filled");
    };
    assert_eq!(d.grant.policy, None);
}

#[test]
fn another_nonce_is_stale() {
    let armed_page = page_with(&armed(&[1; NONCE_LEN]));
    let page = page_with(&fill(&armed_page, &grant(None), NOW).unwrap());
    assert_eq!(read(&page, &[2; NONCE_LEN]).unwrap_err(), PageError::Nonce);
    assert_eq!(
        read(&armed_page, &[2; NONCE_LEN]).unwrap_err(),
        PageError::Nonce
    );
}

#[test]
fn every_flipped_byte_is_refused() {
    let nonce = [9u8; NONCE_LEN];
    let armed_page = page_with(&armed(&nonce));
    let filled = fill(&armed_page, &grant(Some(policy())), NOW).unwrap();
    for i in 0..filled.len() {
        let mut page = page_with(&filled);
        page[i] ^= 0x40;
        assert!(
            read(&page, &nonce).is_err(),
            "byte {i} flipped was accepted"
        );
    }
    for i in 0..HEADER_LEN {
        let mut page = armed_page.clone();
        page[i] ^= 0x01;
        assert!(
            armed_nonce(&page).is_err(),
            "armed byte {i} flipped was accepted"
        );
    }
}

#[test]
fn hostile_headers_say_what_is_wrong() {
    let nonce = [0u8; NONCE_LEN];
    assert_eq!(read(&[0; LEN], &nonce).unwrap_err(), PageError::NotArmed);
    assert!(matches!(
        read(&armed(&nonce)[..10], &nonce),
        Err(PageError::Truncated { got: 10, .. })
    ));
    let mut page = page_with(&armed(&nonce));
    page[8] = 2;
    assert_eq!(read(&page, &nonce).unwrap_err(), PageError::Version(2));
    let mut page = page_with(&armed(&nonce));
    page[12] = 7;
    assert!(matches!(
        read(&page, &nonce),
        Err(PageError::State { got: 7, .. })
    ));
    // A filled page claiming more payload than the page holds, with a matching checksum.
    let mut h = header(State::Filled, &nonce, (MAX_PAYLOAD + 1) as u32);
    let sum = checksum(&h, &[]);
    h[CHECKSUM_AT..].copy_from_slice(&sum);
    assert!(matches!(
        read(&page_with(&h), &nonce),
        Err(PageError::Length { len, .. }) if len == MAX_PAYLOAD + 1
    ));
    // Bounded by the slice given, not by the claimed length.
    let h = header(State::Filled, &nonce, 100);
    assert!(matches!(
        read(&h, &nonce),
        Err(PageError::Truncated { need, .. }) if need == HEADER_LEN + 100
    ));
}

/// A forged payload with a valid checksum: each field is still checked.
#[test]
fn forged_payloads_with_valid_checksums_are_refused() {
    let nonce = [4u8; NONCE_LEN];
    let forge = |payload: &[u8]| {
        let mut h = header(State::Filled, &nonce, payload.len() as u32);
        let sum = checksum(&h, payload);
        h[CHECKSUM_AT..].copy_from_slice(&sum);
        let mut page = page_with(&h);
        page[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        read(&page, &nonce)
    };
    let good = grant(None).payload(NOW).unwrap();
    assert!(forge(&good).is_ok());
    assert!(matches!(
        forge(&good[..10]),
        Err(PageError::Truncated { .. })
    ));
    let mut p = good.to_vec();
    p[SECRET_LEN + 8] = 8; // entropy length 8
    p[SECRET_LEN + 9] = 0;
    assert!(matches!(forge(&p), Err(PageError::Entropy(_))));
    let mut p = good.to_vec();
    p.push(0);
    assert_eq!(
        forge(&p).unwrap_err(),
        PageError::Garbage("bytes after the policy")
    );
    let p = grant(None).payload(5).unwrap();
    assert_eq!(forge(&p).unwrap_err(), PageError::Clock(5));
    let mut p = grant(None).payload(NOW).unwrap().to_vec();
    let n = p.len();
    p[n - 2..].copy_from_slice(&4u16.to_le_bytes());
    p.extend_from_slice(b"nope");
    assert!(matches!(forge(&p), Err(PageError::Policy(_))));
    // Valid JSON, but a policy the guest cannot enforce.
    let bad = br#"{"max_concurrent_execs":0}"#;
    let mut p = grant(None).payload(NOW).unwrap().to_vec();
    let n = p.len();
    p[n - 2..].copy_from_slice(&(bad.len() as u16).to_le_bytes());
    p.extend_from_slice(bad);
    assert!(matches!(forge(&p), Err(PageError::Policy(_))));
}

#[test]
fn grants_that_do_not_fit_are_refused_before_anything_starts() {
    let huge = GuestPolicy {
        allowlist: Some((0..2000).map(|i| format!("/usr/bin/tool-{i}")).collect()),
        ..GuestPolicy::default()
    };
    let e = RestoreGrant::new(
        SessionSecret::from_bytes([1; SECRET_LEN]),
        Zeroizing::new(vec![1; 64]),
        Some(huge),
    )
    .unwrap_err();
    assert!(matches!(e, PageError::Length { .. }), "{e}");
    assert!(e.to_string().contains("policy is too large"), "{e}");
    let e = RestoreGrant::new(
        SessionSecret::from_bytes([1; SECRET_LEN]),
        Zeroizing::new(vec![1; 8]),
        None,
    )
    .unwrap_err();
    assert!(matches!(e, PageError::Entropy(_)));
    let armed_page = page_with(&armed(&[0; NONCE_LEN]));
    assert_eq!(
        fill(&armed_page, &grant(None), 1).unwrap_err(),
        PageError::Clock(1)
    );
}

#[test]
fn grant_serde_is_hex_and_debug_is_redacted() {
    let g = grant(Some(policy()));
    let json = serde_json::to_string(&g).unwrap();
    assert!(json.contains(&"07".repeat(SECRET_LEN)), "{json}");
    let back: RestoreGrant = serde_json::from_str(&json).unwrap();
    assert_eq!(back, g);
    let dbg = format!("{g:?}");
    assert!(!dbg.contains("07070707") && !dbg.contains("a5a5"), "{dbg}");
    assert!(dbg.contains("64 bytes"), "{dbg}");
    for bad in [
        r#"{"secret":"zz","entropy":"00"}"#,
        r#"{"secret":"0707070707070707070707070707070707070707070707070707070707070707","entropy":"0g"}"#,
        r#"{"secret":"0707070707070707070707070707070707070707070707070707070707070707","entropy":"00"}"#,
        r#"{"secret":"0707070707070707070707070707070707070707070707070707070707070707","entropy":"","x":1}"#,
    ] {
        assert!(serde_json::from_str::<RestoreGrant>(bad).is_err(), "{bad}");
    }
}
