//! credentials: the set*id family. New store files are owned by the creator's effective uid
//! and gid; the store keeps them instead of asking the kernel twice per create
//! (`cascade_store::ownership::creator_ids`), and these wrappers tell it when they change.
//! glibc's set*id functions change every thread of the process; a raw system call
//! (`syscall(SYS_setuid, ...)`, see raw.rs) changes the calling thread only, after which the
//! store asks the kernel on every create.

use super::*;
use cascade_store::ownership::creator_ids;
use libc::{c_int, gid_t, uid_t};

macro_rules! id_wrapper {
    ($name:ident; $($arg:ident: $id:ty),+) => {
        /// # Safety
        /// C ABI.
        #[cfg_attr(not(cascade_wrap), no_mangle)]
        #[cfg_attr(cascade_wrap, export_name = concat!("__wrap_", stringify!($name)))]
        #[boundary]
        pub unsafe extern "C" fn $name($($arg: $id),+) -> c_int {
            let rc = call_real!($name: fn($($id),+) -> c_int, -1; $($arg),+);
            // Also after a failure: a partial change (setresuid's first id) is possible.
            creator_ids::changed();
            rc
        }
    };
}

id_wrapper!(setuid; uid: uid_t);
id_wrapper!(seteuid; euid: uid_t);
id_wrapper!(setreuid; ruid: uid_t, euid: uid_t);
id_wrapper!(setresuid; ruid: uid_t, euid: uid_t, suid: uid_t);
id_wrapper!(setgid; gid: gid_t);
id_wrapper!(setegid; egid: gid_t);
id_wrapper!(setregid; rgid: gid_t, egid: gid_t);
id_wrapper!(setresgid; rgid: gid_t, egid: gid_t, sgid: gid_t);

/// The system calls that change the calling thread's effective ids.
pub(crate) fn changes_a_threads_ids(n: libc::c_long) -> bool {
    [
        libc::SYS_setuid,
        libc::SYS_setreuid,
        libc::SYS_setresuid,
        libc::SYS_setgid,
        libc::SYS_setregid,
        libc::SYS_setresgid,
    ]
    .contains(&n)
}
