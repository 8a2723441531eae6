//! Read-through: programs under `cascade run` open, stat, list and chdir into paths the store
//! does not have, and the library asks the node agent's control socket for them.
//!
//! The agent's side is played by a test driver: a real Unix-socket server on the agent socket
//! path that answers the protocol (docs/interposition.md, "Read-through") by creating the
//! requested files in the store through cascade_store — what the node agent does after
//! fetching them from the durable store. The library under test is the real one.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cascade_store::{OpenOptions, Store};

mod common;
use common::env::Env;

const FILE_TEXT: &str = "hello from the durable store\n";

/// A stand-in for the node agent's control socket: serves `FETCH <path>` requests one
/// connection at a time, recording each path.
struct FakeAgent {
    socket: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    fn start(env: &Env) -> FakeAgent {
        let socket = Store::agent_socket_path(&env.name);
        std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("lock dir");
        let listener = UnixListener::bind(&socket).expect("bind the agent socket");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let name = env.name.clone();
        let thread = {
            let requests = requests.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    serve(&name, conn, &requests);
                }
            })
        };
        FakeAgent {
            socket,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn count(&self, path: &str) -> usize {
        self.requests().iter().filter(|r| *r == path).count()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn write_store_file(store: &Store, path: &str, data: &[u8]) {
    let parent = &path[..path.rfind('/').expect("absolute path")];
    if !parent.is_empty() {
        store.create_dir_all(parent, 0o755).expect("create parents");
    }
    let f = store
        .open(
            path,
            &OpenOptions::new().write(true).create(true).truncate(true),
        )
        .expect("create the fetched file");
    f.write_all_at(data, 0).expect("write the fetched file");
}

/// One request: what the node agent would answer after looking in the durable store.
fn serve(store_name: &str, conn: UnixStream, requests: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone the connection"));
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    // `cascade run` asks the node's agent for its counters (the ranks of a node share it);
    // this stand-in has none to give, which `cascade run` takes as no agent answering.
    if line == "STATUS\n" {
        let _ = (&conn).write_all(b"ERR 22 unknown request\n");
        return;
    }
    // Listings: recorded; this stand-in's levels below hold nothing to list (the real
    // agent's listings are tested in crates/cascade-cli/tests/listing.rs).
    if let Some(dir) = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix("LIST "))
    {
        requests.lock().unwrap().push(format!("LIST {dir}"));
        let _ = (&conn).write_all(b"OK\n");
        return;
    }
    let Some(path) = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix("FETCH "))
    else {
        requests
            .lock()
            .unwrap()
            .push(format!("malformed: {line:?}"));
        return;
    };
    requests.lock().unwrap().push(path.to_string());
    let store = Store::attach(store_name).expect("attach the store");
    let answer = match path {
        "/remote/file.txt" | "/remote/rel.txt" | "/remote/anchored.txt" => {
            write_store_file(&store, path, FILE_TEXT.as_bytes());
            "OK\n"
        }
        "/remote/statme" => {
            write_store_file(&store, path, &vec![7u8; 12345]);
            "OK\n"
        }
        "/remote/dir" | "/remote/workdir" => {
            write_store_file(&store, &format!("{path}/one"), b"1");
            write_store_file(&store, &format!("{path}/two"), b"2");
            "OK\n"
        }
        "/remote/bad.txt" => "ERR 5 checksum mismatch\n",
        // Says it fetched the file but did not: the library retries once and gives ENOENT.
        "/remote/liar" => "OK\n",
        // Closes the connection without a word.
        "/remote/hangup" => "",
        "/remote/slow" => {
            std::thread::sleep(Duration::from_millis(700));
            write_store_file(&store, path, b"slow but sure");
            "OK\n"
        }
        _ => "ERR 2 not in the durable store\n",
    };
    let mut conn = conn;
    let _ = conn.write_all(answer.as_bytes());
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn failed_with(out: &Output, text: &str) {
    assert!(
        !out.status.success() && stderr(out).contains(text),
        "wanted a failure with {text:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

#[test]
fn open_stat_opendir_and_chdir_fetch_missing_paths_through_the_agent() {
    let env = Env::new();
    let agent = FakeAgent::start(&env);

    // open (cat): the file is fetched, then read.
    assert_eq!(env.ok("cat $M/remote/file.txt"), FILE_TEXT);
    assert_eq!(agent.count("/remote/file.txt"), 1, "{:?}", agent.requests());
    assert_eq!(env.read_store("/remote/file.txt"), FILE_TEXT.as_bytes());
    // Now it is in the store: no second request.
    assert_eq!(env.ok("cat $M/remote/file.txt"), FILE_TEXT);
    assert_eq!(agent.count("/remote/file.txt"), 1);

    // stat: the size of the fetched file.
    assert_eq!(env.ok("stat -c %s $M/remote/statme").trim(), "12345");
    assert_eq!(agent.count("/remote/statme"), 1);

    // opendir (ls): a directory is fetched with its files.
    assert_eq!(env.ok("ls $M/remote/dir"), "one\ntwo\n");
    assert_eq!(agent.count("/remote/dir"), 1);
    // A listing shows what has been fetched so far, nothing else (this stand-in lists
    // nothing from below).
    assert_eq!(env.ok("ls $M/remote"), "dir\nfile.txt\nstatme\n");
    // Each listing asked the agent to list the directory from below first, and a failed
    // lookup asked for its parent's listing before the path.
    assert!(
        agent.count("LIST /remote") >= 2 && agent.count("LIST /remote/dir") >= 1,
        "{:?}",
        agent.requests()
    );

    // chdir, and a relative open inside the mount.
    assert_eq!(
        env.ok("cd $M/remote/workdir && ls && cat ../rel.txt"),
        format!("one\ntwo\n{FILE_TEXT}")
    );
    assert_eq!(agent.count("/remote/workdir"), 1, "{:?}", agent.requests());
    assert_eq!(agent.count("/remote/rel.txt"), 1, "{:?}", agent.requests());

    // openat relative to a Cascade directory descriptor: the agent gets the absolute path.
    let script = "import os\n\
                  d = os.open(os.environ['M'] + '/remote', os.O_RDONLY | os.O_DIRECTORY)\n\
                  f = os.open('anchored.txt', os.O_RDONLY, dir_fd=d)\n\
                  print(os.read(f, 100).decode(), end='')\n";
    let out = env.command("/usr/bin/python3", &["-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), FILE_TEXT);
    assert_eq!(
        agent.count("/remote/anchored.txt"),
        1,
        "{:?}",
        agent.requests()
    );

    // A slow fetch is waited for (the default CASCADE_FETCH_TIMEOUT is 300 s).
    assert_eq!(env.ok("cat $M/remote/slow"), "slow but sure");

    // Paths are normalised for the agent.
    let out = env.sh("cat $M/remote/./sub//../other.txt");
    failed_with(&out, "No such file or directory");
    assert_eq!(
        agent.count("/remote/other.txt"),
        1,
        "{:?}",
        agent.requests()
    );

    assert!(
        agent.requests().iter().all(|r| !r.starts_with("malformed")),
        "{:?}",
        agent.requests()
    );
}

#[test]
fn the_agents_errors_reach_the_application() {
    let env = Env::new();
    let agent = FakeAgent::start(&env);

    // ERR 2: ENOENT, and the library says nothing itself.
    let out = env.sh("cat $M/remote/missing.txt");
    failed_with(&out, "No such file or directory");
    assert!(!stderr(&out).contains("cascade:"), "{}", stderr(&out));
    assert_eq!(agent.count("/remote/missing.txt"), 1);

    // ERR 5: EIO, and the agent's message once on stderr.
    let out = env.sh("cat $M/remote/bad.txt");
    failed_with(&out, "Input/output error");
    let err = stderr(&out);
    let line = format!("cascade: {}/remote/bad.txt: checksum mismatch\n", env.mount);
    assert_eq!(err.matches(&line).count(), 1, "{err}");
    assert_eq!(err.matches("cascade:").count(), 1, "{err}");

    // stat gets the same errno.
    let out = env.sh("stat $M/remote/bad.txt");
    failed_with(&out, "Input/output error");

    // End of file without an answer: EIO, with a message.
    let out = env.sh("cat $M/remote/hangup");
    failed_with(&out, "Input/output error");
    assert!(
        stderr(&out).contains("cascade: ") && stderr(&out).contains("without an answer"),
        "{}",
        stderr(&out)
    );

    // OK but still missing: one retry, then ENOENT.
    let out = env.sh("cat $M/remote/liar");
    failed_with(&out, "No such file or directory");
    assert_eq!(agent.count("/remote/liar"), 1);
}

#[test]
fn creation_and_paths_outside_the_mount_never_ask_the_agent() {
    let env = Env::new();
    let agent = FakeAgent::start(&env);
    env.mkdir_store("/local");

    // O_CREAT opens: no request, whether the parent exists or not.
    let script = "import os, errno\n\
                  m = os.environ['M']\n\
                  os.close(os.open(m + '/local/created.txt', os.O_CREAT | os.O_WRONLY, 0o644))\n\
                  open(m + '/local/by-fopen.txt', 'w').close()\n\
                  for p in ('/nowhere/created.txt', '/local/sub/created.txt'):\n\
                  \x20   try:\n\
                  \x20       os.open(m + p, os.O_CREAT | os.O_WRONLY, 0o644)\n\
                  \x20   except OSError as e:\n\
                  \x20       print(errno.errorcode[e.errno])\n";
    let out = env.command("/usr/bin/python3", &["-c", script]);
    assert_eq!(stdout(&out), "ENOENT\nENOENT\n", "{}", stderr(&out));
    assert!(env.store().stat("/local/created.txt").is_ok());
    assert!(env.store().stat("/local/by-fopen.txt").is_ok());
    let out = env.sh("test -e /nonexistent-cascade-host-path || echo absent");
    assert_eq!(stdout(&out), "absent\n");
    // A path with a newline is refused without a request (the protocol is line-based).
    let script = "import os\n\
                  try:\n    os.stat(os.environ['M'] + '/remote/a\\nb')\n\
                  except FileNotFoundError:\n    print('ENOENT')\n";
    let out = env.command("/usr/bin/python3", &["-c", script]);
    assert_eq!(stdout(&out), "ENOENT\n", "{}", stderr(&out));
    assert_eq!(agent.requests(), Vec::<String>::new());
}

#[test]
fn without_an_agent_a_missing_path_is_enoent_at_once_and_silent() {
    let env = Env::new();
    let check = |env: &Env| {
        let started = Instant::now();
        let out = env.sh("stat $M/nothing; cat $M/dir/nothing; ls $M/nodir");
        let took = started.elapsed();
        assert_eq!(
            stderr(&out).matches("No such file or directory").count(),
            3,
            "{}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("cascade:"), "{}", stderr(&out));
        assert!(took < Duration::from_secs(10), "took {took:?}");
        let script = "import os, errno\n\
                      try:\n    os.stat(os.environ['M'] + '/nothing')\n\
                      except OSError as e:\n    print(errno.errorcode[e.errno])\n";
        let out = env.command("/usr/bin/python3", &["-c", script]);
        assert_eq!(stdout(&out), "ENOENT\n", "{}", stderr(&out));
    };
    // No socket at all.
    assert!(!Store::agent_socket_path(&env.name).exists());
    check(&env);
    // A socket file that nobody listens on (an agent that died): ECONNREFUSED.
    let socket = Store::agent_socket_path(&env.name);
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    drop(UnixListener::bind(&socket).expect("bind"));
    assert!(socket.exists());
    check(&env);
}
