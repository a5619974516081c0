//! The guest's CPUID: KVM_GET_SUPPORTED_CPUID normalised for one vCPU of a small single-socket
//! machine, the way Firecracker normalises it (its `cpu_config/x86_64/cpuid/normalize.rs` and
//! the Intel and AMD variants; this is our own code following the same rules).
//!
//! KVM's supported table is the host's CPUID filtered to what KVM can virtualise; it still
//! describes the host's package (its core count, its cache sharing, its APIC-id layout, its
//! power management and PMU). A guest kernel that believes it probes, calibrates and sizes
//! per-CPU structures for hardware it does not have. Normalising means:
//! - every vendor: leaf 0 vendor from the host; leaf 1 APIC id, logical CPU count, CLFLUSH
//!   line size, PDCM off, hypervisor bit on, TSC-deadline timer when KVM emulates it, HTT when
//!   there is more than one vCPU; leaf 0xb extended topology (one thread per core, all cores in
//!   one package); leaves 0x8000_0005/6 (L1/L2 cache and TLB) passed through from the host;
//! - Intel: leaf 4 cache sharing, leaf 6 turbo and energy-bias off, leaf 7 FDP_EXCPTN_ONLY and
//!   FPU CS/DS deprecation on and WAITPKG off, leaf 0xa (architectural PMU) cleared, leaf 0x1f
//!   mirrored from 0xb, brand string "Intel(R) Xeon(R) Processor @ <host frequency>";
//! - AMD: leaves 0x8000_001d/1e (cache and core topology) from the host with the sharing and
//!   ids rewritten, TopologyExtensions on, ARCH_CAPABILITIES off, leaf 0x8000_0008 thread
//!   count, brand string "AMD EPYC".
//!
//! A missing leaf is left missing (the table differs by host and KVM version); nothing here
//! fails. On a host whose KVM interprets guest kernel mode (the compat profile's), the guest
//! reads the host's CPUID whatever is set here; see `shared/notes/kvm-host.md`.

use kvm_bindings::{
    kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX as KVM_CPUID_FLAG_SIGNIFICANT_INDEX,
    KVM_MAX_CPUID_ENTRIES,
};

use crate::config::MAX_VCPUS;

/// The four registers of one CPUID answer: eax, ebx, ecx, edx.
pub type Regs = [u32; 4];

/// Where host CPUID answers come from: the `cpuid` instruction ([`NativeCpuid`]), or a
/// captured table in tests.
pub trait HostCpuid {
    /// The host's answer to `cpuid(leaf, subleaf)`.
    fn query(&self, leaf: u32, subleaf: u32) -> Regs;
}

/// The `cpuid` instruction of the CPU this process runs on.
pub struct NativeCpuid;

impl HostCpuid for NativeCpuid {
    #[cfg(target_arch = "x86_64")]
    fn query(&self, leaf: u32, subleaf: u32) -> Regs {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86_64 CPU and only reads identification registers.
        let r = unsafe { std::arch::x86_64::__cpuid_count(leaf, subleaf) };
        [r.eax, r.ebx, r.ecx, r.edx]
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn query(&self, _leaf: u32, _subleaf: u32) -> Regs {
        [0; 4]
    }
}

/// The CPU vendor a CPUID table names in leaf 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// "GenuineIntel".
    Intel,
    /// "AuthenticAMD".
    Amd,
    /// Anything else: only the vendor-neutral rules apply.
    Other,
}

const VENDOR_INTEL: [u32; 3] = [0x756e_6547, 0x6c65_746e, 0x4965_6e69]; // ebx, ecx, edx
const VENDOR_AMD: [u32; 3] = [0x6874_7541, 0x444d_4163, 0x6974_6e65];

impl Vendor {
    /// The vendor of leaf 0's registers.
    pub fn of_leaf0(r: Regs) -> Vendor {
        match [r[1], r[2], r[3]] {
            VENDOR_INTEL => Vendor::Intel,
            VENDOR_AMD => Vendor::Amd,
            _ => Vendor::Other,
        }
    }
}

/// The brand string Intel guests see when the host's names no frequency.
const INTEL_BRAND: &str = "Intel(R) Xeon(R) Processor";
/// The brand string AMD guests see.
const AMD_BRAND: &str = "AMD EPYC";
/// Bytes in the brand string (leaves 0x8000_0002..=0x8000_0004, 16 bytes each).
const BRAND_LEN: usize = 48;

/// The CPUID of vCPU `index` of `count`: the supported table normalised (see the module
/// documentation) with the host's own `cpuid` instruction for passed-through leaves.
/// `tsc_deadline`: KVM emulates the TSC-deadline timer (`KVM_CAP_TSC_DEADLINE_TIMER`).
pub fn for_vcpu(
    supported: &CpuId,
    index: u8,
    count: u8,
    tsc_deadline: bool,
) -> Result<CpuId, String> {
    let mut entries = supported.as_slice().to_vec();
    normalize(&mut entries, index, count, tsc_deadline, &NativeCpuid);
    CpuId::from_entries(&entries).map_err(|e| format!("{} CPUID entries: {e:?}", entries.len()))
}

/// Normalises `entries` (a KVM_GET_SUPPORTED_CPUID table) for vCPU `index` of `count` in place.
pub fn normalize(
    entries: &mut Vec<kvm_cpuid_entry2>,
    index: u8,
    count: u8,
    tsc_deadline: bool,
    host: &dyn HostCpuid,
) {
    let count = count.clamp(1, MAX_VCPUS);
    let vendor = get(entries, 0, 0).map_or(Vendor::Other, |e| Vendor::of_leaf0(regs(e)));
    let host_vendor = Vendor::of_leaf0(host.query(0, 0));
    let same_host = vendor != Vendor::Other && vendor == host_vendor;

    if let Some(e) = get_mut(entries, 0, 0) {
        if same_host {
            let h = host.query(0, 0);
            (e.ebx, e.ecx, e.edx) = (h[1], h[2], h[3]);
        }
    }
    leaf1(entries, index, count, tsc_deadline);
    extended_topology(entries, 0xb, index, count);
    if same_host {
        for leaf in [0x8000_0005, 0x8000_0006] {
            if let Some(e) = get_mut(entries, leaf, 0) {
                set_regs(e, host.query(leaf, 0));
                if leaf == 0x8000_0006 {
                    e.edx &= !0x0003_0000; // reserved bits 17:16
                }
            }
        }
    }
    match vendor {
        Vendor::Intel => intel(entries, count, host, same_host),
        Vendor::Amd => amd(entries, index, count, host, same_host),
        Vendor::Other => {}
    }
}

/// Leaf 1: APIC id, logical CPUs per package, CLFLUSH size, PDCM, TSC deadline, hypervisor,
/// HTT.
fn leaf1(entries: &mut [kvm_cpuid_entry2], index: u8, count: u8, tsc_deadline: bool) {
    let Some(e) = get_mut(entries, 1, 0) else {
        return;
    };
    set_field(&mut e.ebx, 8, 15, 8); // CLFLUSH line size, in 8-byte units: 64 bytes
    set_field(&mut e.ebx, 16, 23, u32::from(count).next_power_of_two());
    set_field(&mut e.ebx, 24, 31, u32::from(index));
    set_bit(&mut e.ecx, 15, false); // PDCM: no IA32_PERF_CAPABILITIES
    set_bit(&mut e.ecx, 24, tsc_deadline);
    set_bit(&mut e.ecx, 31, true); // running under a hypervisor
    set_bit(&mut e.edx, 28, count > 1); // HTT: more than one logical CPU in the package
}

/// Leaf 0xb (and 0x1f, given as `leaf`): level 0 is the SMT level (one thread per core),
/// level 1 the core level (all vCPUs in one package), later levels invalid; edx is the x2APIC
/// id everywhere.
fn extended_topology(entries: &mut Vec<kvm_cpuid_entry2>, leaf: u32, index: u8, count: u8) {
    if get(entries, leaf, 0).is_none() {
        return;
    }
    if get(entries, leaf, 1).is_none() {
        push(entries, leaf, 1, [0; 4]);
    }
    // Bits of the x2APIC id to shift away to get the package id: room for MAX_VCPUS.
    let core_shift = u32::from(MAX_VCPUS).next_power_of_two().trailing_zeros();
    for e in entries.iter_mut().filter(|e| e.function == leaf) {
        let level = e.index;
        e.flags |= KVM_CPUID_FLAG_SIGNIFICANT_INDEX;
        let (eax, ebx, ecx) = match level {
            0 => (0, 1, 1 << 8),                               // SMT: 1 thread per core
            1 => (core_shift, u32::from(count), 1 | (2 << 8)), // core: `count` per package
            n => (0, 0, n & 0xff),                             // invalid level
        };
        set_regs(e, [eax, ebx, ecx, u32::from(index)]);
    }
}

fn intel(entries: &mut Vec<kvm_cpuid_entry2>, count: u8, host: &dyn HostCpuid, same_host: bool) {
    // Leaf 4, deterministic cache parameters: L1/L2 private to the (single-thread) core, L3
    // shared by every vCPU, all cores in one package. Stops at the first null subleaf.
    let mut sub = 0;
    while let Some(e) = get_mut(entries, 4, sub) {
        if regs(e) == [0; 4] {
            break;
        }
        let sharing = match field(e.eax, 5, 7) {
            1 | 2 => Some(0),
            3 => Some(u32::from(count) - 1),
            _ => None,
        };
        if let Some(s) = sharing {
            set_field(&mut e.eax, 14, 25, s);
        }
        set_field(&mut e.eax, 26, 31, u32::from(count) - 1);
        sub += 1;
    }
    if let Some(e) = get_mut(entries, 6, 0) {
        set_bit(&mut e.eax, 1, false); // Turbo Boost
        set_bit(&mut e.ecx, 3, false); // energy-performance bias (no frequency control)
    }
    if let Some(e) = get_mut(entries, 7, 0) {
        set_bit(&mut e.ebx, 6, true); // FDP_EXCPTN_ONLY
        set_bit(&mut e.ebx, 13, true); // FPU CS and DS deprecated
        set_bit(&mut e.ecx, 5, false); // WAITPKG: no user-mode waits that idle the host core
    }
    if let Some(e) = get_mut(entries, 0xa, 0) {
        set_regs(e, [0; 4]); // no architectural PMU
    }
    // Leaf 0x1f, where present, says what 0xb says (no other domains).
    if get(entries, 0x1f, 0).is_some() {
        let topo: Vec<kvm_cpuid_entry2> = entries
            .iter()
            .filter(|e| e.function == 0xb)
            .copied()
            .collect();
        entries.retain(|e| e.function != 0x1f);
        for mut e in topo {
            e.function = 0x1f;
            entries.push(e);
        }
    }
    let host_brand = same_host.then(|| brand_of(host));
    let brand = intel_brand(host_brand.as_ref());
    set_brand(entries, &brand);
}

fn amd(
    entries: &mut Vec<kvm_cpuid_entry2>,
    index: u8,
    count: u8,
    host: &dyn HostCpuid,
    same_host: bool,
) {
    if same_host {
        // The host's cache and core topology (KVM may report none), rewritten below.
        let h = host.query(0x8000_001e, 0);
        match get_mut(entries, 0x8000_001e, 0) {
            Some(e) => set_regs(e, h),
            None => push(entries, 0x8000_001e, 0, h),
        }
        let mut caches = Vec::new();
        for sub in 0..16 {
            let r = host.query(0x8000_001d, sub);
            if r[0] & 0x1f == 0 {
                break; // cache type null: no more caches
            }
            caches.push(r);
        }
        if !caches.is_empty() {
            entries.retain(|e| e.function != 0x8000_001d);
            for (sub, r) in caches.into_iter().enumerate() {
                push(entries, 0x8000_001d, sub as u32, r);
            }
        }
    }
    if let Some(e) = get_mut(entries, 7, 0) {
        set_bit(&mut e.edx, 29, false); // no IA32_ARCH_CAPABILITIES on AMD
    }
    if let Some(e) = get_mut(entries, 0x8000_0001, 0) {
        set_bit(&mut e.ecx, 22, true); // TopologyExtensions: leaves 0x8000_001d/1e are valid
    }
    if let Some(e) = get_mut(entries, 0x8000_0008, 0) {
        set_field(&mut e.ecx, 12, 15, 7); // APIC id bits for the thread in the package
        set_field(&mut e.ecx, 0, 7, u32::from(count) - 1); // threads in the package - 1
    }
    for e in entries.iter_mut().filter(|e| e.function == 0x8000_001d) {
        e.flags |= KVM_CPUID_FLAG_SIGNIFICANT_INDEX;
        match field(e.eax, 5, 7) {
            1 | 2 => set_field(&mut e.eax, 14, 25, 0),
            3 => set_field(&mut e.eax, 14, 25, u32::from(count) - 1),
            _ => {}
        }
    }
    if let Some(e) = get_mut(entries, 0x8000_001e, 0) {
        e.eax = u32::from(index); // extended APIC id
        set_field(&mut e.ebx, 0, 7, u32::from(index)); // compute unit (core) id
        set_field(&mut e.ebx, 8, 15, 0); // one thread per compute unit
        set_field(&mut e.ecx, 8, 10, 0); // one node per package
        set_field(&mut e.ecx, 0, 7, 0); // node 0
    }
    let mut brand = [0u8; BRAND_LEN];
    brand[..AMD_BRAND.len()].copy_from_slice(AMD_BRAND.as_bytes());
    set_brand(entries, &brand);
}

/// The host's brand string (leaves 0x8000_0002..=0x8000_0004).
fn brand_of(host: &dyn HostCpuid) -> [u8; BRAND_LEN] {
    let mut b = [0u8; BRAND_LEN];
    for (i, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
        for (j, r) in host.query(leaf, 0).iter().enumerate() {
            let at = i * 16 + j * 4;
            b[at..at + 4].copy_from_slice(&r.to_le_bytes());
        }
    }
    b
}

/// "Intel(R) Xeon(R) Processor @ 2.50GHz" with the frequency the host's brand string ends
/// in ("… CPU @ 2.50GHz"), or without one when it names none.
fn intel_brand(host: Option<&[u8; BRAND_LEN]>) -> [u8; BRAND_LEN] {
    let text: String = host
        .map(|h| {
            let end = h.iter().position(|b| *b == 0).unwrap_or(BRAND_LEN);
            String::from_utf8_lossy(&h[..end]).into_owned()
        })
        .unwrap_or_default();
    let freq = text
        .trim_end()
        .rsplit_once(' ')
        .map(|(_, last)| last)
        .filter(|f| {
            ["THz", "GHz", "MHz"]
                .iter()
                .any(|u| f.strip_suffix(u).is_some_and(is_decimal))
        });
    let s = match freq {
        Some(f) => format!("{INTEL_BRAND} @ {f}"),
        None => INTEL_BRAND.to_string(),
    };
    let mut b = [0u8; BRAND_LEN];
    let n = s.len().min(BRAND_LEN - 1); // NUL-terminated
    b[..n].copy_from_slice(&s.as_bytes()[..n]);
    b
}

fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit() || c == b'.')
}

fn set_brand(entries: &mut [kvm_cpuid_entry2], brand: &[u8; BRAND_LEN]) {
    for (i, leaf) in (0x8000_0002u32..=0x8000_0004).enumerate() {
        if let Some(e) = get_mut(entries, leaf, 0) {
            let word = |j: usize| {
                let at = i * 16 + j * 4;
                u32::from_le_bytes([brand[at], brand[at + 1], brand[at + 2], brand[at + 3]])
            };
            set_regs(e, [word(0), word(1), word(2), word(3)]);
        }
    }
}

fn get(entries: &[kvm_cpuid_entry2], leaf: u32, sub: u32) -> Option<&kvm_cpuid_entry2> {
    entries
        .iter()
        .find(|e| e.function == leaf && e.index == sub)
}

fn get_mut(entries: &mut [kvm_cpuid_entry2], leaf: u32, sub: u32) -> Option<&mut kvm_cpuid_entry2> {
    entries
        .iter_mut()
        .find(|e| e.function == leaf && e.index == sub)
}

/// Adds an indexed entry, unless the table is full (KVM takes at most
/// [`KVM_MAX_CPUID_ENTRIES`]; then the leaf stays as KVM reported it).
fn push(entries: &mut Vec<kvm_cpuid_entry2>, leaf: u32, sub: u32, r: Regs) {
    if entries.len() >= KVM_MAX_CPUID_ENTRIES {
        log::warn!("CPUID table full: leaf {leaf:#x}.{sub} not added");
        return;
    }
    entries.push(kvm_cpuid_entry2 {
        function: leaf,
        index: sub,
        flags: KVM_CPUID_FLAG_SIGNIFICANT_INDEX,
        eax: r[0],
        ebx: r[1],
        ecx: r[2],
        edx: r[3],
        ..Default::default()
    });
}

fn regs(e: &kvm_cpuid_entry2) -> Regs {
    [e.eax, e.ebx, e.ecx, e.edx]
}

fn set_regs(e: &mut kvm_cpuid_entry2, r: Regs) {
    (e.eax, e.ebx, e.ecx, e.edx) = (r[0], r[1], r[2], r[3]);
}

fn mask(lo: u32, hi: u32) -> u32 {
    (u32::MAX >> (31 - hi)) & (u32::MAX << lo)
}

fn field(x: u32, lo: u32, hi: u32) -> u32 {
    (x & mask(lo, hi)) >> lo
}

/// Sets bits `lo..=hi` of `x` to `v`, saturated to the field's width.
fn set_field(x: &mut u32, lo: u32, hi: u32, v: u32) {
    let max = mask(lo, hi) >> lo;
    *x = (*x & !mask(lo, hi)) | (v.min(max) << lo);
}

fn set_bit(x: &mut u32, bit: u32, on: bool) {
    set_field(x, bit, bit, u32::from(on));
}

#[cfg(test)]
mod tests;
