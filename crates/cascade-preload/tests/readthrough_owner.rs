//! Read-through asks only an agent of the program's own uid (docs/security.md): a socket at
//! the agent's path served by another uid is treated as no agent at all. The impersonator is
//! a real second user: a child forked by the test (run as root) that listens as uid 65534.

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
    let impostor = cascade_testkit::impostor::Impostor::start(
        &socket,
        NOBODY,
        b"ERR 5 answered by the planted agent\n",
    );
    let script = "import os, errno\n\
                  try:\n    os.stat(os.environ['M'] + '/remote/file')\n\
                  except OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let out = env.command("/usr/bin/python3", &["-c", script]);
    drop(impostor);
    assert_eq!(stdout(&out), "ENOENT\n", "{}", stderr(&out));
    assert!(!stderr(&out).contains("planted"), "{}", stderr(&out));
}
