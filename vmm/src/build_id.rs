//! The build id: one string that `voidbox` (which links this crate for its `voidbox __vmm`
//! mode) and the standalone `voidbox-vmm` both carry, computed by `vmm/build.rs` over the
//! VMM's sources. Equal ids mean the same VMM code, so the same config, status, control and
//! snapshot formats. The engine reads a `voidbox-vmm`'s id from its ELF section
//! [`SECTION`] ([`read_from_file`], nothing is executed) and refuses one from another build.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// This build's id: `<crate version>-<16 hex digits of the sources' hash>`.
pub const BUILD_ID: &str = env!("VOIDBOX_BUILD_ID");

/// The ELF section holding [`BUILD_ID`] in every binary that links this crate.
pub const SECTION: &str = ".voidbox_build_id";

const fn bytes<const N: usize>(s: &str) -> [u8; N] {
    let b = s.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = b[i];
        i += 1;
    }
    out
}

#[used]
#[link_section = ".voidbox_build_id"]
static EMBEDDED: [u8; BUILD_ID.len()] = bytes(BUILD_ID);

/// This build's id ([`BUILD_ID`]); calling it also keeps the id's ELF section in the binary.
pub fn build_id() -> &'static str {
    std::hint::black_box(&EMBEDDED);
    BUILD_ID
}

/// Longest id accepted from a file.
const MAX_ID: u64 = 256;
/// Most section headers read (a Rust binary has about 40).
const MAX_SECTIONS: u64 = 4096;
/// Largest section-name table read.
const MAX_SHSTRTAB: u64 = 1 << 20;

/// The build id in the ELF file at `path`: `Ok(None)` when it has no [`SECTION`] (a build from
/// before the same-build check, or not a voidbox binary at all); `Err` when the file cannot be
/// read or is not a 64-bit little-endian ELF file.
pub fn read_from_file(path: &Path) -> Result<Option<String>, String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: not a 64-bit ELF executable ({what})", path.display());
    let read = |off: u64, len: u64| -> Result<Vec<u8>, String> {
        let len = usize::try_from(len).map_err(|_| bad("size"))?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off)
            .map_err(|_| bad("truncated"))?;
        Ok(buf)
    };
    let eh = read(0, 64)?;
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return Err(bad("header"));
    }
    let u16_at = |b: &[u8], o: usize| u64::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let u32_at =
        |b: &[u8], o: usize| u64::from(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]));
    let u64_at = |b: &[u8], o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(&eh, 0x28),
        u16_at(&eh, 0x3a),
        u16_at(&eh, 0x3c),
        u16_at(&eh, 0x3e),
    );
    if shnum == 0 {
        return Ok(None);
    }
    if shentsize != 64 || shnum > MAX_SECTIONS || shstrndx >= shnum {
        return Err(bad("section headers"));
    }
    let sh = read(shoff, shnum * 64)?;
    let header = |i: u64| &sh[(i * 64) as usize..(i * 64 + 64) as usize];
    let strtab_h = header(shstrndx);
    let strtab_size = u64_at(strtab_h, 0x20);
    if strtab_size > MAX_SHSTRTAB {
        return Err(bad("section names"));
    }
    let strtab = read(u64_at(strtab_h, 0x18), strtab_size)?;
    for i in 0..shnum {
        let h = header(i);
        let name_at = u32_at(h, 0) as usize;
        let name = strtab
            .get(name_at..)
            .and_then(|s| s.split(|b| *b == 0).next())
            .unwrap_or_default();
        if name != SECTION.as_bytes() {
            continue;
        }
        let size = u64_at(h, 0x20);
        if size == 0 || size > MAX_ID || u32_at(h, 4) == 8 {
            return Err(bad("build id section"));
        }
        let id = read(u64_at(h, 0x18), size)?;
        let id = String::from_utf8(id)
            .ok()
            .filter(|s| s.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| bad("build id"))?;
        return Ok(Some(id));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_binary_carries_its_id() {
        assert!(build_id().starts_with(env!("CARGO_PKG_VERSION")));
        let exe = std::env::current_exe().unwrap();
        assert_eq!(read_from_file(&exe).unwrap().as_deref(), Some(BUILD_ID));
    }

    #[test]
    fn files_without_an_id() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("script");
        std::fs::write(&text, "#!/bin/sh\nexit 0\n").unwrap();
        assert!(read_from_file(&text)
            .unwrap_err()
            .contains("not a 64-bit ELF"));
        assert!(read_from_file(&dir.path().join("absent")).is_err());
        // A real ELF binary from another program: no section.
        assert_eq!(read_from_file(Path::new("/bin/sh")).unwrap(), None);
        // Truncated ELF: an error, not a panic.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let cut = dir.path().join("cut");
        std::fs::write(&cut, &exe[..4096]).unwrap();
        assert!(read_from_file(&cut).is_err());
    }
}
