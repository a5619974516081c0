//! GDT entries and the matching KVM segment registers for 64-bit entry.

use kvm_bindings::kvm_segment;

/// Builds a GDT descriptor from flags (access byte + flags nibble), base and limit.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((u64::from(base) & 0xff00_0000) << (56 - 24))
        | ((u64::from(flags) & 0x0000_f0ff) << 40)
        | ((u64::from(limit) & 0x000f_0000) << (48 - 16))
        | ((u64::from(base) & 0x00ff_ffff) << 16)
        | (u64::from(limit) & 0x0000_ffff)
}

fn base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

fn limit(entry: u64) -> u32 {
    // The masks keep the value within 20 bits, so the truncation is exact.
    let raw = (((entry & 0x000f_0000_0000_0000) >> 32) | (entry & 0xffff)) as u32;
    if bit(entry, 55) == 0 {
        raw
    } else {
        (raw << 12) | 0xfff
    }
}

fn bit(entry: u64, n: u32) -> u8 {
    ((entry >> n) & 1) as u8
}

/// The 64-bit boot GDT: null, code, data, TSS (as the Linux boot protocol expects:
/// `__BOOT_CS` = 0x08, `__BOOT_DS` = 0x10).
pub fn boot_gdt() -> [u64; 4] {
    [
        gdt_entry(0, 0, 0),
        gdt_entry(0xa09b, 0, 0xfffff),
        gdt_entry(0xc093, 0, 0xfffff),
        gdt_entry(0x808b, 0, 0xfffff),
    ]
}

/// Converts a GDT entry at `index` into a KVM segment register.
pub fn segment_from_gdt(entry: u64, index: u8) -> kvm_segment {
    let present = bit(entry, 47);
    kvm_segment {
        base: base(entry),
        limit: limit(entry),
        selector: u16::from(index) * 8,
        type_: ((entry >> 40) & 0xf) as u8,
        present,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: bit(entry, 54),
        s: bit(entry, 44),
        l: bit(entry, 53),
        g: bit(entry, 55),
        avl: bit(entry, 52),
        padding: 0,
        unusable: u8::from(present == 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_segment_is_long_mode() {
        let gdt = boot_gdt();
        let cs = segment_from_gdt(gdt[1], 1);
        assert_eq!(cs.selector, 0x08);
        assert_eq!(cs.l, 1);
        assert_eq!(cs.db, 0);
        assert_eq!(cs.present, 1);
        assert_eq!(cs.type_, 0xb);
        assert_eq!(cs.limit, 0xffff_ffff);
        assert_eq!(cs.base, 0);
        let ds = segment_from_gdt(gdt[2], 2);
        assert_eq!(ds.selector, 0x10);
        assert_eq!(ds.db, 1);
        assert_eq!(ds.type_, 0x3);
        let null = segment_from_gdt(gdt[0], 0);
        assert_eq!(null.unusable, 1);
    }

    #[test]
    fn entry_roundtrip() {
        let e = gdt_entry(0x808b, 0x1234_5678, 0xabcde);
        assert_eq!(base(e), 0x1234_5678);
        assert_eq!(limit(e), (0xabcde << 12) | 0xfff);
    }
}
