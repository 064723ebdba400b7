//! prometheus_client's process collector (`process_*`), from `/proc` on
//! Linux; nothing elsewhere. Its `python_*` collectors describe a Python
//! interpreter and have no counterpart in a Rust process.

use super::Exposition;

#[cfg(target_os = "linux")]
pub fn render(w: &mut Exposition) {
    let (page_size, ticks) = linux::auxv_page_size_and_ticks();
    if let Some(st) = linux::read_stat(page_size, ticks) {
        w.gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            &[(&[], st.virtual_memory_bytes)],
        );
        w.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            &[(&[], st.resident_memory_bytes)],
        );
        w.gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            &[(&[], st.start_time_seconds)],
        );
        // A counter without `_created`, as prometheus_client's.
        w.header(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
        );
        w.sample("process_cpu_seconds_total", &[], st.cpu_seconds);
    }
    if let Some((open, max)) = linux::fds() {
        w.gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            &[(&[], open)],
        );
        w.gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            &[(&[], max)],
        );
    }
}

#[cfg(not(target_os = "linux"))]
pub fn render(_w: &mut Exposition) {}

#[cfg(target_os = "linux")]
mod linux {
    pub struct Stat {
        pub virtual_memory_bytes: f64,
        pub resident_memory_bytes: f64,
        pub start_time_seconds: f64,
        pub cpu_seconds: f64,
    }

    /// `sysconf(_SC_PAGESIZE)` and `sysconf(_SC_CLK_TCK)` without libc:
    /// the kernel hands both to every process in its auxiliary vector
    /// (`AT_PAGESZ`, `AT_CLKTCK`), which is where libc reads them.
    pub fn auxv_page_size_and_ticks() -> (f64, f64) {
        const AT_PAGESZ: usize = 6;
        const AT_CLKTCK: usize = 17;
        let (mut page, mut ticks) = (4096.0, 100.0);
        let Ok(bytes) = std::fs::read("/proc/self/auxv") else {
            return (page, ticks);
        };
        let word = std::mem::size_of::<usize>();
        for pair in bytes.chunks_exact(2 * word) {
            let read = |b: &[u8]| {
                let mut w = [0u8; std::mem::size_of::<usize>()];
                w.copy_from_slice(b);
                usize::from_ne_bytes(w)
            };
            let (key, value) = (read(&pair[..word]), read(&pair[word..]));
            match key {
                AT_PAGESZ if value > 0 => page = value as f64,
                AT_CLKTCK if value > 0 => ticks = value as f64,
                _ => {}
            }
        }
        (page, ticks)
    }

    fn boot_time() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// `/proc/self/stat` as prometheus_client reads it (the fields after
    /// the command name, which may itself contain spaces or `)`).
    pub fn read_stat(page_size: f64, ticks: f64) -> Option<Stat> {
        let btime = boot_time()?;
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (_, rest) = text.rsplit_once(')')?;
        let parts: Vec<f64> = rest
            .split_whitespace()
            .map(|p| p.parse().unwrap_or(0.0))
            .collect();
        let field = |i: usize| parts.get(i).copied();
        Some(Stat {
            virtual_memory_bytes: field(20)?,
            resident_memory_bytes: field(21)? * page_size,
            start_time_seconds: field(19)? / ticks + btime,
            cpu_seconds: (field(11)? + field(12)?) / ticks,
        })
    }

    /// Open descriptors and the soft limit on them.
    pub fn fds() -> Option<(f64, f64)> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let max = limits
            .lines()
            .find(|l| l.starts_with("Max open file"))?
            .split_whitespace()
            .nth(3)?
            .parse::<f64>()
            .ok()?;
        let open = std::fs::read_dir("/proc/self/fd").ok()?.count();
        Some((open as f64, max))
    }
}
