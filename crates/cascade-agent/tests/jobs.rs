//! Checkpoints written by a job on several nodes (docs/agent.md, "Jobs on many nodes"):
//! simulated nodes, each with a node store of its own and an agent that knows its node name
//! and the job's node count, sharing one durable store (a directory, or a real S3 server),
//! in the plain layout or the dedup repository, straight or through a staging server.
//! Passes are driven by the test, so every step is deterministic.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cascade_agent::{
    restore_checkpoint, restore_partial_checkpoint, Agent, AgentOptions, DedupOptions,
    DedupStaging, JobOptions, StagingOptions,
};
use cascade_dedup::repo::{Repo, DEFAULT_PREFIX};
use cascade_durable::{DurableStore, Marker};
use cascade_store::{Prefault, Store, StoreConfig};
use cascade_testkit::{
    pattern, wait_for, with_unreachable_target, write_store_file as write, Env, StageServer,
    Versitygw,
};

const CHUNK: u64 = 64 << 10;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// How the simulated nodes' agents send checkpoints down.
#[derive(Clone)]
enum Via {
    /// The plain layout: files, then the job's marker.
    Plain,
    /// The dedup repository: each node's part manifest, then the job's manifest.
    Dedup,
    /// Through a staging server (address, secret, as packs or chunks), which writes each
    /// node's part manifest into the repository.
    StagedDedup(String, String, DedupStaging),
}

impl Via {
    fn dedup(&self) -> bool {
        !matches!(self, Via::Plain)
    }
}

/// One simulated node: its store and its agent.
struct Node {
    name: String,
    store_name: String,
    store: Option<Store>,
    agent: Option<Agent>,
}

impl Node {
    fn via(name: &str, nodes: &[&str], durable: &str, via: &Via) -> Node {
        Node::with(name, nodes, durable, via, |_| {})
    }

    /// [`Node::via`] with the agent's options changed by `adjust` before it starts.
    fn with(
        name: &str,
        nodes: &[&str],
        durable: &str,
        via: &Via,
        adjust: impl FnOnce(&mut AgentOptions),
    ) -> Node {
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
        let mut opts = AgentOptions {
            retry_min: Duration::from_millis(1),
            job: Some(JobOptions {
                node: name.to_string(),
                nodes: nodes.len() as u32,
                node_names: nodes.iter().map(|n| n.to_string()).collect(),
            }),
            dedup: via.dedup().then(|| DedupOptions {
                chunking: "fixed:16KiB".parse().expect("chunking"),
                compression: cascade_dedup::Compression::Zstd { level: 1 },
                delta: true,
                adaptive: false,
                session_lease: cascade_dedup::repo::DEFAULT_SESSION_LEASE,
            }),
            staging: match via {
                Via::StagedDedup(server, secret, form) => Some(StagingOptions {
                    node: name.to_string(),
                    dedup: *form,
                    ..StagingOptions::new(vec![server.clone()], secret)
                }),
                _ => None,
            },
            ..AgentOptions::default()
        };
        adjust(&mut opts);
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

    /// Runs passes until a staging server holds `ckpt` (its file list, or its packs,
    /// accepted: safe from the loss of this node).
    fn staged(&self, ckpt: &str) {
        self.passes_until(&format!("{}'s part of {ckpt} staged", self.name), || {
            self.store().life_tree(ckpt).expect("life_tree")[0].checkpoint_safe()
        });
    }

    fn complete(&self, ckpt: &str) -> bool {
        self.store().life_tree(ckpt).expect("life_tree")[0].complete()
    }

    /// Runs passes until this node's part of `ckpt` is in the durable store (its files
    /// recorded durable and its part written).
    fn part_in(&self, ckpt: &str, durable: &str) {
        let key = ckpt.trim_start_matches('/');
        self.passes_until(&format!("{}'s part of {ckpt}", self.name), || {
            let parts = open(durable).0.read_parts(key).expect("read parts");
            parts.iter().any(|p| p.node == self.name)
        });
    }

    /// Runs passes until this node records `ckpt` complete (a node whose part went in
    /// before the others' asks again every half second).
    fn learns_complete(&self, ckpt: &str) {
        self.passes_until(&format!("{} to see {ckpt} complete", self.name), || {
            self.complete(ckpt)
        });
    }

    /// Runs this node's agent's passes until `done` (checked after each), for up to 20 s.
    fn passes_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        wait_for(what, Duration::from_secs(20), || {
            self.agent().pass();
            done()
        });
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

/// The durable store and its dedup repository, if there is one.
fn open(durable: &str) -> (Arc<DurableStore>, Option<Repo>) {
    let store = Arc::new(DurableStore::open(durable).expect("durable store"));
    let repo = Repo::open_existing(Arc::clone(&store), DEFAULT_PREFIX).expect("repository");
    (store, repo)
}

/// The files the completion record of `ckpt` lists (its marker, or its dedup manifest), in
/// path order; None while it is not complete.
fn completed_files(durable: &str, ckpt: &str) -> Option<Vec<String>> {
    if let Some(m) = marker(durable, ckpt) {
        return Some(m.files.into_iter().map(|f| f.path).collect());
    }
    let manifest = open(durable)
        .1?
        .read_manifest(ckpt)
        .expect("read manifest")?;
    Some(manifest.files.into_iter().map(|f| f.path).collect())
}

/// Restores `ckpt` into a fresh directory and checks every file against `expected`.
fn restore_and_check(durable: &str, ckpt: &str, expected: &[(String, Vec<u8>)]) {
    let (store, repo) = open(durable);
    let dest = tempfile::tempdir().expect("tempdir");
    let report =
        restore_checkpoint(&store, repo.as_ref(), ckpt, dest.path(), &|_| {}).expect("restore");
    assert_eq!(report.files.len(), expected.len(), "{report:?}");
    for (rel, data) in expected {
        let got = std::fs::read(dest.path().join(rel)).expect("restored file");
        assert!(got == *data, "{rel} differs after restore");
    }
}

/// Two nodes, one checkpoint: complete only once both parts are in, whoever comes last
/// writes the completion record listing every file, and a restore before that names the
/// missing node (a partial restore gives the first node's files).
fn two_nodes_complete_only_together(durable: &str, via: &Via) {
    let names = ["nodeA", "nodeB"];
    let a = Node::via("nodeA", &names, durable, via);
    let b = Node::via("nodeB", &names, durable, via);
    let mut expected = a.write_checkpoint("/job/ckpt.1", &[0, 1], 10);
    a.agent().drain(Duration::from_secs(30)).expect("drain A");
    // Through a server, A's part is in once the server wrote its part manifest.
    a.part_in("/job/ckpt.1", durable);
    assert_eq!(
        completed_files(durable, "job/ckpt.1"),
        None,
        "complete with one of two parts"
    );
    assert!(!a.complete("/job/ckpt.1"));
    let (restore, repo) = open(durable);
    let dest = tempfile::tempdir().expect("tempdir");
    let err = restore_checkpoint(&restore, repo.as_ref(), "job/ckpt.1", dest.path(), &|_| {})
        .expect_err("a partial checkpoint is refused");
    let text = err.to_string();
    assert!(
        text.contains("parts from 1 of 2 nodes (nodeA)") && text.contains("missing nodeB"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(dest.path()).expect("dest").count(), 0);
    let (report, missing) =
        restore_partial_checkpoint(&restore, repo.as_ref(), "job/ckpt.1", dest.path(), &|_| {})
            .expect("partial restore");
    assert_eq!(report.files.len(), 2, "{report:?}");
    assert_eq!(missing.expect("parts missing").missing, ["nodeB"]);
    for (rel, data) in &expected {
        let got = std::fs::read(dest.path().join(rel)).expect("restored file");
        assert!(got == *data, "{rel} differs after a partial restore");
    }

    expected.extend(b.write_checkpoint("/job/ckpt.1", &[2, 3], 10));
    b.agent().drain(Duration::from_secs(30)).expect("drain B");
    b.learns_complete("/job/ckpt.1");
    let listed = completed_files(durable, "job/ckpt.1").expect("the last node completes it");
    assert_eq!(
        listed,
        ["rank.0.bin", "rank.1.bin", "rank.2.bin", "rank.3.bin"]
    );
    if !via.dedup() {
        let m = marker(durable, "job/ckpt.1").expect("marker");
        assert_eq!(m.nodes, names);
    }
    // The first node learns it on a later pass.
    a.learns_complete("/job/ckpt.1");
    expected.sort();
    restore_and_check(durable, "job/ckpt.1", &expected);
}

#[test]
fn a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_a_directory() {
    let durable = tempfile::tempdir().expect("tempdir");
    two_nodes_complete_only_together(&durable.path().display().to_string(), &Via::Plain);
}

#[test]
fn a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_s3() {
    let server = Versitygw::start();
    server.create_bucket("jobs");
    two_nodes_complete_only_together(&server.url("jobs"), &Via::Plain);
}

#[test]
fn with_dedup_a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_a_directory() {
    let durable = tempfile::tempdir().expect("tempdir");
    two_nodes_complete_only_together(&durable.path().display().to_string(), &Via::Dedup);
}

#[test]
fn with_dedup_a_checkpoint_of_two_nodes_is_complete_only_with_both_parts_on_s3() {
    let server = Versitygw::start();
    server.create_bucket("jobs");
    two_nodes_complete_only_together(&server.url("jobs"), &Via::Dedup);
}

#[test]
fn with_dedup_through_a_staging_server_a_checkpoint_of_two_nodes_completes_with_both_parts() {
    for form in [DedupStaging::Packs, DedupStaging::Chunks] {
        let env = Env::new("jobs-staged-dedup", 16 << 20);
        let server_s3 = Versitygw::start();
        server_s3.create_bucket("jobs");
        let durable = server_s3.url("jobs");
        let ssd = env.tmp.path().join("ssd");
        std::fs::create_dir(&ssd).expect("server dir");
        let secret = "jobs-staged-dedup-secret";
        let server = StageServer::start(&env, &ssd, &durable, secret, &[]);
        let via = Via::StagedDedup(server.addr.clone(), secret.to_string(), form);
        two_nodes_complete_only_together(&durable, &via);
        let status = server.status();
        if form == DedupStaging::Chunks {
            assert_eq!(
                status.dedup.manifests_written, 2,
                "the server wrote both nodes' part manifests: {:?}",
                status.dedup
            );
        } else {
            // Each node's packs, index object and part manifest, as files.
            assert!(status.drained_files >= 6, "{status:?}");
        }
    }
}

/// The last two nodes finishing at the same moment, many times: exactly one completion
/// record, always listing every file, and every node records the checkpoint complete.
fn concurrent_completers(via: &Via, rounds: u64) {
    let durable_dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_dir.path().display().to_string();
    let names = ["n1", "n2", "n3"];
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| Node::via(n, &names, &durable, via))
        .collect();
    for round in 0..rounds {
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
        let listed = completed_files(&durable, key).expect("complete after the last parts");
        assert_eq!(
            listed,
            ["rank.0.bin", "rank.1.bin", "rank.2.bin"],
            "round {round}"
        );
        let records_in = |dir: PathBuf| {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            let name = e.file_name().to_string_lossy().into_owned();
                            name.contains("cascade-complete") || name.contains(".json")
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        let (parent, base) = key.rsplit_once('/').expect("a directory checkpoint");
        let manifests = durable_dir
            .path()
            .join(DEFAULT_PREFIX)
            .join("manifests")
            .join(parent);
        let records = records_in(durable_dir.path().join(key))
            + std::fs::read_dir(&manifests)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name().to_string_lossy() == format!("{base}.json"))
                        .count()
                })
                .unwrap_or(0);
        assert_eq!(records, 1, "round {round}");
        for node in &nodes {
            node.learns_complete(&ckpt);
        }
    }
}

/// The staging server is dead (nothing listens): each node stores its part in the durable
/// repository itself, and the checkpoint completes as without servers.
#[test]
fn with_dedup_and_a_dead_staging_server_the_nodes_store_their_parts_themselves() {
    let durable = tempfile::tempdir().expect("tempdir");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = dead.local_addr().expect("addr").to_string();
    drop(dead);
    let via = Via::StagedDedup(addr, "dead-server-secret".to_string(), DedupStaging::Packs);
    two_nodes_complete_only_together(&durable.path().display().to_string(), &via);
}

/// The job's only staging server cannot drain, takes both nodes' parts (as packs), and dies
/// for good: each node's agent, on its own, stores its part from the node once no server
/// has answered for `staging.give_up_after` (1 s; never sooner than the repository's
/// unchecked window, a quarter of its 8 s lease), and the checkpoint completes with both
/// parts and restores.
#[test]
fn with_dedup_and_a_staging_server_that_dies_each_node_stores_its_own_part() {
    let env = Env::new("jobs-staged-gone", 16 << 20);
    let durable_dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_dir.path().display().to_string();
    let ssd = env.tmp.path().join("ssd");
    std::fs::create_dir(&ssd).expect("server dir");
    let secret = "jobs-staged-gone-secret";
    // Its drains fail: what it takes stays on it.
    let mut server = with_unreachable_target(&env, |target| {
        StageServer::start(&env, &ssd, target, secret, &[])
    });
    let via = Via::StagedDedup(server.addr.clone(), secret.to_string(), DedupStaging::Packs);
    let quick = |o: &mut AgentOptions| {
        if let Some(dedup) = o.dedup.as_mut() {
            dedup.session_lease = Duration::from_secs(8);
        }
        if let Some(staging) = o.staging.as_mut() {
            staging.give_up_after = Duration::from_secs(1);
        }
    };
    let names = ["nodeA", "nodeB"];
    let a = Node::with("nodeA", &names, &durable, &via, quick);
    let b = Node::with("nodeB", &names, &durable, &via, quick);
    let mut expected = a.write_checkpoint("/job/ckpt.1", &[0, 1], 30);
    expected.extend(b.write_checkpoint("/job/ckpt.1", &[2, 3], 30));
    a.staged("/job/ckpt.1");
    b.staged("/job/ckpt.1");
    server.kill9();
    assert_eq!(
        open(&durable)
            .0
            .read_parts("job/ckpt.1")
            .expect("parts")
            .len(),
        0
    );

    a.part_in("/job/ckpt.1", &durable);
    assert_eq!(completed_files(&durable, "job/ckpt.1"), None);
    b.part_in("/job/ckpt.1", &durable);
    b.learns_complete("/job/ckpt.1");
    a.learns_complete("/job/ckpt.1");
    for node in [&a, &b] {
        let stats = node.agent().stats();
        assert_eq!(stats.staged_given_up, 1, "{}: {stats:?}", node.name);
    }
    expected.sort();
    restore_and_check(&durable, "job/ckpt.1", &expected);
}

#[test]
fn concurrent_completers_write_one_marker_that_lists_everything() {
    concurrent_completers(&Via::Plain, 20);
}

#[test]
fn with_dedup_concurrent_completers_write_one_manifest_that_lists_everything() {
    concurrent_completers(&Via::Dedup, 10);
}

/// A node whose part never arrives (its agent is gone): the checkpoint never completes, the
/// others keep it in memory, and the previous complete checkpoint stays restorable.
fn a_node_that_never_finishes(via: &Via) {
    let durable_dir = tempfile::tempdir().expect("tempdir");
    let durable = durable_dir.path().display().to_string();
    let names = ["left", "right"];
    let left = Node::via("left", &names, &durable, via);
    let mut right = Node::via("right", &names, &durable, via);
    let mut first = left.write_checkpoint("/job/ckpt.1", &[0], 1);
    first.extend(right.write_checkpoint("/job/ckpt.1", &[1], 1));
    left.agent().drain(Duration::from_secs(30)).expect("drain");
    right.agent().drain(Duration::from_secs(30)).expect("drain");
    assert!(completed_files(&durable, "job/ckpt.1").is_some());
    left.learns_complete("/job/ckpt.1");

    // The right node dies before it drains the second checkpoint.
    right.write_checkpoint("/job/ckpt.2", &[1], 2);
    right.agent.take();
    left.write_checkpoint("/job/ckpt.2", &[0], 2);
    let outcome = left.agent().drain(Duration::from_secs(30)).expect("drain");
    assert_eq!(outcome.other_nodes, 1, "{outcome:?}");
    assert_eq!(completed_files(&durable, "job/ckpt.2"), None);
    assert!(!left.complete("/job/ckpt.2"));
    let (restore, repo) = open(&durable);
    let dest = tempfile::tempdir().expect("tempdir");
    let err = restore_checkpoint(&restore, repo.as_ref(), "job/ckpt.2", dest.path(), &|_| {})
        .expect_err("partial");
    assert!(err.to_string().contains("missing right"), "{err}");
    first.sort();
    restore_and_check(&durable, "job/ckpt.1", &first);
}

#[test]
fn a_node_that_never_finishes_leaves_the_checkpoint_incomplete_and_the_previous_one_restorable() {
    a_node_that_never_finishes(&Via::Plain);
}

#[test]
fn with_dedup_a_node_that_never_finishes_leaves_the_checkpoint_incomplete() {
    a_node_that_never_finishes(&Via::Dedup);
}
