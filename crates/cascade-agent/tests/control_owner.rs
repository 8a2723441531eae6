//! The agent's control socket and the users on the node (docs/security.md): the agent answers
//! only its own uid, and a client talks only to an agent of its own uid. A second user is a
//! real process: a child forked by the test (run as root) that switches to uid 65534.

use std::ffi::CString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use cascade_agent::{Agent, AgentOptions};
use cascade_durable::DurableStore;
use cascade_store::{Prefault, Store, StoreConfig};

const NOBODY: u32 = 65534;

/// A store without spill and a durable directory, both removed when the test ends.
struct Fixture {
    store: Option<Store>,
    name: String,
    durable_dir: tempfile::TempDir,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "these tests switch to uid 65534: run as root");
        let name = format!("/cascade-control-owner-{tag}-{}", std::process::id());
        let cfg = StoreConfig {
            name: name.clone(),
            capacity: 16 << 16,
            chunk_size: 1 << 16,
            max_files: 64,
            spill: None,
            prefault: Prefault::Off,
        };
        Fixture {
            store: Some(Store::create(&cfg).expect("create store")),
            name,
            durable_dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn agent(&self) -> Arc<Agent> {
        let durable =
            DurableStore::open(&self.durable_dir.path().display().to_string()).expect("durable");
        let store = self.store.as_ref().expect("store").clone();
        Arc::new(Agent::start(store, durable, AgentOptions::default()).expect("agent"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
    }
}

fn sockaddr(path: &Path) -> (libc::sockaddr_un, libc::socklen_t) {
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

fn wait_child(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for a child this test forked.
    let reaped = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(reaped, pid, "waitpid");
    assert!(libc::WIFEXITED(status), "child died: {status}");
    libc::WEXITSTATUS(status)
}

/// What a process of uid 65534 gets when it connects to `socket` and asks STATUS: exit code
/// 0 = an OK reply, 1 = ERR 13, 2 = another reply or none, 3 = connect failed, 4 = setuid
/// failed.
fn status_as_nobody(socket: &Path) -> i32 {
    let (addr, len) = sockaddr(socket);
    // SAFETY: the child makes only system calls (async-signal-safe) on data prepared before
    // the fork, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: see above.
        unsafe {
            if libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                libc::_exit(4);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 || libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                libc::_exit(3);
            }
            let req = b"STATUS\n";
            libc::send(
                fd,
                req.as_ptr() as *const libc::c_void,
                req.len(),
                libc::MSG_NOSIGNAL,
            );
            let mut buf = [0u8; 16];
            let mut got = 0;
            while got < 6 {
                let n = libc::read(
                    fd,
                    buf[got..].as_mut_ptr() as *mut libc::c_void,
                    buf.len() - got,
                );
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            if got >= 2 && &buf[..2] == b"OK" {
                libc::_exit(0);
            }
            if got >= 6 && &buf[..6] == b"ERR 13" {
                libc::_exit(1);
            }
            libc::_exit(2);
        }
    }
    wait_child(pid)
}

#[test]
fn the_agent_refuses_a_connection_from_another_uid() {
    let f = Fixture::new("peer");
    let agent = f.agent();
    let control = agent.serve_control().expect("serve");
    let socket = Store::agent_socket_path(&f.name);
    let dir = Store::lock_dir(&f.name);
    let mode = |p: &Path| std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777;
    assert_eq!(mode(&dir), 0o700, "lock directory");
    assert_eq!(mode(&socket), 0o600, "agent socket");
    assert_eq!(std::fs::symlink_metadata(&socket).expect("stat").uid(), 0);

    // The modes keep another user out...
    assert_eq!(
        status_as_nobody(&socket),
        3,
        "connect as uid 65534 should fail"
    );
    // ...and if someone loosens them, the agent still answers only its own uid.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    assert_eq!(status_as_nobody(&socket), 1, "uid 65534 should get ERR 13");
    // Its own user is served.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let reply = cascade_agent::request(&f.name, "STATUS").expect("STATUS");
    assert!(reply.starts_with("OK "), "{reply}");

    agent.stop();
    agent.stop_control();
    control.join().expect("control thread");
}

#[test]
fn a_client_refuses_a_socket_served_by_another_uid() {
    let f = Fixture::new("client");
    let socket = Store::agent_socket_path(&f.name);
    let (addr, len) = sockaddr(&socket);
    let c_socket = CString::new(socket.as_os_str().as_encoded_bytes()).expect("path");
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
    // A server impersonating the agent: bound as root in the (private) lock directory with
    // the agent's modes, but listening as uid 65534. It tells the test through the pipe when
    // it listens.
    // SAFETY: the child makes only system calls on data prepared before the fork, then
    // _exits.
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
                || libc::listen(fd, 4) != 0
            {
                libc::_exit(3);
            }
            libc::write(pipe[1], b"L".as_ptr() as *const libc::c_void, 1);
            let conn = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
            if conn >= 0 {
                let reply = b"OK {}\n";
                libc::send(
                    conn,
                    reply.as_ptr() as *const libc::c_void,
                    reply.len(),
                    libc::MSG_NOSIGNAL,
                );
            }
            libc::_exit(0);
        }
    }
    let mut byte = [0u8; 1];
    // SAFETY: reading one byte into a live buffer from the pipe created above.
    let n = unsafe { libc::read(pipe[0], byte.as_mut_ptr() as *mut libc::c_void, 1) };
    let outcome = cascade_agent::request(&f.name, "STATUS");
    // SAFETY: the impersonator is this test's own child, ended by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_child_any(pid);
    // SAFETY: closing the pipe's two descriptors, owned by this test.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    assert_eq!(n, 1, "the impersonator never listened");
    let err = match outcome {
        Ok(reply) => panic!("talked to a socket served by uid 65534: {reply}"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("served by uid 65534"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

fn wait_child_any(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: reaping a child this test forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}
