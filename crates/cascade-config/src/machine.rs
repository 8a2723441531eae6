//! Facts about this machine that defaults are sized from.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Where POSIX shared-memory objects live on Linux (the store's memory counts against it).
pub const SHM_DIR: &str = "/dev/shm";

/// Total RAM from /proc/meminfo, if it can be read.
pub fn mem_total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_total(&meminfo)
}

fn parse_meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut fields = line.split_whitespace().skip(1);
    let kib: u64 = fields.next()?.parse().ok()?;
    match fields.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

/// Bytes an unprivileged user can still write on the file system holding `path`. A path
/// that does not exist yet is measured at its nearest existing ancestor, which is the file
/// system it will be created on.
pub fn free_space(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; zeroed is a valid value for it.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stats a valid out-pointer.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) } != 0 {
        return None;
    }
    // The field types are u32 on some 32-bit targets.
    #[allow(clippy::useless_conversion)]
    let (blocks, block_size) = (u64::from(stats.f_bavail), u64::from(stats.f_frsize));
    blocks.checked_mul(block_size)
}

/// The calling user's id.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// This machine's host name ("localhost" if it cannot be read).
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is a valid writable buffer of the length given; gethostname writes at most
    // that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(name) if rc == 0 && !name.is_empty() => name.to_string(),
        _ => "localhost".to_string(),
    }
}

/// The calling user's login name from the password database, else the uid as a number.
pub fn user_name() -> String {
    let uid = uid();
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: passwd is plain old data; zeroed is a valid value for it.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: entry, buf (with its true length) and found are valid for the call; the strings
    // entry points to live in buf, which outlives their use below.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut entry,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || entry.pw_name.is_null() {
        return uid.to_string();
    }
    // SAFETY: getpwuid_r succeeded, so pw_name is a NUL-terminated string inside buf.
    let name = unsafe { std::ffi::CStr::from_ptr(entry.pw_name) };
    match name.to_str() {
        Ok(name) if !name.is_empty() => name.to_string(),
        _ => uid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_memtotal_in_bytes() {
        let sample = "MemTotal:       16314884 kB\nMemFree:         1234 kB\n";
        assert_eq!(parse_meminfo_total(sample), Some(16314884 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn this_machine_reports_memory_and_shm_space() {
        let total = mem_total().expect("/proc/meminfo has MemTotal on Linux");
        assert!(total > 64 << 20, "MemTotal {total} is implausibly small");
        assert!(free_space(Path::new(SHM_DIR)).is_some());
    }

    #[test]
    fn free_space_of_a_missing_path_is_its_parents() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("not/yet/created.spill");
        assert!(free_space(&missing).is_some());
    }

    #[test]
    fn this_machine_has_a_host_and_user_name() {
        assert!(!host_name().is_empty());
        assert!(!user_name().is_empty());
    }
}
