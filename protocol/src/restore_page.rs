//! The restore page: how a VM restored from a snapshot gets its new session secret, RNG seed,
//! clock and policy with no message on vsock.
//!
//! The VMM reserves [`LEN`] bytes of guest-physical memory at [`GPA`] (an e820 "reserved"
//! range below 1 MiB, so the guest kernel never uses it as RAM). The guest agent (PID 1)
//! maps it through `/dev/mem` and **arms** it at boot: a header in state [`State::Armed`]
//! with a random nonce. A snapshot taken while the page is armed records that it has one.
//! On restore, before the first vCPU instruction, the VMM reads the armed header from the
//! snapshot's memory and writes a **filled** page: the same nonce, the [`RestoreGrant`]
//! (new secret, host entropy, policy), the host's wall-clock time, and a SHA-256 over all
//! of it. The agent reads and clears the page before it serves the first connection after
//! the resume, and authenticates that connection (whose first frame is the node's own
//! request, pipelined behind its `Ping`) under the new secret only.
//!
//! Layout (all integers little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | [`MAGIC`] |
//! | 8 | 4 | [`VERSION`] |
//! | 12 | 4 | [`State`] |
//! | 16 | 16 | nonce |
//! | 32 | 4 | payload length (0 unless filled; at most [`MAX_PAYLOAD`]) |
//! | 36 | 4 | zero |
//! | 40 | 32 | SHA-256 of bytes 0..40 and the payload (zero unless filled) |
//! | 72 | n | payload: secret (32) · unix time ns (u64) · entropy length (u16) · entropy · policy length (u16) · policy JSON |
//!
//! Both sides treat the page as hostile: every length is bounded before it is used, the
//! checksum and the nonce must match, and a page in any other shape is refused with a
//! [`PageError`] that says what was wrong.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::handshake::{SessionSecret, SECRET_LEN};
use crate::message::{check_rekey_entropy, REKEY_ENTROPY_MAX, REKEY_ENTROPY_MIN};
use crate::policy::GuestPolicy;

/// Guest-physical address of the restore page (page aligned, below the EBDA).
pub const GPA: u64 = 0x9_b000;
/// Bytes reserved for it (four pages).
pub const LEN: usize = 16 * 1024;
/// First bytes of an armed or filled page.
pub const MAGIC: [u8; 8] = *b"VBXRPAGE";
/// Layout version; a page of any other version is refused.
pub const VERSION: u32 = 1;
/// Bytes of the nonce the guest arms the page with.
pub const NONCE_LEN: usize = 16;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 72;
/// Largest payload that fits.
pub const MAX_PAYLOAD: usize = LEN - HEADER_LEN;
/// Earliest clock a page may carry (2020-01-01T00:00:00Z): anything before is a broken host
/// clock.
pub const MIN_UNIX_TIME_NS: u64 = 1_577_836_800 * 1_000_000_000;

const CHECKSUM_AT: usize = 40;
const FIXED_PAYLOAD: usize = SECRET_LEN + 8 + 2 + 2;

/// What the page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Armed by the guest agent, waiting for a restore.
    Armed,
    /// Filled by the VMM before a resume, not yet read by the guest.
    Filled,
}

impl State {
    fn code(self) -> u32 {
        match self {
            State::Armed => 1,
            State::Filled => 2,
        }
    }
}

/// Why a page was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// No magic: the page was never armed (or was overwritten).
    #[error("no restore page (the magic is missing): the guest agent never armed it")]
    NotArmed,
    /// Another layout version.
    #[error("restore page version {0}, expected {VERSION}")]
    Version(u32),
    /// A state other than the one expected here.
    #[error("restore page is in state {got}, expected {expected}")]
    State {
        /// The state number found.
        got: u32,
        /// What was expected.
        expected: &'static str,
    },
    /// A length field out of bounds.
    #[error("restore page {field} length {len} is out of bounds (at most {max})")]
    Length {
        /// Which length.
        field: &'static str,
        /// Its value.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Fewer bytes than the layout needs.
    #[error("restore page truncated: {got} bytes, {need} needed")]
    Truncated {
        /// Bytes given.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Reserved bytes not zero, or bytes after the policy.
    #[error("restore page has {0}")]
    Garbage(&'static str),
    /// The checksum does not match: torn, corrupted or forged.
    #[error("restore page checksum mismatch (torn, corrupted or forged)")]
    Checksum,
    /// Filled for another arming than this guest's: stale or replayed.
    #[error("restore page nonce does not match this guest's: stale or replayed")]
    Nonce,
    /// The entropy length is outside the re-key bounds.
    #[error("restore page entropy: {0}")]
    Entropy(String),
    /// A clock before 2020.
    #[error("restore page clock {0} ns since the epoch is before 2020: host clock broken?")]
    Clock(u64),
    /// The policy is not valid JSON of a guest policy.
    #[error("restore page policy: {0}")]
    Policy(String),
}

/// What the VMM hands a restored guest: a new session secret, host entropy for its RNG, and
/// the policy to narrow to. Serialized (hex for the bytes) in the VMM's config, which goes
/// over a pipe; its `Debug` shows neither the secret nor the entropy.
#[derive(Clone, PartialEq, Eq)]
pub struct RestoreGrant {
    /// The session secret the restored guest accepts from now on.
    pub secret: SessionSecret,
    /// Host entropy: [`REKEY_ENTROPY_MIN`]..=[`REKEY_ENTROPY_MAX`] bytes.
    pub entropy: Zeroizing<Vec<u8>>,
    /// Policy the guest narrows to before serving anything.
    pub policy: Option<GuestPolicy>,
}

impl fmt::Debug for RestoreGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RestoreGrant")
            .field("secret", &self.secret)
            .field("entropy", &format_args!("<{} bytes>", self.entropy.len()))
            .field("policy", &self.policy)
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantWire {
    secret: String,
    entropy: String,
    #[serde(default)]
    policy: Option<GuestPolicy>,
}

impl Serialize for RestoreGrant {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let secret = Zeroizing::new(self.secret.to_hex());
        let entropy = Zeroizing::new(to_hex(&self.entropy));
        GrantWireRef {
            secret: &secret,
            entropy: &entropy,
            policy: self.policy.as_ref(),
        }
        .serialize(s)
    }
}

#[derive(Serialize)]
struct GrantWireRef<'a> {
    secret: &'a str,
    entropy: &'a str,
    policy: Option<&'a GuestPolicy>,
}

impl<'de> Deserialize<'de> for RestoreGrant {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut wire = GrantWire::deserialize(d)?;
        let secret = SessionSecret::from_hex(&wire.secret).map_err(D::Error::custom);
        let entropy = from_hex(&wire.entropy);
        zeroize::Zeroize::zeroize(&mut wire.secret);
        zeroize::Zeroize::zeroize(&mut wire.entropy);
        let entropy = entropy.ok_or_else(|| D::Error::custom("entropy is not hexadecimal"))?;
        check_rekey_entropy(entropy.len()).map_err(D::Error::custom)?;
        Ok(RestoreGrant {
            secret: secret?,
            entropy,
            policy: wire.policy,
        })
    }
}

fn to_hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 0xf) as usize] as char);
    }
    s
}

fn from_hex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let val = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for pair in s.chunks_exact(2) {
        out.push((val(pair[0])? << 4) | val(pair[1])?);
    }
    Some(out)
}

impl RestoreGrant {
    /// A grant with a fresh secret and `entropy` (checked against the re-key bounds).
    pub fn new(
        secret: SessionSecret,
        entropy: Zeroizing<Vec<u8>>,
        policy: Option<GuestPolicy>,
    ) -> Result<Self, PageError> {
        check_rekey_entropy(entropy.len()).map_err(PageError::Entropy)?;
        let g = RestoreGrant {
            secret,
            entropy,
            policy,
        };
        g.payload(MIN_UNIX_TIME_NS)?;
        Ok(g)
    }

    /// The payload for `unix_time_ns`; refused when the entropy or the policy do not fit.
    fn payload(&self, unix_time_ns: u64) -> Result<Zeroizing<Vec<u8>>, PageError> {
        check_rekey_entropy(self.entropy.len()).map_err(PageError::Entropy)?;
        let policy = match &self.policy {
            Some(p) => serde_json::to_vec(p).map_err(|e| PageError::Policy(e.to_string()))?,
            None => Vec::new(),
        };
        let len = FIXED_PAYLOAD + self.entropy.len() + policy.len();
        if len > MAX_PAYLOAD {
            return Err(PageError::Length {
                field: "payload (the policy is too large)",
                len,
                max: MAX_PAYLOAD,
            });
        }
        let mut out = Zeroizing::new(Vec::with_capacity(len));
        out.extend_from_slice(self.secret.as_bytes());
        out.extend_from_slice(&unix_time_ns.to_le_bytes());
        out.extend_from_slice(&(self.entropy.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.entropy);
        out.extend_from_slice(&(policy.len() as u16).to_le_bytes());
        out.extend_from_slice(&policy);
        Ok(out)
    }
}

/// What a filled page delivered to the guest.
#[derive(Debug)]
pub struct Delivery {
    /// The grant.
    pub grant: RestoreGrant,
    /// The host's wall-clock time when the VMM wrote the page, ns since the epoch.
    pub unix_time_ns: u64,
}

fn header(state: State, nonce: &[u8; NONCE_LEN], payload_len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&state.code().to_le_bytes());
    h[16..32].copy_from_slice(nonce);
    h[32..36].copy_from_slice(&payload_len.to_le_bytes());
    h
}

fn checksum(head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut d = Sha256::new();
    d.update(&head[..CHECKSUM_AT]);
    d.update(payload);
    d.finalize().into()
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// The header of an armed page with `nonce` (what the guest agent writes at boot).
pub fn armed(nonce: &[u8; NONCE_LEN]) -> [u8; HEADER_LEN] {
    let mut h = header(State::Armed, nonce, 0);
    let sum = checksum(&h, &[]);
    h[CHECKSUM_AT..].copy_from_slice(&sum);
    h
}

/// Checks the common header fields and returns the state code and nonce.
fn parse_header(page: &[u8]) -> Result<(u32, [u8; NONCE_LEN]), PageError> {
    if page.len() < HEADER_LEN {
        return Err(PageError::Truncated {
            got: page.len(),
            need: HEADER_LEN,
        });
    }
    if page[..8] != MAGIC {
        return Err(PageError::NotArmed);
    }
    let version = u32_at(page, 8);
    if version != VERSION {
        return Err(PageError::Version(version));
    }
    if page[36..40] != [0; 4] {
        return Err(PageError::Garbage("non-zero reserved header bytes"));
    }
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&page[16..32]);
    Ok((u32_at(page, 12), nonce))
}

/// VMM side: the nonce of an armed page (at snapshot time, and again before a restore).
/// Anything but a well-formed armed page is refused.
pub fn armed_nonce(page: &[u8]) -> Result<[u8; NONCE_LEN], PageError> {
    let (state, nonce) = parse_header(page)?;
    if state != State::Armed.code() {
        return Err(PageError::State {
            got: state,
            expected: "armed",
        });
    }
    if u32_at(page, 32) != 0 {
        return Err(PageError::Garbage("a payload length on an armed page"));
    }
    if page[CHECKSUM_AT..HEADER_LEN] != checksum(page, &[]) {
        return Err(PageError::Checksum);
    }
    Ok(nonce)
}

/// VMM side: the filled page for the armed `page`, carrying `grant` and `unix_time_ns`.
/// Write all of it at [`GPA`]; the returned bytes are zeroed when dropped.
pub fn fill(
    page: &[u8],
    grant: &RestoreGrant,
    unix_time_ns: u64,
) -> Result<Zeroizing<Vec<u8>>, PageError> {
    let nonce = armed_nonce(page)?;
    if unix_time_ns < MIN_UNIX_TIME_NS {
        return Err(PageError::Clock(unix_time_ns));
    }
    let payload = grant.payload(unix_time_ns)?;
    let mut h = header(State::Filled, &nonce, payload.len() as u32);
    let sum = checksum(&h, &payload);
    h[CHECKSUM_AT..].copy_from_slice(&sum);
    let mut out = Zeroizing::new(Vec::with_capacity(HEADER_LEN + payload.len()));
    out.extend_from_slice(&h);
    out.extend_from_slice(&payload);
    Ok(out)
}

/// What the guest found on its page.
#[derive(Debug)]
pub enum Reading {
    /// Still armed with the guest's nonce: no restore happened.
    Armed,
    /// Filled for this guest: the restore's delivery (boxed: it is large and rare).
    Filled(Box<Delivery>),
}

/// Guest side: reads `page` (at least the header; the whole page when filled), armed by this
/// guest with `nonce`. A well-formed page armed with another nonce, or filled for another,
/// is refused as stale.
pub fn read(page: &[u8], nonce: &[u8; NONCE_LEN]) -> Result<Reading, PageError> {
    let (state, found) = parse_header(page)?;
    if state == State::Armed.code() {
        armed_nonce(page)?;
        if !crate::ct_eq(&found, nonce) {
            return Err(PageError::Nonce);
        }
        return Ok(Reading::Armed);
    }
    if state != State::Filled.code() {
        return Err(PageError::State {
            got: state,
            expected: "armed or filled",
        });
    }
    let len = u32_at(page, 32) as usize;
    if len > MAX_PAYLOAD {
        return Err(PageError::Length {
            field: "payload",
            len,
            max: MAX_PAYLOAD,
        });
    }
    let Some(payload) = page.get(HEADER_LEN..HEADER_LEN + len) else {
        return Err(PageError::Truncated {
            got: page.len(),
            need: HEADER_LEN + len,
        });
    };
    if !crate::ct_eq(&page[CHECKSUM_AT..HEADER_LEN], &checksum(page, payload)) {
        return Err(PageError::Checksum);
    }
    if !crate::ct_eq(&found, nonce) {
        return Err(PageError::Nonce);
    }
    parse_payload(payload).map(|d| Reading::Filled(Box::new(d)))
}

fn parse_payload(p: &[u8]) -> Result<Delivery, PageError> {
    let short = |need: usize| PageError::Truncated {
        got: HEADER_LEN + p.len(),
        need: HEADER_LEN + need,
    };
    if p.len() < FIXED_PAYLOAD {
        return Err(short(FIXED_PAYLOAD));
    }
    let mut secret = [0u8; SECRET_LEN];
    secret.copy_from_slice(&p[..SECRET_LEN]);
    let secret = SessionSecret::from_bytes(secret);
    let mut at = SECRET_LEN;
    let mut t = [0u8; 8];
    t.copy_from_slice(&p[at..at + 8]);
    let unix_time_ns = u64::from_le_bytes(t);
    at += 8;
    let entropy_len = usize::from(u16::from_le_bytes([p[at], p[at + 1]]));
    at += 2;
    if !(REKEY_ENTROPY_MIN..=REKEY_ENTROPY_MAX).contains(&entropy_len) {
        return Err(PageError::Entropy(format!(
            "{entropy_len} bytes, expected {REKEY_ENTROPY_MIN}..={REKEY_ENTROPY_MAX}"
        )));
    }
    let entropy = p.get(at..at + entropy_len).ok_or(short(at + entropy_len))?;
    let entropy = Zeroizing::new(entropy.to_vec());
    at += entropy_len;
    let len_bytes = p.get(at..at + 2).ok_or(short(at + 2))?;
    let policy_len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
    at += 2;
    let policy_bytes = p.get(at..at + policy_len).ok_or(short(at + policy_len))?;
    if at + policy_len != p.len() {
        return Err(PageError::Garbage("bytes after the policy"));
    }
    if unix_time_ns < MIN_UNIX_TIME_NS {
        return Err(PageError::Clock(unix_time_ns));
    }
    let policy = if policy_len == 0 {
        None
    } else {
        let p: GuestPolicy =
            serde_json::from_slice(policy_bytes).map_err(|e| PageError::Policy(e.to_string()))?;
        p.validate().map_err(PageError::Policy)?;
        Some(p)
    };
    Ok(Delivery {
        grant: RestoreGrant {
            secret,
            entropy,
            policy,
        },
        unix_time_ns,
    })
}

#[cfg(test)]
mod tests;
