//! Read-through asks only an agent of the program's own uid (docs/security.md): a socket at
//! the agent's path served by another uid is treated as no agent at all. The impersonator is
//! a real second user: a child forked by the test (run as root) that listens as uid 65534.

use std::ffi::CString;
use std::process::Output;

use cascade_store::Store;

mod common;
use common::env::Env;

const NOBODY: u32 = 65534;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_socket_served_by_another_uid_is_not_asked() {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "this test switches to uid 65534: run as root");
    let env = Env::new();
    let socket = Store::agent_socket_path(&env.name);
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = socket.as_os_str().as_encoded_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len =
        (std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1) as libc::socklen_t;
    let c_socket = CString::new(bytes).expect("path");
    let reply = b"ERR 5 answered by the planted agent\n";
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the child makes only system calls on data prepared before the fork, then
    // _exits (or is killed by the test).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0
                || libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) != 0
                || libc::chmod(c_socket.as_ptr(), 0o600) != 0
                || libc::setgid(NOBODY) != 0
                || libc::setuid(NOBODY) != 0
                || libc::listen(fd, 16) != 0
            {
                libc::_exit(3);
            }
            libc::write(pipe[1], b"L".as_ptr() as *const libc::c_void, 1);
            loop {
                let conn = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
                if conn >= 0 {
                    libc::send(
                        conn,
                        reply.as_ptr() as *const libc::c_void,
                        reply.len(),
                        libc::MSG_NOSIGNAL,
                    );
                    libc::close(conn);
                }
            }
        }
    }
    let mut byte = [0u8; 1];
    // SAFETY: reading one byte into a live buffer from the pipe created above.
    let listening = unsafe { libc::read(pipe[0], byte.as_mut_ptr() as *mut libc::c_void, 1) };
    let script = "import os, errno\n\
                  try:\n    os.stat(os.environ['M'] + '/remote/file')\n\
                  except OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let out = (listening == 1).then(|| env.command("/usr/bin/python3", &["-c", script]));
    // SAFETY: the impersonator is this test's own child, ended by its pid and reaped.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    let out = out.expect("the impersonator never listened");
    assert_eq!(stdout(&out), "ENOENT\n", "{}", stderr(&out));
    assert!(!stderr(&out).contains("planted"), "{}", stderr(&out));
}
