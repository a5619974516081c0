//! [`Raw`]: a KVM state struct serialized as exactly its bytes (lower-case hex).
//!
//! kvm-bindings' `serde` feature derives zerocopy's `IntoBytes`/`FromBytes` for the KVM state
//! structs. Its own `Deserialize` silently zero-pads or truncates input of the wrong length;
//! snapshot files are untrusted, so [`Raw`] instead refuses anything but the exact size.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A plain-old-data KVM struct, serialized as a hex string of exactly `size_of::<T>()` bytes.
#[derive(Clone, Copy)]
pub struct Raw<T>(pub T);

impl<T> fmt::Debug for Raw<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Raw<{}>({} bytes)",
            std::any::type_name::<T>(),
            std::mem::size_of::<T>()
        )
    }
}

impl<T: IntoBytes + Immutable> PartialEq for Raw<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_bytes() == other.0.as_bytes()
    }
}

impl<T: IntoBytes + Immutable> Eq for Raw<T> {}

impl<T: IntoBytes + Immutable> Serialize for Raw<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::persist::format::hex(self.0.as_bytes()))
    }
}

struct RawVisitor<T>(PhantomData<T>);

impl<T: FromBytes> Visitor<'_> for RawVisitor<T> {
    type Value = Raw<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a hex string of {} bytes", std::mem::size_of::<T>())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw<T>, E> {
        let want = std::mem::size_of::<T>();
        if v.len() != want * 2 {
            return Err(E::custom(format!(
                "{} hex digits, expected {}",
                v.len(),
                want * 2
            )));
        }
        let bytes = unhex(v).ok_or_else(|| E::custom("invalid hex digit"))?;
        T::read_from_bytes(&bytes)
            .map(Raw)
            .map_err(|_| E::custom("wrong length"))
    }
}

impl<'de, T: FromBytes> Deserialize<'de> for Raw<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(RawVisitor(PhantomData))
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| match p {
            [h, l] => Some(nib(*h)? << 4 | nib(*l)?),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::{kvm_regs, kvm_xsave};

    #[test]
    fn round_trip_exact() {
        let regs = kvm_regs {
            rip: 0xffff_ffff_8100_0000,
            rax: 7,
            ..Default::default()
        };
        let json = serde_json::to_string(&Raw(regs)).unwrap();
        assert_eq!(json.len(), 2 + 2 * std::mem::size_of::<kvm_regs>());
        let back: Raw<kvm_regs> = serde_json::from_str(&json).unwrap();
        assert_eq!(back.0.rip, regs.rip);
        assert_eq!(back.0.rax, 7);
        assert_eq!(back, Raw(regs));
    }

    #[test]
    fn wrong_length_or_digits_are_refused() {
        let good = serde_json::to_string(&Raw(kvm_regs::default())).unwrap();
        let short = format!("\"{}\"", &good[1..good.len() - 3]);
        assert!(serde_json::from_str::<Raw<kvm_regs>>(&short).is_err());
        let long = format!("\"{}00\"", &good[1..good.len() - 1]);
        assert!(serde_json::from_str::<Raw<kvm_regs>>(&long).is_err());
        let bad = good.replacen('0', "g", 1);
        assert!(serde_json::from_str::<Raw<kvm_regs>>(&bad).is_err());
        // A regs blob is not an xsave blob.
        assert!(serde_json::from_str::<Raw<kvm_xsave>>(&good).is_err());
        assert!(serde_json::from_str::<Raw<kvm_regs>>("[1,2,3]").is_err());
        assert!(serde_json::from_str::<Raw<kvm_regs>>("\"é\"").is_err());
    }
}
