//! The node agent on real parts: a node store in /dev/shm and the durable tier's directory
//! backend. Passes are driven by the test (Agent::pass), so every step is deterministic.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cascade_agent::{Agent, AgentOptions};
use cascade_durable::DurableStore;
use cascade_store::{LifeEntry, OpenOptions, Prefault, Store, StoreConfig};
use cascade_testkit::{pattern, write_store_file as write};

const CHUNK: u64 = 64 << 10;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A store without spill and a durable directory, both removed when the test ends.
struct Fixture {
    store: Option<Store>,
    name: String,
    durable_dir: tempfile::TempDir,
}

impl Fixture {
    fn new(chunks: u64) -> Fixture {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("/cascade-lifecycle-test-{}-{n}", std::process::id());
        let cfg = StoreConfig {
            name: name.clone(),
            capacity: chunks * CHUNK,
            chunk_size: CHUNK,
            max_files: 256,
            spill: None,
            prefault: Prefault::Off,
        };
        Fixture {
            store: Some(Store::create(&cfg).expect("create store")),
            name,
            durable_dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store")
    }

    fn durable(&self) -> DurableStore {
        DurableStore::open(&self.durable_dir.path().display().to_string()).expect("durable")
    }

    fn agent(&self, opts: AgentOptions) -> Agent {
        Agent::start(self.store().clone(), self.durable(), opts).expect("agent")
    }

    fn object(&self, key: &str) -> std::path::PathBuf {
        self.durable_dir.path().join(key)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.store.take();
        let _ = Store::destroy_forced(&self.name);
    }
}

fn life(store: &Store, path: &str) -> LifeEntry {
    store
        .life_tree(path)
        .expect("life_tree")
        .into_iter()
        .next()
        .expect("entry")
}

fn hex_blake3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

fn opts() -> AgentOptions {
    AgentOptions {
        retry_min: Duration::from_millis(1),
        ..AgentOptions::default()
    }
}

#[test]
fn a_closed_file_is_uploaded_and_a_committed_checkpoint_gets_its_marker() {
    let f = Fixture::new(64);
    let s = f.store();
    let agent = f.agent(opts());
    let a = pattern(200_000, 1);
    let b = pattern(10, 2);
    write(s, "/ckpt.1/a.dat", &a);
    write(s, "/ckpt.1/sub/b.dat", &b);

    // Closed files go at once, before the commit; no marker without a commit.
    agent.pass();
    assert!(life(s, "/ckpt.1/a.dat").durable());
    assert_eq!(std::fs::read(f.object("ckpt.1/a.dat")).expect("object"), a);
    let sum = std::fs::read_to_string(f.object("ckpt.1/a.dat.blake3")).expect("checksum");
    assert!(sum.starts_with(&hex_blake3(&a)), "{sum}");
    assert!(!f.object("ckpt.1/.cascade-complete").exists());

    s.commit("/ckpt.1", false).expect("commit");
    assert!(!life(s, "/ckpt.1").complete());
    agent.pass();
    assert!(life(s, "/ckpt.1").complete());
    let marker = f
        .durable()
        .read_marker("ckpt.1")
        .expect("read")
        .expect("marker");
    let files: Vec<(String, u64, String)> = marker
        .files
        .iter()
        .map(|m| (m.path.clone(), m.size, m.blake3.clone()))
        .collect();
    assert_eq!(
        files,
        vec![
            ("a.dat".to_string(), 200_000, hex_blake3(&a)),
            ("sub/b.dat".to_string(), 10, hex_blake3(&b)),
        ]
    );
    f.durable().verify_checkpoint("ckpt.1").expect("verifies");
    assert_eq!(agent.stats().markers, 1);
}

#[test]
fn a_changed_checkpoint_loses_its_marker_until_the_new_version_is_durable() {
    let f = Fixture::new(64);
    let s = f.store();
    let agent = f.agent(opts());
    write(s, "/c/x", &pattern(70_000, 3));
    s.commit("/c", false).expect("commit");
    agent.pass();
    assert!(life(s, "/c").complete());

    // Reopening for writing makes the checkpoint incomplete at once.
    let new = pattern(90_000, 4);
    let file = s
        .open("/c/x", &OpenOptions::new().write(true).truncate(true))
        .expect("reopen");
    assert!(!life(s, "/c").complete());
    file.write_all_at(&new, 0).expect("write");
    // While it is open, the agent neither uploads it nor writes a marker.
    agent.pass();
    assert!(!life(s, "/c/x").durable());
    assert!(!life(s, "/c").complete());
    drop(file);

    agent.pass();
    agent.pass();
    assert!(life(s, "/c").complete());
    let marker = f.durable().read_marker("c").expect("read").expect("marker");
    assert_eq!(marker.files[0].blake3, hex_blake3(&new));
    assert_eq!(std::fs::read(f.object("c/x")).expect("object"), new);
}

#[test]
fn a_single_file_checkpoint_has_its_marker_beside_it() {
    let f = Fixture::new(64);
    let s = f.store();
    let agent = f.agent(opts());
    let data = pattern(100_000, 5);
    write(s, "/model.pt", &data);
    s.commit("/model.pt", false).expect("commit");
    agent.pass();
    assert!(life(s, "/model.pt").complete());
    assert!(f.object("model.pt.cascade-complete").exists());
    assert_eq!(std::fs::read(f.object("model.pt")).expect("object"), data);
    let marker = f.durable().verify_checkpoint("model.pt").expect("verify");
    assert!(marker.single_file);
}

#[test]
fn retention_keeps_the_newest_and_evicts_only_durable_checkpoints() {
    let f = Fixture::new(64);
    let s = f.store();
    let agent = f.agent(AgentOptions { keep: 1, ..opts() });
    for i in 1..=3 {
        write(s, &format!("/run/ckpt.{i}/d"), &pattern(65_536, i));
        s.commit(&format!("/run/ckpt.{i}"), false).expect("commit");
    }
    // An uncommitted newer one never counts against the others.
    write(s, "/run/partial/d", &pattern(1000, 9));
    agent.pass();
    agent.pass();
    assert!(s.stat("/run/ckpt.1").is_err(), "oldest evicted");
    assert!(s.stat("/run/ckpt.2").is_err(), "second evicted");
    assert!(life(s, "/run/ckpt.3").complete(), "newest kept");
    assert!(s.stat("/run/partial/d").is_ok());
    for i in 1..=3 {
        f.durable()
            .verify_checkpoint(&format!("run/ckpt.{i}"))
            .expect("every evicted checkpoint is complete in the durable store");
    }
    assert_eq!(agent.stats().evicted_checkpoints, 2);
}

#[test]
fn without_a_durable_copy_nothing_is_evicted() {
    let f = Fixture::new(64);
    let s = f.store();
    // The durable directory turns read-only: uploads fail, and retention must wait.
    let agent = f.agent(AgentOptions { keep: 1, ..opts() });
    for i in 1..=3 {
        write(s, &format!("/ckpt.{i}/d"), &pattern(1000, i));
        s.commit(&format!("/ckpt.{i}"), false).expect("commit");
    }
    let blocker = f.durable_dir.path().join("ckpt.1");
    std::fs::create_dir_all(f.durable_dir.path()).expect("dir");
    // A file where the checkpoint's directory must go makes its uploads fail.
    std::fs::write(&blocker, b"in the way").expect("blocker");
    agent.pass();
    assert!(s.stat("/ckpt.1/d").is_ok(), "not durable, so not evicted");
    assert!(!life(s, "/ckpt.1/d").durable());
    let stats = agent.stats();
    assert!(stats.failures >= 1);
    assert!(
        stats
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains("/ckpt.1/d"),
        "{stats:?}"
    );
    std::fs::remove_file(&blocker).expect("unblock");
    let outcome = agent
        .drain(Duration::from_secs(30))
        .expect("drains after the fault");
    assert_eq!(outcome.pending, 0);
    agent.pass();
    assert!(s.stat("/ckpt.1").is_err(), "evicted once durable");
    f.durable().verify_checkpoint("ckpt.1").expect("complete");
}

#[test]
fn memory_only_checkpoints_are_never_uploaded_and_make_way_for_durable_ones() {
    let f = Fixture::new(64);
    let s = f.store();
    let agent = f.agent(AgentOptions {
        keep: 1,
        flush_every: 2,
        ..opts()
    });
    write(s, "/s/c1/d", &pattern(1000, 1));
    s.commit("/s/c1", false).expect("commit"); // #1: memory only
    agent.pass();
    assert!(!f.object("s/c1/d").exists(), "not flushed, not uploaded");
    assert!(s.stat("/s/c1").is_ok(), "only checkpoint: kept");
    write(s, "/s/c2/d", &pattern(1000, 2));
    s.commit("/s/c2", false).expect("commit"); // #2: flushed
    agent.pass();
    agent.pass();
    assert!(life(s, "/s/c2").complete());
    assert!(
        s.stat("/s/c1").is_err(),
        "superseded by a durable checkpoint"
    );
    assert!(!f.object("s/c1").exists());
}

#[test]
fn read_through_fetches_verified_files_and_refuses_corrupt_ones() {
    let f = Fixture::new(64);
    let durable = f.durable();
    let data = pattern(150_000, 7);
    durable
        .put_bytes("job/latest", b"ckpt.000040\n")
        .expect("put");
    let digest = durable
        .put_bytes("job/ckpt.000040/grid.bin", &data)
        .expect("put");
    durable
        .put_checksum("job/ckpt.000040/grid.bin", &digest)
        .expect("checksum");
    let d = durable
        .put_bytes("job/latest", b"ckpt.000040\n")
        .expect("put");
    durable.put_checksum("job/latest", &d).expect("checksum");
    durable.put_bytes("job/bad.bin", &data).expect("put");
    durable
        .put_checksum(
            "job/bad.bin",
            &cascade_durable::FileDigest {
                size: data.len() as u64,
                blake3: hex_blake3(b"something else"),
            },
        )
        .expect("checksum");

    let agent = Arc::new(f.agent(opts()));
    let s = f.store();
    agent.fetch("/job/ckpt.000040/grid.bin").expect("fetch");
    let got = s
        .open("/job/ckpt.000040/grid.bin", &OpenOptions::new())
        .expect("open");
    let mut buf = vec![0u8; data.len()];
    assert_eq!(got.read_at(&mut buf, 0).expect("read"), data.len());
    assert_eq!(buf, data);
    assert!(
        life(s, "/job/ckpt.000040/grid.bin").durable(),
        "not uploaded back"
    );
    agent.pass();
    assert_eq!(agent.stats().uploaded_files, 0);

    let corrupt = agent.fetch("/job/bad.bin").expect_err("corrupt");
    assert_eq!(corrupt.errno(), libc::EIO, "{corrupt}");
    assert!(s.stat("/job/bad.bin").is_err());
    let names: Vec<String> = s
        .read_dir("/job")
        .expect("ls")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("cascade-fetch")),
        "{names:?}"
    );
    assert_eq!(
        agent.fetch("/job/missing").expect_err("missing").errno(),
        libc::ENOENT
    );
    // A prefix becomes a directory.
    agent.fetch("/job").expect("dir");
    assert!(s.stat("/job").expect("stat").is_dir());

    // The same over the control socket.
    let control = agent.serve_control().expect("serve");
    assert_eq!(
        cascade_agent::request(s.name(), "FETCH /job/latest").expect("request"),
        "OK"
    );
    let reply = cascade_agent::request(s.name(), "FETCH /job/bad.bin").expect("request");
    assert!(reply.starts_with("ERR 5 "), "{reply}");
    let reply = cascade_agent::request(s.name(), "FETCH /nope").expect("request");
    assert!(reply.starts_with("ERR 2 "), "{reply}");
    let status = cascade_agent::request(s.name(), "STATUS").expect("status");
    let json: serde_json::Value =
        serde_json::from_str(status.strip_prefix("OK ").expect("OK")).expect("json");
    assert_eq!(json["fetched_files"], 2);
    agent.stop();
    agent.stop_control();
    control.join().expect("control thread");
}

#[test]
fn a_second_agent_is_refused() {
    let f = Fixture::new(16);
    let _first = f.agent(opts());
    let err = Agent::start(f.store().clone(), f.durable(), opts())
        .err()
        .expect("refused");
    assert_eq!(err.errno(), libc::EBUSY, "{err}");
    assert!(err.to_string().contains("already running"), "{err}");
}

#[test]
fn a_writer_on_a_full_store_waits_for_the_agent_to_evict() {
    // 8 chunks: two complete checkpoints of 4 chunks fill it.
    let f = Fixture::new(8);
    let s = f.store().clone();
    let agent = Arc::new(f.agent(AgentOptions {
        keep: 2,
        full_wait: Duration::from_secs(30),
        ..opts()
    }));
    for i in 1..=2 {
        write(&s, &format!("/c{i}/d"), &pattern(4 * CHUNK as usize, i));
        s.commit(&format!("/c{i}"), false).expect("commit");
    }
    agent.pass();
    agent.pass();
    assert!(life(&s, "/c1").complete() && life(&s, "/c2").complete());
    let runner = {
        let agent = Arc::clone(&agent);
        std::thread::spawn(move || agent.run())
    };
    // Needs 4 chunks: only an eviction (of /c1, the oldest) can make room, keep=2 or not.
    let third = pattern(4 * CHUNK as usize, 3);
    write(&s, "/c3/d", &third);
    agent.stop();
    runner.join().expect("agent thread");
    assert!(s.stat("/c1").is_err(), "oldest complete checkpoint evicted");
    assert!(s.stat("/c2").is_ok());
    let file = s.open("/c3/d", &OpenOptions::new()).expect("open");
    let mut buf = vec![0u8; third.len()];
    file.read_at(&mut buf, 0).expect("read");
    assert_eq!(buf, third);
}

#[test]
fn a_writer_gets_enospc_at_once_without_an_agent() {
    let f = Fixture::new(2);
    let s = f.store();
    let opts = OpenOptions::new().write(true).create(true);
    let file = s.open("/x", &opts).expect("open");
    let err = file
        .write_all_at(&pattern(4 * CHUNK as usize, 1), 0)
        .expect_err("full");
    assert_eq!(err.errno(), libc::ENOSPC);
}

#[test]
fn a_writer_waiting_for_space_gets_one_eviction_however_many_passes_run() {
    // 12 chunks: three complete checkpoints of 4 chunks fill it, all within keep=3.
    let f = Fixture::new(12);
    let s = f.store().clone();
    let agent = f.agent(AgentOptions {
        keep: 3,
        full_wait: Duration::from_secs(30),
        ..opts()
    });
    for i in 1..=3 {
        write(&s, &format!("/c{i}/d"), &pattern(4 * CHUNK as usize, i));
        s.commit(&format!("/c{i}"), false).expect("commit");
    }
    agent.pass();
    agent.pass();
    assert!((1..=3).all(|i| life(&s, &format!("/c{i}")).complete()));
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || write(&s, "/c4/d", &pattern(4 * CHUNK as usize, 4)))
    };
    // Passes as fast as they come, also between the eviction and the writer's retry: the
    // writer's one request frees one checkpoint, not one per pass.
    while !writer.is_finished() {
        agent.pass();
    }
    writer.join().expect("writer thread");
    for _ in 0..10 {
        agent.pass();
    }
    assert!(s.stat("/c1").is_err(), "the oldest checkpoint made room");
    assert!(
        s.stat("/c2").is_ok() && s.stat("/c3").is_ok(),
        "one eviction only"
    );
}

#[test]
fn the_agents_caches_hold_only_what_the_store_still_has() {
    let f = Fixture::new(64);
    let s = f.store().clone();
    let agent = f.agent(opts());
    for round in 0..3u64 {
        for i in 0..20 {
            write(&s, &format!("/r{round}/f{i}"), &pattern(1000, i + round));
        }
        agent.pass();
        agent.pass();
        assert_eq!(agent.stats().cached_digests, 20, "round {round}");
        for i in 0..20 {
            s.unlink(&format!("/r{round}/f{i}")).expect("unlink");
        }
        s.rmdir(&format!("/r{round}")).expect("rmdir");
    }
    agent.pass();
    assert_eq!(agent.stats().cached_digests, 0);
    assert_eq!(agent.stats().retrying, 0);
}
