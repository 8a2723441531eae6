//! Another user can plant the store: its names are predictable. Attach, create and destroy
//! refuse objects that are not private to the caller (docs/security.md). These tests run as
//! root, which is held to the same rule: what another uid (65534) owns is refused.

use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use cascade_store::{Prefault, SpillConfig, Store, StoreConfig};

const NOBODY: u32 = 65534;
static SEQ: AtomicU32 = AtomicU32::new(0);

/// A store name, its spill directory, and cleanup of everything a test planted there.
struct Names {
    name: String,
    dir: PathBuf,
}

impl Names {
    fn new() -> Names {
        assert_eq!(
            // SAFETY: geteuid cannot fail.
            unsafe { libc::geteuid() },
            0,
            "these tests plant objects of another uid and must run as root"
        );
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("/cascade-own-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(format!("cascade-own-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("spill dir");
        Names { name, dir }
    }
    fn shm(&self) -> PathBuf {
        Path::new("/dev/shm").join(self.name.trim_start_matches('/'))
    }
    fn spill(&self) -> PathBuf {
        self.dir.join("spill")
    }
    fn cfg(&self, spill: bool) -> StoreConfig {
        StoreConfig {
            name: self.name.clone(),
            capacity: 1 << 20,
            chunk_size: 4096,
            max_files: 16,
            spill: spill.then(|| SpillConfig {
                path: self.spill(),
                size: 64 << 10,
            }),
            prefault: Prefault::Off,
        }
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        let _ = Store::destroy_forced(&self.name);
        let _ = std::fs::remove_file(self.shm());
        let _ = std::fs::remove_dir_all(Store::lock_dir(&self.name));
        let _ = std::fs::remove_file(Store::lock_dir(&self.name));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), None).expect("chown");
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn refused<T>(r: cascade_store::Result<T>, words: &[&str]) {
    let e = match r {
        Ok(_) => panic!("expected a refusal mentioning {words:?}, but it succeeded"),
        Err(e) => e,
    };
    let text = e.to_string();
    assert!(!text.contains('\n'), "one line: {text}");
    for w in words {
        assert!(text.contains(w), "{text:?} should mention {w:?}");
    }
}

#[test]
fn a_block_planted_by_another_uid_with_mode_0666_is_refused() {
    let n = Names::new();
    // The planting user: a real second process, uid 65534, creates /dev/shm/<name> 0666 the
    // size of a block, as it would to read our checkpoints.
    let cname = CString::new(n.name.clone()).expect("name");
    // SAFETY: the child calls only async-signal-safe functions (setgid, setuid, shm_open,
    // fchmod, ftruncate, _exit) on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: see above; the child only makes system calls and exits.
        unsafe {
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                libc::_exit(2);
            }
            let fd = libc::shm_open(
                cname.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o666,
            );
            if fd < 0 || libc::fchmod(fd, 0o666) != 0 || libc::ftruncate(fd, 1 << 20) != 0 {
                libc::_exit(3);
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "planter failed: {status}"
    );
    let meta = std::fs::metadata(n.shm()).expect("planted block");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (NOBODY, 0o666));

    refused(
        Store::attach(&n.name),
        &["owned by uid 65534", "0666", &n.shm().display().to_string()],
    );
    refused(
        Store::attach_or_create(&n.cfg(false)),
        &["owned by uid 65534"],
    );
}

#[test]
fn our_own_block_with_group_or_other_access_is_refused() {
    let n = Names::new();
    drop(Store::create(&n.cfg(false)).expect("create"));
    Store::attach(&n.name).expect("a private block attaches");
    chmod(&n.shm(), 0o644);
    refused(Store::attach(&n.name), &["mode 0644", "group or others"]);
    chmod(&n.shm(), 0o600);
    Store::attach(&n.name).expect("private again");
}

#[test]
fn a_block_owned_by_another_uid_is_neither_attached_nor_destroyed() {
    let n = Names::new();
    drop(Store::create(&n.cfg(true)).expect("create"));
    chown(&n.shm(), NOBODY);
    chmod(&n.shm(), 0o600);
    refused(Store::attach(&n.name), &["owned by uid 65534", "mode 0600"]);
    // Destroy would remove the spill file the header names: a planted header names any file.
    refused(Store::destroy(&n.name), &["owned by uid 65534"]);
    assert!(
        n.spill().exists(),
        "the spill file a foreign header names stays"
    );
    assert!(n.shm().exists());
}

#[test]
fn a_symlink_in_place_of_the_block_is_refused() {
    let n = Names::new();
    let target = Names::new();
    drop(Store::create(&target.cfg(false)).expect("create"));
    std::os::unix::fs::symlink(target.shm(), n.shm()).expect("symlink");
    refused(Store::attach(&n.name), &["symlink"]);
}

#[test]
fn a_planted_lock_directory_is_refused_at_create_and_attach() {
    let n = Names::new();
    let locks = Store::lock_dir(&n.name);
    std::fs::create_dir(&locks).expect("mkdir");
    chown(&locks, NOBODY);
    chmod(&locks, 0o777);
    refused(
        Store::create(&n.cfg(false)),
        &["lock directory", "owned by uid 65534"],
    );
    assert!(!n.shm().exists(), "a refused create leaves no block behind");

    std::fs::remove_dir(&locks).expect("rmdir");
    drop(Store::create(&n.cfg(false)).expect("create"));
    let meta = std::fs::symlink_metadata(&locks).expect("lock dir");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
    chmod(&locks, 0o755);
    refused(Store::attach(&n.name), &["lock directory", "mode 0755"]);
    std::fs::remove_dir(&locks).expect("rmdir");
    std::os::unix::fs::symlink(&n.dir, &locks).expect("symlink");
    refused(Store::attach(&n.name), &["lock directory", "symlink"]);
}

#[test]
fn a_spill_path_that_is_a_symlink_is_refused_at_create() {
    let n = Names::new();
    let victim = n.dir.join("victim");
    std::fs::write(&victim, b"precious").expect("victim");
    std::os::unix::fs::symlink(&victim, n.spill()).expect("symlink");
    refused(Store::create(&n.cfg(true)), &["spill file", "symlink"]);
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
    assert!(!n.shm().exists(), "a refused create leaves no block behind");
}

#[test]
fn a_spill_file_of_another_uid_is_refused_at_create() {
    let n = Names::new();
    std::fs::write(n.spill(), b"theirs").expect("planted");
    chown(&n.spill(), NOBODY);
    chmod(&n.spill(), 0o666);
    refused(
        Store::create(&n.cfg(true)),
        &["spill file", "owned by uid 65534"],
    );
    assert_eq!(std::fs::read(n.spill()).expect("planted"), b"theirs");
}

#[test]
fn a_spill_file_of_our_own_left_behind_is_replaced_private() {
    let n = Names::new();
    std::fs::write(n.spill(), b"left by a store lost in a reboot").expect("old spill");
    chmod(&n.spill(), 0o644);
    drop(Store::create(&n.cfg(true)).expect("create over our own old spill file"));
    let meta = std::fs::symlink_metadata(n.spill()).expect("spill");
    assert_eq!(
        (meta.uid(), meta.mode() & 0o777, meta.len()),
        (0, 0o600, 64 << 10)
    );
}

#[test]
fn a_spill_file_swapped_for_a_symlink_or_a_foreign_file_is_refused_at_attach() {
    let n = Names::new();
    drop(Store::create(&n.cfg(true)).expect("create"));
    let victim = n.dir.join("victim");
    std::fs::write(&victim, vec![0u8; 64 << 10]).expect("victim");
    std::fs::rename(n.spill(), n.dir.join("old")).expect("move spill");
    std::os::unix::fs::symlink(&victim, n.spill()).expect("symlink");
    refused(Store::attach(&n.name), &["spill file", "symlink"]);

    std::fs::remove_file(n.spill()).expect("rm symlink");
    std::fs::rename(n.dir.join("old"), n.spill()).expect("restore spill");
    Store::attach(&n.name).expect("our spill file attaches");
    chmod(&n.spill(), 0o666);
    refused(Store::attach(&n.name), &["spill file", "mode 0666"]);
    chmod(&n.spill(), 0o600);
    chown(&n.spill(), NOBODY);
    refused(
        Store::attach(&n.name),
        &["spill file", "owned by uid 65534"],
    );
}
