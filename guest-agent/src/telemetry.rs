//! Guest resource statistics from `/proc`, and the facts reported in the handshake.

use voidbox_protocol::{GuestInfo, RequestId, Telemetry};

/// Collects a telemetry snapshot. Missing `/proc` files leave their fields at zero.
pub fn snapshot(id: RequestId) -> Telemetry {
    let mut t = Telemetry {
        id,
        active_execs: crate::exec::active_count(),
        ..Default::default()
    };
    if let Ok(s) = std::fs::read_to_string("/proc/uptime") {
        if let Some(up) = s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            t.uptime_ms = (up * 1000.0) as u64;
        }
    }
    if let Ok(s) = std::fs::read_to_string("/proc/stat") {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let to_ms = |ticks: u64| ticks.saturating_mul(1000) / hz;
        if let Some(line) = s.lines().find(|l| l.starts_with("cpu ")) {
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            let get = |i: usize| v.get(i).copied().unwrap_or(0);
            // user nice system idle iowait irq softirq steal
            t.cpu_user_ms = to_ms(get(0) + get(1));
            t.cpu_system_ms = to_ms(get(2) + get(5) + get(6));
            t.cpu_idle_ms = to_ms(get(3) + get(4));
        }
    }
    if let Ok(s) = std::fs::read_to_string("/proc/meminfo") {
        t.mem_total_kb = meminfo_field(&s, "MemTotal:").unwrap_or(0);
        t.mem_available_kb = meminfo_field(&s, "MemAvailable:")
            .or_else(|| meminfo_field(&s, "MemFree:"))
            .unwrap_or(0);
    }
    if let Ok(s) = std::fs::read_to_string("/proc/loadavg") {
        let f: Vec<&str> = s.split_whitespace().collect();
        for (i, slot) in t.load_avg_milli.iter_mut().enumerate() {
            *slot = f
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0, |l| (l * 1000.0) as u32);
        }
        // "running/total" — total scheduling entities (threads), a good-enough process count
        // that costs one read instead of a /proc walk.
        t.processes = f
            .get(3)
            .and_then(|v| v.split_once('/'))
            .and_then(|(_, total)| total.parse().ok())
            .unwrap_or(0);
    }
    t
}

fn meminfo_field(s: &str, key: &str) -> Option<u64> {
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l[key.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Facts about the guest for the handshake's Pong.
pub fn guest_info() -> GuestInfo {
    // SAFETY: utsname is plain data filled by uname.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is valid writable memory of the right type.
    let ok = unsafe { libc::uname(&mut u) } == 0;
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| meminfo_field(&s, "MemTotal:"));
    GuestInfo {
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: ok.then(|| field(&u.release)),
        arch: ok.then(|| field(&u.machine)),
        cpus: u32::try_from(cpus).ok().filter(|&c| c > 0),
        mem_total_kb: mem,
        capabilities: [
            "exec",
            "stdin_stream",
            "exec_signal",
            "files",
            "pty",
            "telemetry",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn snapshot_reads_proc() {
        let t = super::snapshot(voidbox_protocol::RequestId(7));
        assert!(
            t.mem_total_kb > 0 && t.uptime_ms > 0 && t.processes > 0,
            "{t:?}"
        );
        let info = super::guest_info();
        assert!(info.kernel.is_some() && info.cpus.is_some());
    }
}
