//! CPU time of this process (user + system), from `getrusage(RUSAGE_SELF)`.

/// User + system CPU seconds this process has used so far (all threads).
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        tv(usage.ru_utime) + tv(usage.ru_stime)
    }
}

/// The machine-readable line a scheduler or server prints on stdout just before it exits,
/// e.g. `pushpull-server cpu_seconds 1.234`.
pub fn cpu_line(program: &str) -> String {
    format!("{program} cpu_seconds {:.3}", process_cpu_seconds())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows() {
        let a = super::process_cpu_seconds();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(super::process_cpu_seconds() >= a);
    }
}
