//! Checkpoints written by a job on several nodes (docs/agent.md, "Jobs on many nodes"):
//! simulated nodes, each with a node store of its own and an agent that knows its node name
//! and the job's node count, sharing one durable store (a directory, or a real S3 server).
//! Passes are driven by the test, so every step is deterministic.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cascade_agent::{restore_checkpoint, Agent, AgentOptions, JobOptions};
use cascade_durable::{DurableStore, Marker};
use cascade_store::{Prefault, Store, StoreConfig};
use cascade_testkit::{pattern, wait_for, write_store_file as write, Versitygw};

const CHUNK: u64 = 64 << 10;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One simulated node: its store and its agent.
struct Node {
    name: String,
    store_name: String,
    store: Option<Store>,
    agent: Option<Agent>,
}

impl Node {
    fn new(name: &str, nodes: &[&str], durable: &str) -> Node {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let store_name = format!("/cascade-jobs-test-{}-{n}", std::process::id());
        let cfg = StoreConfig {
            name: store_name.clone(),
            capacity: 256 * CHUNK,
            chunk_size: CHUNK,
            max_files: 256,
            spill: None,
            prefault: Prefault::Off,
        };
        let store = Store::create(&cfg).expect("create store");
        let opts = AgentOptions {
            retry_min: Duration::from_millis(1),
            job: Some(JobOptions {
                node: name.to_string(),
                nodes: nodes.len() as u32,
                node_names: nodes.iter().map(|n| n.to_string()).collect(),
            }),
            ..AgentOptions::default()
        };
        let durable = DurableStore::open(durable).expect("durable store");
        let agent = Agent::start(store.clone(), durable, opts).expect("agent");
        Node {
            name: name.to_string(),
            store_name,
            store: Some(store),
            agent: Some(agent),
        }
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("store")
    }

    fn agent(&self) -> &Agent {
        self.agent.as_ref().expect("agent")
    }

    /// Writes this node's rank files of checkpoint `ckpt` and commits it.
    fn write_checkpoint(&self, ckpt: &str, ranks: &[u32], seed: u64) -> Vec<(String, Vec<u8>)> {
        let mut written = Vec::new();
        for &rank in ranks {
            let rel = format!("rank.{rank}.bin");
            let data = pattern(100_000 + rank as usize * 1000, seed + rank as u64);
            write(self.store(), &format!("{ckpt}/{rel}"), &data);
            written.push((rel, data));
        }
        self.store().commit(ckpt, false).expect("commit");
        written
    }

    fn complete(&self, ckpt: &str) -> bool {
        self.store().life_tree(ckpt).expect("life_tree")[0].complete()
    }

    /// Runs passes until this node records `ckpt` complete (a node whose part went in
    /// before the others' asks again every half second).
    fn learns_complete(&self, ckpt: &str) {
        wait_for(
            &format!("{} to see {ckpt} complete", self.name),
            Duration::from_secs(20),
            || {
                self.agent().pass();
                self.complete(ckpt)
            },
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.agent.take();
        self.store.take();
        let _ = Store::destroy_forced(&self.store_name);
    }
}

fn marker(durable: &str, ckpt: &str) -> Option<Marker> {
    DurableStore::open(durable)
        .expect("durable store")
        .read_marker(ckpt)
        .expect("read marker")
}

/// Restores `ckpt` into a fresh directory and checks every file against `expected`.
fn restore_and_check(durable: &str, ckpt: &str, expected: &[(String, Vec<u8>)]) {
    let store = DurableStore::open(durable).expect("durable store");
    let dest = tempfile::tempdir().expect("tempdir");
    let report = restore_checkpoint(&store, None, ckpt, dest.path(), &|_| {}).expect("restore");
    assert_eq!(report.files.len(), expected.len(), "{report:?}");
    for (rel, data) in expected {
        let got = std::fs::read(dest.path().join(rel)).expect("restored file");
        assert!(got == *data, "{rel} differs after restore");
    }
}

/// Two nodes, one checkpoint: complete only once both parts are in, whoever comes last
/// writes the marker listing every file, and a restore before that names the missing node.
fn two_nodes_complete_only_together(durable: &str) {
    let names = ["nodeA", "nodeB"];
    let a = Node::new("nodeA", &names, durable);
    let b = Node::new("nodeB", &names, durable);
    let mut expected = a.write_checkpoint("/job/ckpt.1", &[0, 1], 10);
    a.agent().drain(Duration::from_secs(30)).expect("drain A");
    assert!(
        marker(durable, "job/ckpt.1").is_none(),
        "complete with one of two parts"
    );
    assert!(!a.complete("/job/ckpt.1"));
    let restore = DurableStore::open(durable).expect("durable");
    let dest = tempfile::tempdir().expect("tempdir");
    let err = restore_checkpoint(&restore, None, "job/ckpt.1", dest.path(), &|_| {})
        .expect_err("a partial checkpoint is refused");
    let text = err.to_string();
    assert!(
        text.contains("parts from 1 of 2 nodes (nodeA)") && text.contains("missing nodeB"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(dest.path()).expect("dest").count(), 0);

    expected.extend(b.write_checkpoint("/job/ckpt.1", &[2, 3], 10));
    b.agent().drain(Duration::from_secs(30)).expect("drain B");
    let m = marker(durable, "job/ckpt.1").expect("the last node completes the checkpoint");
    assert_eq!(m.nodes, names);
    let mut listed: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    listed.sort();
    assert_eq!(
        listed,
        ["rank.0.bin", "rank.1.bin", "rank.2.bin", "rank.3.bin"]
    );
    assert!(b.complete("/job/ckpt.1"));
    // The first node learns it on a later pass.
    a.learns_complete("/job/ckpt.1");
    expected.sort();
    restore_and_check(durable, "job/ckpt.1", &expected);
}

#[test]
fn a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_a_directory() {
    let durable = tempfile::tempdir().expect("tempdir");
    two_nodes_complete_only_together(&durable.path().display().to_string());
}

#[test]
fn a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_s3() {
    let server = Versitygw::start();
    server.create_bucket("jobs");
    two_nodes_complete_only_together(&server.url("jobs"));
}

/// The last two nodes finishing at the same moment, many times: exactly one marker, always
/// listing every file, and every node records the checkpoint complete.
#[test]
fn concurrent_completers_write_one_marker_that_lists_everything() {
    let durable_dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_dir.path().display().to_string();
    let names = ["n1", "n2", "n3"];
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| Node::new(n, &names, &durable))
        .collect();
    for round in 0..20u64 {
        let ckpt = format!("/job/ckpt.{round}");
        // The first node's part is in before the race.
        nodes[0].write_checkpoint(&ckpt, &[0], round);
        nodes[0]
            .agent()
            .drain(Duration::from_secs(30))
            .expect("drain");
        nodes[1].write_checkpoint(&ckpt, &[1], round);
        nodes[2].write_checkpoint(&ckpt, &[2], round);
        let start = Arc::new(Barrier::new(2));
        std::thread::scope(|scope| {
            for node in &nodes[1..] {
                let start = Arc::clone(&start);
                scope.spawn(move || {
                    start.wait();
                    node.agent().drain(Duration::from_secs(30)).expect("drain");
                });
            }
        });
        let key = ckpt.trim_start_matches('/');
        let m = marker(&durable, key).expect("complete after the last parts");
        let mut listed: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
        listed.sort();
        assert_eq!(
            listed,
            ["rank.0.bin", "rank.1.bin", "rank.2.bin"],
            "round {round}"
        );
        assert_eq!(m.nodes, names, "round {round}");
        let markers = std::fs::read_dir(durable_dir.path().join(key))
            .expect("checkpoint dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("cascade-complete"))
            .count();
        assert_eq!(markers, 1, "round {round}");
        for node in &nodes {
            node.learns_complete(&ckpt);
        }
    }
}

/// A node whose part never arrives (its agent is gone): the checkpoint never completes, the
/// others keep it in memory, and the previous complete checkpoint stays restorable.
#[test]
fn a_node_that_never_finishes_leaves_the_checkpoint_incomplete_and_the_previous_one_restorable() {
    let durable_dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_dir.path().display().to_string();
    let names = ["left", "right"];
    let left = Node::new("left", &names, &durable);
    let mut right = Node::new("right", &names, &durable);
    let mut first = left.write_checkpoint("/job/ckpt.1", &[0], 1);
    first.extend(right.write_checkpoint("/job/ckpt.1", &[1], 1));
    left.agent().drain(Duration::from_secs(30)).expect("drain");
    right.agent().drain(Duration::from_secs(30)).expect("drain");
    assert!(marker(&durable, "job/ckpt.1").is_some());
    left.learns_complete("/job/ckpt.1");

    // The right node dies before it drains the second checkpoint.
    right.write_checkpoint("/job/ckpt.2", &[1], 2);
    right.agent.take();
    left.write_checkpoint("/job/ckpt.2", &[0], 2);
    let outcome = left.agent().drain(Duration::from_secs(30)).expect("drain");
    assert_eq!(outcome.other_nodes, 1, "{outcome:?}");
    assert!(marker(&durable, "job/ckpt.2").is_none());
    assert!(!left.complete("/job/ckpt.2"));
    let restore = DurableStore::open(&durable).expect("durable");
    let dest = tempfile::tempdir().expect("tempdir");
    let err = restore_checkpoint(&restore, None, "job/ckpt.2", dest.path(), &|_| {})
        .expect_err("partial");
    assert!(err.to_string().contains("missing right"), "{err}");
    first.sort();
    restore_and_check(&durable, "job/ckpt.1", &first);
}

/// A job with dedup on several nodes is refused at the start, not silently incomplete.
#[test]
fn dedup_on_several_nodes_is_refused_with_one_line() {
    let durable = tempfile::tempdir().expect("tempdir");
    let store_name = format!("/cascade-jobs-test-{}-dedup", std::process::id());
    let cfg = StoreConfig {
        name: store_name.clone(),
        capacity: 16 * CHUNK,
        chunk_size: CHUNK,
        max_files: 16,
        spill: None,
        prefault: Prefault::Off,
    };
    let store = Store::create(&cfg).expect("store");
    let opts = AgentOptions {
        dedup: Some(cascade_agent::DedupOptions {
            chunking: "fixed:64KiB".parse().expect("chunking"),
            compression: cascade_dedup::Compression::None,
            delta: false,
        }),
        job: Some(JobOptions {
            node: "a".into(),
            nodes: 2,
            node_names: Vec::new(),
        }),
        ..AgentOptions::default()
    };
    let durable = DurableStore::open(&durable.path().display().to_string()).expect("durable");
    let err = Agent::start(store, durable, opts)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("not supported yet") && !err.contains('\n'),
        "{err}"
    );
    let _ = Store::destroy_forced(&store_name);
}
