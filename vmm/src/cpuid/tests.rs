//! Normalisation of captured leaf tables: an AMD one (KVM_GET_SUPPORTED_CPUID and the host's
//! `cpuid` on an AMD EPYC host, 2026-11-29) and an Intel one (a Xeon's leaves as KVM reports
//! them: Cascade Lake caches and topology, a host brand string with a frequency, plus leaf
//! 0x1f as Sapphire Rapids has it).

use std::collections::HashMap;

use super::*;

type Row = (u32, u32, u32, Regs); // leaf, subleaf, flags, registers

/// KVM_GET_SUPPORTED_CPUID on the AMD EPYC host (leaves whose registers are all zero and that
/// nothing below reads are left out).
const AMD_SUPPORTED: &[Row] = &[
    (
        0x0000_0000,
        0,
        0,
        [0x0000_001c, 0x6874_7541, 0x444d_4163, 0x6974_6e65],
    ),
    (
        0x0000_0001,
        0,
        0,
        [0x00a1_0f11, 0x0002_0800, 0x8120_2000, 0x078b_fbff],
    ),
    (0x0000_0004, 0, 1, [0, 0, 0, 0]),
    (0x0000_0006, 0, 0, [0x0000_0004, 0, 0, 0]),
    (
        0x0000_0007,
        0,
        1,
        [0x0000_0001, 0x0180_0002, 0x0000_0104, 0x2000_0000],
    ),
    (0x0000_0007, 1, 1, [0, 0, 0, 0]),
    (0x0000_000a, 0, 0, [0, 0, 0, 0]),
    (0x0000_000b, 0, 1, [0, 0, 0, 0]),
    (
        0x0000_000d,
        0,
        1,
        [0x0000_00e7, 0x0000_0980, 0x0000_0980, 0],
    ),
    (
        0x8000_0000,
        0,
        0,
        [0x8000_0021, 0x6874_7541, 0x444d_4163, 0x6974_6e65],
    ),
    (
        0x8000_0001,
        0,
        0,
        [0x00a1_0f11, 0x4000_0000, 0x0040_0393, 0x23d3_fbff],
    ),
    (0x8000_0002, 0, 0, [0, 0, 0, 0]),
    (0x8000_0003, 0, 0, [0, 0, 0, 0]),
    (0x8000_0004, 0, 0, [0, 0, 0, 0]),
    (
        0x8000_0005,
        0,
        0,
        [0xff48_ff40, 0xff48_ff40, 0x2008_0140, 0x2008_0140],
    ),
    (
        0x8000_0006,
        0,
        0,
        [0x5c00_2200, 0x6c00_4200, 0x0400_6140, 0x0a00_9140],
    ),
    (
        0x8000_0008,
        0,
        0,
        [0x0000_3030, 0x5002_0005, 0x0000_7001, 0],
    ),
    (
        0x8000_001d,
        0,
        1,
        [0x0000_0121, 0x01c0_003f, 0x0000_003f, 0],
    ),
    (
        0x8000_001d,
        1,
        1,
        [0x0000_0122, 0x01c0_003f, 0x0000_003f, 0],
    ),
    (
        0x8000_001d,
        2,
        1,
        [0x0000_0143, 0x01c0_003f, 0x0000_07ff, 0x0000_0002],
    ),
    (
        0x8000_001d,
        3,
        1,
        [0x0000_4163, 0x03c0_003f, 0x0000_7fff, 0x0000_0001],
    ),
    (0x8000_001d, 4, 1, [0, 0, 0, 0]),
    (0x8000_001e, 0, 0, [0, 0, 0, 0]),
    (
        0x4000_0000,
        0,
        0,
        [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x0000_004d],
    ),
    (0x4000_0001, 0, 0, [0x0100_7efb, 0, 0, 0]),
];

/// The same host's `cpuid` (/dev/cpu/0/cpuid), the leaves normalisation passes through; the
/// L1 caches shared by two threads and 0x8000_001e filled in, as on an SMT host.
const AMD_HOST: &[(u32, u32, Regs)] = &[
    (
        0x0000_0000,
        0,
        [0x0000_001c, 0x6874_7541, 0x444d_4163, 0x6974_6e65],
    ),
    (0x8000_0002, 0, [0x2044_4d41, 0x4359_5045, 0, 0]),
    (
        0x8000_0005,
        0,
        [0xff48_ff40, 0xff48_ff40, 0x2008_0140, 0x2008_0140],
    ),
    (
        0x8000_0006,
        0,
        [0x5c00_2200, 0x6c00_4200, 0x0400_6140, 0x0a03_9140],
    ),
    (0x8000_001d, 0, [0x0000_4121, 0x01c0_003f, 0x0000_003f, 0]),
    (0x8000_001d, 1, [0x0000_4122, 0x01c0_003f, 0x0000_003f, 0]),
    (
        0x8000_001d,
        2,
        [0x0000_4143, 0x01c0_003f, 0x0000_07ff, 0x0000_0002],
    ),
    (
        0x8000_001d,
        3,
        [0x0003_c163, 0x03c0_003f, 0x0000_7fff, 0x0000_0001],
    ),
    (0x8000_001e, 0, [0x0000_000b, 0x0000_0105, 0x0000_0300, 0]),
];

/// An Intel Xeon's supported table (Cascade Lake leaves, with 0x1f added).
const INTEL_SUPPORTED: &[Row] = &[
    (
        0x0000_0000,
        0,
        0,
        [0x0000_001f, 0x756e_6547, 0x6c65_746e, 0x4965_6e69],
    ),
    (
        0x0000_0001,
        0,
        0,
        [0x0005_0657, 0x0040_0800, 0xf7fa_b223, 0x0f8b_fbff],
    ),
    (
        0x0000_0004,
        0,
        1,
        [0x1c00_4121, 0x01c0_003f, 0x0000_003f, 0],
    ),
    (
        0x0000_0004,
        1,
        1,
        [0x1c00_4122, 0x01c0_003f, 0x0000_003f, 0],
    ),
    (
        0x0000_0004,
        2,
        1,
        [0x1c00_4143, 0x03c0_003f, 0x0000_03ff, 0],
    ),
    (
        0x0000_0004,
        3,
        1,
        [0x1c03_c163, 0x0280_003f, 0x0000_cfff, 0x0000_0004],
    ),
    (0x0000_0004, 4, 1, [0, 0, 0, 0]),
    (
        0x0000_0006,
        0,
        0,
        [0x0000_0077, 0x0000_0002, 0x0000_0009, 0],
    ),
    (
        0x0000_0007,
        0,
        1,
        [0, 0xd19f_4fbb, 0x0000_082c, 0xbc00_0400],
    ),
    (0x0000_000a, 0, 0, [0x0730_0404, 0, 0, 0x0000_0603]),
    (
        0x0000_000b,
        0,
        1,
        [0x0000_0001, 0x0000_0002, 0x0000_0100, 0x0000_0021],
    ),
    (
        0x0000_000b,
        1,
        1,
        [0x0000_0006, 0x0000_0030, 0x0000_0201, 0x0000_0021],
    ),
    (0x0000_000b, 2, 1, [0, 0, 0x0000_0002, 0x0000_0021]),
    (
        0x0000_001f,
        0,
        1,
        [0x0000_0001, 0x0000_0002, 0x0000_0100, 0x0000_0021],
    ),
    (
        0x0000_001f,
        1,
        1,
        [0x0000_0007, 0x0000_0060, 0x0000_0201, 0x0000_0021],
    ),
    (
        0x0000_001f,
        2,
        1,
        [0x0000_0008, 0x0000_00c0, 0x0000_0305, 0x0000_0021],
    ),
    (0x0000_001f, 3, 1, [0, 0, 0x0000_0003, 0x0000_0021]),
    (0x8000_0000, 0, 0, [0x8000_0008, 0, 0, 0]),
    (0x8000_0001, 0, 0, [0, 0, 0x0000_0121, 0x2c10_0800]),
    (0x8000_0002, 0, 0, [0, 0, 0, 0]),
    (0x8000_0003, 0, 0, [0, 0, 0, 0]),
    (0x8000_0004, 0, 0, [0, 0, 0, 0]),
    (0x8000_0005, 0, 0, [0, 0, 0, 0]),
    (0x8000_0006, 0, 0, [0, 0, 0x0100_6040, 0]),
    (0x8000_0008, 0, 0, [0x0000_302e, 0, 0, 0]),
    (
        0x4000_0000,
        0,
        0,
        [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x0000_004d],
    ),
];

/// "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz" in leaves 0x8000_0002..=4.
fn intel_host(brand: &str) -> Vec<(u32, u32, Regs)> {
    let mut b = [0u8; 48];
    b[..brand.len()].copy_from_slice(brand.as_bytes());
    let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut v = vec![
        (0, 0, [0x1f, 0x756e_6547, 0x6c65_746e, 0x4965_6e69]),
        (0x8000_0005, 0, [0; 4]),
        (0x8000_0006, 0, [0, 0, 0x0100_6040, 0x0003_0000]),
    ];
    for (k, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
        let o = k * 16;
        v.push((leaf, 0, [w(o), w(o + 4), w(o + 8), w(o + 12)]));
    }
    v
}

struct Table(HashMap<(u32, u32), Regs>);

impl Table {
    fn new(rows: &[(u32, u32, Regs)]) -> Table {
        Table(rows.iter().map(|(l, s, r)| ((*l, *s), *r)).collect())
    }
}

impl HostCpuid for Table {
    fn query(&self, leaf: u32, subleaf: u32) -> Regs {
        self.0.get(&(leaf, subleaf)).copied().unwrap_or([0; 4])
    }
}

fn table(rows: &[Row]) -> Vec<kvm_cpuid_entry2> {
    rows.iter()
        .map(|(function, index, flags, r)| kvm_cpuid_entry2 {
            function: *function,
            index: *index,
            flags: *flags,
            eax: r[0],
            ebx: r[1],
            ecx: r[2],
            edx: r[3],
            ..Default::default()
        })
        .collect()
}

fn at(entries: &[kvm_cpuid_entry2], leaf: u32, sub: u32) -> Regs {
    regs(get(entries, leaf, sub).unwrap_or_else(|| panic!("no leaf {leaf:#x}.{sub}")))
}

fn brand(entries: &[kvm_cpuid_entry2]) -> String {
    let mut b = Vec::new();
    for leaf in 0x8000_0002u32..=0x8000_0004 {
        for r in at(entries, leaf, 0) {
            b.extend_from_slice(&r.to_le_bytes());
        }
    }
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn bit(x: u32, n: u32) -> bool {
    x & (1 << n) != 0
}

#[test]
fn vendor_neutral_leaves() {
    for (rows, host) in [
        (AMD_SUPPORTED, Table::new(AMD_HOST)),
        (
            INTEL_SUPPORTED,
            Table::new(&intel_host(
                "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz",
            )),
        ),
    ] {
        for (index, count) in [(0u8, 1u8), (2, 3)] {
            let mut t = table(rows);
            normalize(&mut t, index, count, true, &host);
            let l1 = at(&t, 1, 0);
            assert_eq!(l1[1] >> 24, u32::from(index), "initial APIC id");
            assert_eq!(field(l1[1], 16, 23), u32::from(count).next_power_of_two());
            assert_eq!(field(l1[1], 8, 15), 8, "CLFLUSH: 64 bytes");
            assert_eq!(l1[0], at(&table(rows), 1, 0)[0], "signature untouched");
            assert!(!bit(l1[2], 15), "PDCM off");
            assert!(bit(l1[2], 24), "TSC deadline");
            assert!(bit(l1[2], 31), "hypervisor");
            assert_eq!(bit(l1[3], 28), count > 1, "HTT");
            // 0xb: SMT level of one thread, core level of `count`, x2APIC id everywhere.
            let smt = at(&t, 0xb, 0);
            let core = at(&t, 0xb, 1);
            assert_eq!(smt, [0, 1, 0x100, u32::from(index)]);
            assert_eq!(core, [5, u32::from(count), 0x201, u32::from(index)]);
            assert!(t
                .iter()
                .filter(|e| e.function == 0xb)
                .all(|e| e.flags & KVM_CPUID_FLAG_SIGNIFICANT_INDEX != 0));
            // KVM's paravirt leaves stay.
            assert_eq!(at(&t, 0x4000_0000, 0), at(&table(rows), 0x4000_0000, 0));
        }
        let mut t = table(rows);
        normalize(&mut t, 0, 1, false, &host);
        assert!(!bit(at(&t, 1, 0)[2], 24), "no TSC deadline without the cap");
    }
}

#[test]
fn amd_leaves() {
    let host = Table::new(AMD_HOST);
    let mut t = table(AMD_SUPPORTED);
    normalize(&mut t, 1, 4, true, &host);
    assert_eq!(brand(&t), "AMD EPYC");
    assert!(!bit(at(&t, 7, 0)[3], 29), "ARCH_CAPABILITIES off");
    assert!(bit(at(&t, 0x8000_0001, 0)[2], 22), "TopologyExtensions");
    let l88 = at(&t, 0x8000_0008, 0);
    assert_eq!(field(l88[2], 0, 7), 3, "threads - 1");
    assert_eq!(field(l88[2], 12, 15), 7, "APIC id size");
    // Caches from the host, L1/L2 private, L3 shared by all four vCPUs.
    let caches: Vec<Regs> = (0..4).map(|s| at(&t, 0x8000_001d, s)).collect();
    assert!(get(&t, 0x8000_001d, 4).is_none(), "no null subleaf copied");
    for (sub, c) in caches.iter().enumerate() {
        let level = field(c[0], 5, 7);
        let want = if level == 3 { 3 } else { 0 };
        assert_eq!(field(c[0], 14, 25), want, "0x8000001d.{sub} sharing");
        assert_eq!(
            c[0] & 0x3fff,
            AMD_HOST[4 + sub].2[0] & 0x3fff,
            "type/level kept"
        );
        assert_eq!(c[1..], AMD_HOST[4 + sub].2[1..], "geometry from the host");
    }
    let topo = at(&t, 0x8000_001e, 0);
    assert_eq!(topo[0], 1, "extended APIC id");
    assert_eq!(field(topo[1], 0, 7), 1, "core id");
    assert_eq!(field(topo[1], 8, 15), 0, "one thread per core");
    assert_eq!(field(topo[2], 0, 10), 0, "one node");
    // L1/L2 cache leaves from the host, reserved bits cleared.
    assert_eq!(at(&t, 0x8000_0006, 0)[3], 0x0a00_9140);
    // Intel-only leaves untouched.
    assert_eq!(at(&t, 6, 0), [4, 0, 0, 0]);
    assert_eq!(at(&t, 7, 0)[1], 0x0180_0002, "leaf 7 ebx untouched on AMD");
}

#[test]
fn intel_leaves() {
    let host = Table::new(&intel_host(
        "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz",
    ));
    let mut t = table(INTEL_SUPPORTED);
    normalize(&mut t, 0, 2, true, &host);
    assert_eq!(brand(&t), "Intel(R) Xeon(R) Processor @ 2.50GHz");
    for sub in 0..4 {
        let c = at(&t, 4, sub);
        let level = field(c[0], 5, 7);
        let want = if level == 3 { 1 } else { 0 };
        assert_eq!(field(c[0], 14, 25), want, "leaf 4.{sub} sharing");
        assert_eq!(field(c[0], 26, 31), 1, "leaf 4.{sub} cores - 1");
        assert_eq!(
            c[0] & 0x3fff,
            INTEL_SUPPORTED[2 + sub as usize].3[0] & 0x3fff
        );
    }
    assert_eq!(at(&t, 4, 4), [0; 4], "null subleaf kept");
    let pm = at(&t, 6, 0);
    assert!(!bit(pm[0], 1), "turbo off");
    assert!(bit(pm[0], 2), "ARAT kept");
    assert!(!bit(pm[2], 3), "energy bias off");
    let l7 = at(&t, 7, 0);
    assert!(bit(l7[1], 6) && bit(l7[1], 13));
    assert!(!bit(l7[2], 5), "WAITPKG off");
    assert_eq!(at(&t, 0xa, 0), [0; 4], "PMU off");
    // 0x1f says what 0xb says, and nothing more.
    let b: Vec<Regs> = (0..3).map(|s| at(&t, 0xb, s)).collect();
    let f: Vec<Regs> = (0..3).map(|s| at(&t, 0x1f, s)).collect();
    assert_eq!(b, f);
    assert!(get(&t, 0x1f, 3).is_none());
    assert_eq!(b[2], [0, 0, 2, 0], "invalid level");
    assert_eq!(at(&t, 0x8000_0006, 0)[3], 0, "reserved bits cleared");
    assert_eq!(
        at(&t, 0x8000_0001, 0),
        at(&table(INTEL_SUPPORTED), 0x8000_0001, 0)
    );
}

#[test]
fn intel_brand_without_a_frequency() {
    for host_brand in [
        "Intel(R) Xeon(R) Platinum 8480+",
        "",
        "Genuine Intel(R) CPU 0000 @ GHz",
    ] {
        let mut t = table(INTEL_SUPPORTED);
        normalize(&mut t, 0, 1, false, &Table::new(&intel_host(host_brand)));
        assert_eq!(brand(&t), "Intel(R) Xeon(R) Processor", "{host_brand:?}");
    }
    let mut t = table(INTEL_SUPPORTED);
    normalize(
        &mut t,
        0,
        1,
        false,
        &Table::new(&intel_host("Xeon CPU @ 3.0THz ")),
    );
    assert_eq!(brand(&t), "Intel(R) Xeon(R) Processor @ 3.0THz");
}

#[test]
fn other_vendors_get_only_the_neutral_rules() {
    let mut rows = INTEL_SUPPORTED.to_vec();
    rows[0].3 = [0x1f, 0x6f67_7948, 0x656e_6975, 0x6e65_476e]; // "HygonGenuine"
    let mut t = table(&rows);
    normalize(&mut t, 0, 1, true, &Table::new(AMD_HOST));
    assert_eq!(at(&t, 0xa, 0), INTEL_SUPPORTED[9].3, "leaf 0xa untouched");
    assert_eq!(
        at(&t, 0x8000_0006, 0),
        [0, 0, 0x0100_6040, 0],
        "no passthrough"
    );
    assert!(bit(at(&t, 1, 0)[2], 31));
}

#[test]
fn a_host_of_another_vendor_is_not_passed_through() {
    // An AMD table while `cpuid` says Intel (a migrated or emulated host): KVM's values stay.
    let host = Table::new(&intel_host("Intel(R) Xeon(R) CPU @ 2.00GHz"));
    let mut t = table(AMD_SUPPORTED);
    normalize(&mut t, 0, 2, true, &host);
    assert_eq!(at(&t, 0x8000_001d, 3)[1], 0x03c0_003f);
    assert_eq!(
        field(at(&t, 0x8000_001d, 3)[0], 14, 25),
        1,
        "L3 shared by both"
    );
    assert_eq!(at(&t, 0x8000_0005, 0), AMD_SUPPORTED[14].3);
    assert_eq!(brand(&t), "AMD EPYC");
}

#[test]
fn a_full_table_gets_no_new_entries() {
    let mut t = table(AMD_SUPPORTED);
    t.retain(|e| e.function != 0x8000_001e);
    let mut n = 0;
    while t.len() < KVM_MAX_CPUID_ENTRIES {
        t.push(table(&[(0x4000_0100 + n, 0, 0, [0; 4])])[0]);
        n += 1;
    }
    normalize(&mut t, 0, 1, true, &Table::new(AMD_HOST));
    assert!(t.len() <= KVM_MAX_CPUID_ENTRIES);
    assert!(get(&t, 0xb, 1).is_none(), "0xb.1 not added to a full table");
    assert!(get(&t, 0x8000_001e, 0).is_none());
    assert!(CpuId::from_entries(&t).is_ok());
}

#[test]
fn field_helpers() {
    let mut x = 0xffff_ffff;
    set_field(&mut x, 14, 25, 0);
    assert_eq!(x, 0xfc00_3fff);
    set_field(&mut x, 14, 25, 0x1_0000); // saturates at the field's width
    assert_eq!(field(x, 14, 25), 0xfff);
    set_field(&mut x, 0, 31, 7);
    assert_eq!(x, 7);
    set_bit(&mut x, 31, true);
    assert_eq!(x, 0x8000_0007);
}

#[test]
fn for_vcpu_builds_a_kvm_table() {
    let supported = CpuId::from_entries(&table(AMD_SUPPORTED)).unwrap();
    let c = for_vcpu(&supported, 1, 2, true).unwrap();
    let l1 = at(c.as_slice(), 1, 0);
    assert_eq!(l1[1] >> 24, 1);
    assert!(bit(l1[2], 31) && bit(l1[3], 28));
}
