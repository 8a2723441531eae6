//! The agent's control socket and the users on the node (docs/security.md): the agent answers
//! only its own uid, and a client talks only to an agent of its own uid. A second user is a
//! real process: a child forked by the test (run as root) that switches to uid 65534.

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
    let (addr, len) = cascade_testkit::impostor::sockaddr(socket);
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
    // A server impersonating the agent: bound as root in the (private) lock directory with
    // the agent's modes, but listening as uid 65534.
    let impostor = cascade_testkit::impostor::Impostor::start(&socket, NOBODY, b"OK {}\n");
    let outcome = cascade_agent::request(&f.name, "STATUS");
    drop(impostor);
    let err = match outcome {
        Ok(reply) => panic!("talked to a socket served by uid 65534: {reply}"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("served by uid 65534"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}
