//! An impostor at a node agent's socket: a forked child that binds the socket path as the
//! test's user (root) with the agent's modes, then listens as another uid, and answers every
//! connection with one fixed line. Tests of the agent socket's owner checks use it as the
//! real second user (docs/security.md).

use std::ffi::CString;
use std::path::Path;

/// The impostor process; killed and reaped on drop.
pub struct Impostor {
    pid: libc::pid_t,
}

/// `path` as a socket address and its length.
pub fn sockaddr(path: &Path) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_encoded_bytes();
    assert!(bytes.len() < addr.sun_path.len(), "socket path too long");
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    (addr, len as libc::socklen_t)
}

impl Impostor {
    /// Starts the impostor on `socket` as `uid`, answering `reply` to every connection, and
    /// returns once it listens (panics if it could not: the test must run as root).
    pub fn start(socket: &Path, uid: u32, reply: &'static [u8]) -> Impostor {
        let (addr, len) = sockaddr(socket);
        let c_socket = CString::new(socket.as_os_str().as_encoded_bytes()).expect("path");
        let mut pipe = [0; 2];
        // SAFETY: `pipe` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
        // SAFETY: the child makes only system calls on data prepared before the fork, then
        // _exits (or is killed by the drop).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: see above.
            unsafe {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0
                    || libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) != 0
                    || libc::chmod(c_socket.as_ptr(), 0o600) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0
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
        let impostor = Impostor { pid };
        // SAFETY: closing the write end this process does not use.
        unsafe { libc::close(pipe[1]) };
        let mut byte = [0u8; 1];
        // SAFETY: reading one byte into a live buffer from the pipe created above.
        let n = unsafe { libc::read(pipe[0], byte.as_mut_ptr() as *mut libc::c_void, 1) };
        // SAFETY: closing the read end, owned here.
        unsafe { libc::close(pipe[0]) };
        assert_eq!(n, 1, "the impostor never listened (run the tests as root)");
        impostor
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        // SAFETY: the impostor is this process's own child, ended by its pid and reaped.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(self.pid, &mut status, 0);
        }
    }
}
