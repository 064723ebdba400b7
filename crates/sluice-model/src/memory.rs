//! How much memory this process can still take, for refusing an allocation
//! that cannot fit before making it.
//!
//! Why a pre-check and not only a fallible allocation: with Linux's memory
//! overcommit a huge allocation usually "succeeds" (the pages are only
//! reserved), and the process is killed later, when a step first writes
//! them. So before the KV cache is allocated, its size is compared with:
//! - `MemAvailable` of `/proc/meminfo` (what the kernel estimates can be
//!   allocated without swapping, page cache it can drop included);
//! - when the process runs in a memory-limited cgroup, that limit minus the
//!   cgroup's current usage, at its own level and every ancestor's (v2:
//!   `memory.max` − `memory.current`; v1: `memory.limit_in_bytes` −
//!   `memory.usage_in_bytes`). Usage counts page cache too, so its
//!   reclaimable part (`inactive_file`) is not counted as used: after
//!   reading a large model file the cgroup would otherwise look full.
//!
//! whichever is smaller. Elsewhere (not Linux, or nothing readable) there is
//! no estimate and callers skip the pre-check; the allocation itself stays
//! fallible.

use std::path::{Path, PathBuf};

/// Bytes this process can still allocate, if the system says.
pub fn available_bytes() -> Option<u64> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_available(&t));
    let cgroup = cgroup_available();
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A `memory.stat` entry.
fn stat(dir: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The room left under the tightest cgroup limit, if any limit is set.
fn cgroup_available() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut best: Option<u64> = None;
    let mut consider = |room: Option<u64>| {
        if let Some(r) = room {
            best = Some(best.map_or(r, |b| b.min(r)));
        }
    };
    for line in cgroups.lines() {
        // "hierarchy-id:controllers:path"; v2 is "0::path".
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            for dir in levels(Path::new("/sys/fs/cgroup"), path) {
                consider(v2_room(&dir));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            // v1's hierarchical limit already covers the ancestors; the
            // mount root is a fallback for a namespaced path that does not
            // resolve.
            for dir in [
                Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                PathBuf::from("/sys/fs/cgroup/memory"),
            ] {
                if let Some(room) = v1_room(&dir) {
                    consider(Some(room));
                    break;
                }
            }
        }
    }
    best
}

/// `root/path` and each of its ancestors down to `root` itself.
fn levels(root: &Path, path: &str) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut dir = root.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
        dir.push(part);
        dirs.push(dir.clone());
    }
    dirs
}

fn v2_room(dir: &Path) -> Option<u64> {
    // "max" (no limit) does not parse: no room figure from this level.
    let max = read_u64(&dir.join("memory.max"))?;
    let current = read_u64(&dir.join("memory.current"))?;
    let reclaimable = stat(dir, "inactive_file").unwrap_or(0);
    Some(max.saturating_sub(current.saturating_sub(reclaimable)))
}

fn v1_room(dir: &Path) -> Option<u64> {
    let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
    let limit = stat(dir, "hierarchical_memory_limit")
        .or_else(|| read_u64(&dir.join("memory.limit_in_bytes")))?;
    // v1 writes "no limit" as a huge page-aligned number near 2^63.
    if limit >= 1 << 62 {
        return None;
    }
    let reclaimable = stat(dir, "total_inactive_file")
        .or_else(|| stat(dir, "inactive_file"))
        .unwrap_or(0);
    Some(limit.saturating_sub(usage.saturating_sub(reclaimable)))
}

/// `bytes` for people: "100 GiB", "21.3 GiB", "512 B".
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23958252 kB\n";
        assert_eq!(mem_available(text), Some(23958252 * 1024));
        assert_eq!(mem_available("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(format_bytes(100 << 30), "100 GiB");
        assert_eq!(format_bytes(22_870_000_000), "21.3 GiB");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(u64::MAX), "16 EiB");
    }

    #[test]
    fn cgroup_levels_walk_from_the_root() {
        let dirs = levels(Path::new("/sys/fs/cgroup"), "/a/b");
        assert_eq!(
            dirs,
            ["/sys/fs/cgroup", "/sys/fs/cgroup/a", "/sys/fs/cgroup/a/b"]
                .map(PathBuf::from)
                .to_vec()
        );
        assert_eq!(levels(Path::new("/r"), "/").len(), 1);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_has_an_estimate() {
        let avail = available_bytes().expect("MemAvailable on Linux");
        assert!(avail > 0);
    }
}
