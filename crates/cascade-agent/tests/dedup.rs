//! The agent with dedup on, on real parts: `cascade agent --dedup ... --compress ...` on a
//! node store, a directory as the durable store, `cascade restore`, read-through (FETCH) on a
//! new node whose agent has no dedup setting, and kill -9 of the agent in the middle of
//! storing a checkpoint. No mocks, no sleeps as synchronisation: waits poll the agent's log
//! lines or the durable directory with a deadline.
//!
//! 1. two committed checkpoints sharing most bytes: each is stored in the repository once
//!    (no plain objects), the second adds only the changed chunks; `cascade restore` and a
//!    new node's read-through rebuild every file bit for bit (directory checkpoints, a
//!    single-file checkpoint, directories); a corrupt pack is EIO with nothing left behind;
//! 2. the agent killed with SIGKILL after writing packs of a checkpoint but before its
//!    manifest: the earlier checkpoint still restores, the interrupted one is not complete;
//!    a restarted agent stores it and it restores bit for bit;
//! 3. the quick checkpoint series of bench/datasets, made here by real programs (a PyTorch
//!    training loop, a numpy simulation, LAMMPS): stored through the agent and restored bit
//!    for bit; LAMMPS restarts compress, later torch and numpy snapshots add only part of
//!    their chunks;
//! 4. through two staging servers (`cascade stage-server`), one of them killed with SIGKILL
//!    after acknowledging blobs it could not push yet; before that, a new node reads the
//!    checkpoints through from the servers' chunk stores (manifests not durable yet);
//! 5. deltas (docs/dedup.md, "Delta blobs") on the quick PyTorch series: each checkpoint is
//!    stored against the previous one of its directory, still in the node store (directory
//!    checkpoints, and single files of different names), also by a restarted agent that
//!    reads the previous manifest back; fewer bytes are stored than with `--delta off`, and
//!    every checkpoint restores bit for bit;
//! 6. the agent killed with SIGKILL while storing a checkpoint as deltas (after some of its
//!    packs are written, before its manifest): the base checkpoint still restores, the
//!    interrupted one is not complete, and a restarted agent stores it again as deltas
//!    against the same base; it restores bit for bit;
//! 7. the default configuration (`--dedup on`, nothing else: fixed 64 KiB chunks, the
//!    adaptive zstd level starting at -2, deltas) on the quick PyTorch series: the repository
//!    records that configuration, later checkpoints go as deltas, `cascade status` shows the
//!    level in use, and every checkpoint restores bit for bit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cascade_testkit::*;

const WAIT: Duration = Duration::from_secs(120);
const DEDUP: [(&str, &str); 2] = [
    ("CASCADE_DEDUP", "cdc:avg=16KiB"),
    ("CASCADE_COMPRESS", "zstd:1"),
];
/// [`DEDUP`] through the staging servers as chunks (the default is packs).
const DEDUP_AS_CHUNKS: [(&str, &str); 3] = [
    ("CASCADE_DEDUP", "cdc:avg=16KiB"),
    ("CASCADE_COMPRESS", "zstd:1"),
    ("CASCADE_STAGING_DEDUP", "chunks"),
];

/// Compressible but not constant bytes (about 3x with zstd).
fn text_like(len: usize, seed: u64) -> Vec<u8> {
    let words = [
        "pressure",
        "velocity",
        "0.000125",
        "-3.25e-07",
        "step",
        "rank",
        "\n",
    ];
    let noise = random(len / 4 + 1, seed);
    let mut out = Vec::with_capacity(len + 16);
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(words[noise[i % noise.len()] as usize % words.len()].as_bytes());
        out.push(b' ');
        i += 1;
    }
    out.truncate(len);
    out
}

fn write_checkpoint(env: &Env, ckpt: &str, files: &[(&str, &[u8])]) {
    for (rel, data) in files {
        let path = format!("{ckpt}/{rel}");
        let parent = &path[..path.rfind('/').expect("absolute")];
        env.store()
            .create_dir_all(parent, 0o755)
            .unwrap_or_else(|e| panic!("mkdir {parent}: {e}"));
        env.write(&path, data);
    }
    env.cascade_ok(&["commit", ckpt], &[]);
}

fn wait_complete(agent: &mut Daemon, ckpt: &str) -> String {
    let want = format!("cascade agent: checkpoint {ckpt} complete in the dedup repository");
    agent.wait_line(&want, WAIT, |l| l.starts_with(&want))
}

/// "N of M chunks new" from a completion line.
fn chunks_new(line: &str) -> (u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "chunks")
        .unwrap_or_else(|| panic!("no chunk counts in {line:?}"));
    let num = |w: &str| w.parse::<u64>().unwrap_or_else(|_| panic!("{line:?}"));
    (num(words[at - 3]), num(words[at - 1]))
}

fn packs(durable: &Path) -> Vec<PathBuf> {
    files_below(&durable.join(".cascade-dedup/packs"))
}

/// `cascade restore CKPT DEST --from URL`.
fn restore(env: &Env, ckpt: &str, dest: &Path, url: &str) -> Out {
    let dest = dest.to_str().expect("utf-8");
    env.cascade(&["restore", ckpt, dest, "--from", url], &[])
}

/// [`restore`], asserting success.
fn restore_ok(env: &Env, ckpt: &str, dest: &Path, url: &str) {
    let out = restore(env, ckpt, dest, url);
    assert!(out.ok(), "cascade restore {ckpt} failed: {out}");
}

fn fetch(env: &Env, path: &str) -> String {
    cascade_agent::request(&env.name, &format!("FETCH {path}")).expect("FETCH")
}

#[test]
fn committed_checkpoints_are_stored_once_and_rebuilt_by_restore_and_read_through() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-agent", 96 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let mut agent = env.agent(&url, &DEDUP);

    let model = random(3 << 20, 1);
    let optimizer = text_like(2 << 20, 2);
    let log = text_like(100_000, 3);
    write_checkpoint(
        &env,
        "/run/ck.1",
        &[
            ("model.bin", &model),
            ("opt/state.txt", &optimizer),
            ("log", &log),
        ],
    );
    let first = wait_complete(&mut agent, "/run/ck.1");
    let (new1, all1) = chunks_new(&first);
    assert_eq!(new1, all1, "a first checkpoint is all new: {first}");

    // The next epoch changes 64 KiB of the model and appends to the log.
    let mut model2 = model.clone();
    model2[1 << 20..(1 << 20) + (64 << 10)].copy_from_slice(&random(64 << 10, 9));
    let mut log2 = log.clone();
    log2.extend_from_slice(&text_like(5000, 4));
    write_checkpoint(
        &env,
        "/run/ck.2",
        &[
            ("model.bin", &model2),
            ("opt/state.txt", &optimizer),
            ("log", &log2),
        ],
    );
    let second = wait_complete(&mut agent, "/run/ck.2");
    let (new2, all2) = chunks_new(&second);
    assert!(
        new2 * 10 < all2,
        "the second checkpoint should add only the changed chunks: {second}"
    );
    // A single file as a checkpoint.
    let weights = random(700_000, 5);
    env.write("/weights.pt", &weights);
    env.cascade_ok(&["commit", "/weights.pt"], &[]);
    wait_complete(&mut agent, "/weights.pt");

    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.dedup_checkpoints, 3, "{status:?}");
    assert!(
        status.dedup_stored_bytes < status.dedup_bytes * 3 / 4,
        "repeats and compression should store well under the file bytes: {status:?}"
    );
    stop_agent(&mut agent);

    // Nothing went down in the plain layout: the repository holds it all.
    for plain in ["run/ck.1/model.bin", "run/ck.2/log", "weights.pt"] {
        assert!(
            !durable.path().join(plain).exists(),
            "{plain} was uploaded as a plain object"
        );
    }
    assert!(durable
        .path()
        .join(".cascade-dedup/manifests/run/ck.2.json")
        .is_file());

    // `cascade restore` to a local directory.
    let dest = env.tmp.path().join("restored");
    restore_ok(&env, "run/ck.2", &dest, &url);
    assert!(std::fs::read(dest.join("model.bin")).expect("model") == model2);
    assert!(std::fs::read(dest.join("opt/state.txt")).expect("opt") == optimizer);
    assert!(std::fs::read(dest.join("log")).expect("log") == log2);

    // Read-through on a new node whose agent has no dedup setting.
    let node2 = Env::new("dedup-agent-n2", 96 << 20);
    let mut reader = node2.agent(&url, &[]);
    assert_eq!(fetch(&node2, "/run"), "OK");
    assert_eq!(fetch(&node2, "/run/ck.1/opt"), "OK");
    assert_eq!(fetch(&node2, "/run/ck.1/opt/state.txt"), "OK");
    assert_eq!(fetch(&node2, "/run/ck.1/model.bin"), "OK");
    assert_eq!(fetch(&node2, "/weights.pt"), "OK");
    assert!(node2.read("/run/ck.1/model.bin") == model);
    assert!(node2.read("/run/ck.1/opt/state.txt") == optimizer);
    assert!(node2.read("/weights.pt") == weights);
    assert!(
        fetch(&node2, "/run/ck.3/model.bin").starts_with("ERR 2 "),
        "a file no manifest holds is ENOENT"
    );
    let levels = node2.levels();
    assert!(
        levels_line(&levels, "/run/ck.1/model.bin").is_some_and(|l| l.contains("durable")),
        "a fetched file is recorded durable, not sent back down:\n{levels}"
    );

    // Corrupt packs (a byte flipped every 256 bytes of the blobs, so every blob is hit):
    // every file fails with EIO and leaves nothing in the store.
    for pack in packs(durable.path()) {
        let mut data = std::fs::read(&pack).expect("pack");
        let n = u32::from_le_bytes(data[data.len() - 12..data.len() - 8].try_into().expect("4"));
        let blobs_end = data.len() - 12 - 48 * n as usize;
        for at in (0..blobs_end).step_by(256) {
            data[at] ^= 0xff;
        }
        std::fs::write(&pack, data).expect("write pack");
    }
    let reply = fetch(&node2, "/run/ck.2/model.bin");
    assert!(reply.starts_with("ERR 5 "), "{reply}\n{}", reader.log());
    assert!(
        node2.ls("/run/ck.2").is_empty(),
        "a failed fetch left files behind: {:?}",
        node2.ls("/run/ck.2")
    );
    stop_agent(&mut reader);
}

#[test]
fn agent_killed_while_storing_a_checkpoint_loses_nothing_complete() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-kill", 160 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let mut agent = env.agent(&url, &DEDUP);
    let first = random(4 << 20, 11);
    write_checkpoint(&env, "/ck.1", &[("state.bin", &first)]);
    wait_complete(&mut agent, "/ck.1");
    let packs_before = packs(durable.path()).len();

    // Big enough to fill many packs before its manifest.
    let big: Vec<Vec<u8>> = (0..3).map(|i| random(24 << 20, 20 + i)).collect();
    let manifest = durable.path().join(".cascade-dedup/manifests/ck.2.json");
    write_checkpoint(
        &env,
        "/ck.2",
        &[("a.bin", &big[0]), ("b.bin", &big[1]), ("c.bin", &big[2])],
    );
    wait_for("a pack of /ck.2 in the durable store", WAIT, || {
        packs(durable.path()).len() > packs_before
    });
    agent.kill9();
    assert!(
        !manifest.exists(),
        "the manifest was written before the agent was killed; the test needs a bigger checkpoint"
    );

    // The earlier checkpoint is intact; the interrupted one is not complete.
    let dest = env.tmp.path().join("r1");
    restore_ok(&env, "ck.1", &dest, &url);
    assert!(std::fs::read(dest.join("state.bin")).expect("state") == first);
    let refused = restore(&env, "ck.2", &env.tmp.path().join("r2"), &url);
    assert!(
        !refused.ok(),
        "an interrupted checkpoint restored: {refused}"
    );

    // A new agent stores it again, and it restores bit for bit.
    let mut agent2 = env.agent(&url, &DEDUP);
    wait_complete(&mut agent2, "/ck.2");
    stop_agent(&mut agent2);
    let dest2 = env.tmp.path().join("r2");
    restore_ok(&env, "ck.2", &dest2, &url);
    for (name, data) in ["a.bin", "b.bin", "c.bin"].iter().zip(&big) {
        assert!(
            std::fs::read(dest2.join(name)).expect("restored") == *data,
            "{name} differs"
        );
    }
}

fn wait_line_with(agent: &mut Daemon, what: &str) -> String {
    agent.wait_line(what, WAIT, |l| l.starts_with(what))
}

/// An agent of `env` with settings `extra` that sends through `servers` (sharing `secret`).
fn agent_through(
    env: &Env,
    url: &str,
    secret: &str,
    servers: &[&StageServer],
    extra: &[(&str, &str)],
) -> Daemon {
    let list: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    let list = list.join(",");
    let mut envs = vec![
        ("CASCADE_STAGING", list.as_str()),
        ("CASCADE_STAGING_SECRET", secret),
    ];
    envs.extend_from_slice(extra);
    env.agent(url, &envs)
}

/// "N of M blobs sent" from a "pushed to the staging servers as chunks" line.
fn blobs_sent(line: &str) -> (u64, u64) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "blobs")
        .unwrap_or_else(|| panic!("no blob counts in {line:?}"));
    let num = |w: &str| w.parse::<u64>().unwrap_or_else(|_| panic!("{line:?}"));
    (num(words[at - 3]), num(words[at - 1]))
}

/// A staging server on `ssd` whose durable store is a directory that then becomes a file:
/// nothing it holds reaches the durable store until it is restarted with another target.
fn cut_off_server(env: &Env, ssd: &Path, secret: &str) -> StageServer {
    with_unreachable_target(env, |target| {
        StageServer::start(env, ssd, target, secret, &[])
    })
}

/// A node (`Env` named `name`, 96 MiB store) with a durable directory and a staging server's
/// SSD directory in its temporary directory, both made: (env, its temporary directory, the
/// durable directory, the SSD directory, the durable store's URL).
fn rig(name: &str) -> (Env, PathBuf, PathBuf, PathBuf, String) {
    let env = Env::new(name, 96 << 20);
    let root = env.tmp.path().to_path_buf();
    let (durable, ssd) = (root.join("durable"), root.join("ssd"));
    for d in [&durable, &ssd] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let url = durable.to_str().expect("utf-8").to_string();
    (env, root, durable, ssd, url)
}

/// Checkpoints /ck.1 (a 3 MiB model and 1 MiB of text) and /ck.2 (the same, 10,000 bytes
/// of the model changed), each committed once the agent logged the line `line(ckpt)` for
/// the one before.
struct TwoCheckpoints {
    /// The agent's line for each.
    lines: [String; 2],
    files: [[(&'static str, Vec<u8>); 2]; 2],
}

fn two_checkpoints(
    env: &Env,
    agent: &mut Daemon,
    seed: u64,
    line: impl Fn(&str) -> String,
) -> TwoCheckpoints {
    let model = random(3 << 20, seed);
    let text = text_like(1 << 20, seed + 1);
    let mut model2 = model.clone();
    model2[2 << 20..(2 << 20) + 10_000].copy_from_slice(&random(10_000, seed + 2));
    let files = [
        [("model.bin", model), ("notes.txt", text.clone())],
        [("model.bin", model2), ("notes.txt", text)],
    ];
    let lines = ["/ck.1", "/ck.2"].map(|ck| ck.to_string());
    let lines = [0, 1].map(|i| {
        let borrowed: Vec<(&str, &[u8])> = files[i].iter().map(|(n, d)| (*n, &d[..])).collect();
        write_checkpoint(env, &lines[i], &borrowed);
        wait_line_with(agent, &line(&lines[i]))
    });
    TwoCheckpoints { lines, files }
}

impl TwoCheckpoints {
    /// `cascade restore` of both from `url` gives their files bit for bit.
    fn assert_restore(&self, env: &Env, url: &str) {
        for (ck, files) in ["ck.1", "ck.2"].iter().zip(&self.files) {
            let dest = env.tmp.path().join(format!("restored-{ck}"));
            restore_ok(env, ck, &dest, url);
            for (file, want) in files {
                let got = std::fs::read(dest.join(file)).expect("restored file");
                assert!(got == *want, "{ck}/{file} differs");
            }
        }
    }
}

/// 3. Through two staging servers: chunks are cut and scored on the node, each blob goes to
///    the server owning its score and only if it lacks it; server A cannot reach the durable
///    store, so nothing completes; A is killed with SIGKILL and restarted with a good target:
///    it pushes every blob it acknowledged, the manifests are written, the agent records the
///    checkpoints complete, and both restore bit for bit.
#[test]
fn through_staging_servers_blobs_are_sent_once_and_a_killed_server_loses_none() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-stage", 96 << 20);
    let root = env.tmp.path().to_path_buf();
    let durable = root.join("durable");
    for d in [&durable, &root.join("ssd-a"), &root.join("ssd-b")] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let url = durable.to_str().expect("utf-8").to_string();
    let secret = "dedup-staging-test-secret";
    // Every push of A fails until it is restarted.
    let mut a = cut_off_server(&env, &root.join("ssd-a"), secret);
    let b = StageServer::start(&env, &root.join("ssd-b"), &url, secret, &[]);
    let mut agent = agent_through(&env, &url, secret, &[&a, &b], &DEDUP_AS_CHUNKS);

    let two = two_checkpoints(&env, &mut agent, 31, |ck| {
        format!("cascade agent: checkpoint {ck} pushed to the staging servers as chunks")
    });
    let (sent1, all1) = blobs_sent(&two.lines[0]);
    assert_eq!(sent1, all1, "{}", two.lines[0]);
    let (sent2, all2) = blobs_sent(&two.lines[1]);
    assert!(
        sent2 * 5 < all2,
        "only the changed blobs go out again: {}",
        two.lines[1]
    );
    let status = a.status();
    assert!(status.pending_files == 0, "{status:?}");
    assert!(
        !durable.join(".cascade-dedup/manifests/ck.1.json").exists()
            && !durable.join(".cascade-dedup/manifests/ck.2.json").exists(),
        "a manifest was written while A could not push its blobs"
    );

    // A new node (no dedup setting) reads the checkpoints through: the manifests are only on
    // a server, the blobs on A's SSD or already in the repository (B pushed its own).
    let node2 = Env::new("dedup-stage-n2", 96 << 20);
    let mut reader = agent_through(&node2, &url, secret, &[&a, &b], &[]);
    for (ck, files) in ["/ck.1", "/ck.2"].iter().zip(&two.files) {
        for (file, want) in files {
            let path = format!("{ck}/{file}");
            assert_eq!(fetch(&node2, &path), "OK", "{path}\n{}", reader.log());
            assert!(node2.read(&path) == *want, "{path}");
            wait_line_with(&mut reader, &format!("cascade agent: fetched {path} ("));
        }
    }
    assert!(
        reader.log().contains("verified) from a staging server"),
        "{}",
        reader.log()
    );
    assert!(
        fetch(&node2, "/ck.3/model.bin").starts_with("ERR 2 "),
        "a file no manifest holds is ENOENT"
    );
    stop_agent(&mut reader);

    a.kill9();
    a.restart(&env, &url);
    for ck in ["/ck.1", "/ck.2"] {
        wait_line_with(
            &mut agent,
            &format!(
                "cascade agent: checkpoint {ck} complete in the dedup repository (written by a \
                 staging server)"
            ),
        );
    }
    stop_agent(&mut agent);
    two.assert_restore(&env, &url);
    drop(b);
}

/// Through a staging server as packs (the default): the node builds packs, index object and
/// manifest and stages them as files; the server cannot reach the durable store, so nothing
/// of the repository appears there although both checkpoints are staged (the second adds
/// only its changed chunks). The agent and the server are then killed with SIGKILL, and the
/// server restarted with a good target: with no agent running it drains the packs and writes
/// the index objects and manifests, which restore bit for bit; the repository holds no
/// checksum or version objects. A restarted agent records both checkpoints complete.
#[test]
fn through_a_staging_server_as_packs_a_checkpoint_survives_the_loss_of_the_node() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-packs", 96 << 20);
    let root = env.tmp.path().to_path_buf();
    let durable = root.join("durable");
    for d in [&durable, &root.join("ssd")] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let url = durable.to_str().expect("utf-8").to_string();
    let secret = "dedup-packs-test-secret";
    // Every drain fails until the server is restarted.
    let mut server = cut_off_server(&env, &root.join("ssd"), secret);
    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP);

    let two = two_checkpoints(&env, &mut agent, 51, |ck| {
        format!("cascade agent: checkpoint {ck} staged as packs on ")
    });
    let (new1, all1) = chunks_new(&two.lines[0]);
    assert_eq!(new1, all1, "{}", two.lines[0]);
    let (new2, all2) = chunks_new(&two.lines[1]);
    assert!(
        new2 * 5 < all2,
        "only the changed chunks are stored again: {}\n{}",
        two.lines[1],
        agent.log()
    );
    assert!(
        packs(&durable).is_empty()
            && !durable.join(".cascade-dedup/manifests/ck.1.json").exists()
            && !durable.join(".cascade-dedup/manifests/ck.2.json").exists(),
        "the repository got objects while the server could not drain"
    );
    assert!(
        !agent.log().contains("complete in the dedup repository"),
        "{}",
        agent.log()
    );

    // The node is lost: only the server holds the checkpoints.
    agent.kill9();
    server.kill9();
    server.restart(&env, &url);
    let manifests = [
        durable.join(".cascade-dedup/manifests/ck.1.json"),
        durable.join(".cascade-dedup/manifests/ck.2.json"),
    ];
    assert!(
        wait_until(WAIT, || manifests.iter().all(|m| m.exists())),
        "the restarted server wrote no manifests"
    );
    two.assert_restore(&env, &url);
    let sidecars: Vec<PathBuf> = files_below(&durable.join(".cascade-dedup"))
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".blake3") || name.contains(".cascade-version")
        })
        .collect();
    assert!(sidecars.is_empty(), "{sidecars:?}");

    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP);
    for ck in ["/ck.1", "/ck.2"] {
        wait_line_with(
            &mut agent,
            &format!(
                "cascade agent: checkpoint {ck} complete in the dedup repository (written by a \
                 staging server)"
            ),
        );
    }
    stop_agent(&mut agent);
}

/// A server killed with SIGKILL while it holds a checkpoint staged as packs: the next
/// checkpoint cannot be staged and is stored in the durable repository by the node, from a
/// repository reloaded from the durable store (the node's index named the first one's packs,
/// only staged), so it restores bit for bit. The server then comes back with its SSD wiped:
/// it no longer knows the first checkpoint, the agent says so in one line and stores that
/// one itself too; it restores bit for bit.
#[test]
fn checkpoints_staged_as_packs_on_a_server_that_died_are_stored_from_the_node() {
    let (_serial, _) = begin();
    let (env, root, _, ssd, url) = rig("dedup-packs-lost");
    let secret = "dedup-packs-lost-secret";
    let mut server = cut_off_server(&env, &ssd, secret);
    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP);
    let model = random(2 << 20, 61);
    write_checkpoint(&env, "/ck.1", &[("model.bin", &model)]);
    wait_line_with(
        &mut agent,
        "cascade agent: checkpoint /ck.1 staged as packs on ",
    );

    server.kill9();
    let mut model2 = model.clone();
    model2[..10_000].copy_from_slice(&random(10_000, 62));
    write_checkpoint(&env, "/ck.2", &[("model.bin", &model2)]);
    wait_line_with(
        &mut agent,
        "cascade agent: sending /ck.2 to the staging servers failed",
    );
    wait_complete(&mut agent, "/ck.2");
    // From the durable store alone, while ck.1's packs exist nowhere but on the dead server.
    let restored = |ck: &str| {
        let dest = root.join(format!("restored-{ck}"));
        restore_ok(&env, ck, &dest, &url);
        std::fs::read(dest.join("model.bin")).expect("restored")
    };
    assert!(restored("ck.2") == model2, "ck.2 differs");

    std::fs::remove_dir_all(&ssd).expect("wipe the server's SSD");
    std::fs::create_dir_all(&ssd).expect("dir");
    server.restart(&env, &url);
    wait_line_with(
        &mut agent,
        "cascade agent: no staging server knows checkpoint /ck.1 any more",
    );
    wait_complete(&mut agent, "/ck.1");
    stop_agent(&mut agent);
    assert!(restored("ck.1") == model, "ck.1 differs");
}

/// A server killed with SIGKILL, and not restarted, while it holds two checkpoints it could
/// not drain (the second deduped against the first): once no server has answered for one
/// for `staging.give_up_after` (1 s here), and not sooner than a server may write a staged
/// manifest unchecked after its push (2 s: the repository was created with an 8 s session
/// lease), the agent says so in one line and stores it from the node; both restore bit for
/// bit. The server, back later with its SSD and a good target, checks its staged manifests
/// before writing them (their pushes are from before its restart) and writes them over the
/// node's; both still restore bit for bit. `form`: the settings of the staging form, and
/// the agent's line for a checkpoint staged.
fn checkpoints_on_a_server_that_stays_down(name: &str, form: &[(&str, &str)], staged: &str) {
    let (_serial, _) = begin();
    let (env, _, durable, ssd, url) = rig(name);
    let secret = "dedup-server-down-secret";
    let mut server = cut_off_server(&env, &ssd, secret);
    let mut settings = form.to_vec();
    settings.extend([
        ("CASCADE_DEDUP_SESSION_LEASE", "8"),
        ("CASCADE_STAGING_GIVE_UP_AFTER", "1"),
    ]);
    let mut agent = agent_through(&env, &url, secret, &[&server], &settings);
    let two = two_checkpoints(&env, &mut agent, 81, |ck| {
        format!("cascade agent: checkpoint {ck} {staged}")
    });
    server.kill9();

    for ck in ["/ck.1", "/ck.2"] {
        let line = wait_line_with(
            &mut agent,
            &format!("cascade agent: no staging server has answered for checkpoint {ck} in "),
        );
        let silent = seconds_after(&line, &format!("checkpoint {ck} in "));
        assert!(
            silent >= 2.0,
            "gave up while the server may still write the manifest unchecked: {line}"
        );
        wait_complete(&mut agent, ck);
    }
    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.staged_given_up, 2, "{status:?}");
    let manifests = [
        durable.join(".cascade-dedup/manifests/ck.1.json"),
        durable.join(".cascade-dedup/manifests/ck.2.json"),
    ];
    let written_by_node: Vec<Vec<u8>> = manifests
        .iter()
        .map(|m| std::fs::read(m).expect("the node's manifest"))
        .collect();
    two.assert_restore(&env, &url);

    server.restart(&env, &url);
    let rewritten = || {
        manifests
            .iter()
            .zip(&written_by_node)
            .all(|(m, node)| std::fs::read(m).is_ok_and(|now| now != *node))
    };
    assert!(
        wait_until(WAIT, rewritten),
        "the server did not write its manifests\n{}",
        server.log()
    );
    stop_agent(&mut agent);
    two.assert_restore(&env, &url);
}

#[test]
fn checkpoints_staged_as_packs_on_a_server_that_stays_down_are_stored_from_the_node() {
    checkpoints_on_a_server_that_stays_down("dedup-packs-down", &DEDUP, "staged as packs on ");
}

#[test]
fn checkpoints_pushed_as_chunks_to_a_server_that_stays_down_are_stored_from_the_node() {
    checkpoints_on_a_server_that_stays_down(
        "dedup-chunks-down",
        &DEDUP_AS_CHUNKS,
        "pushed to the staging servers as chunks",
    );
}

/// A checkpoint staged as packs whose manifest names packs of an earlier checkpoint, on a
/// server cut off from the durable store; the agent and the server are killed with SIGKILL;
/// meanwhile the writer's session is gone (as once its lease ran out) and a prune deletes
/// the earlier checkpoint's packs. The server, restarted with a good target, checks the
/// manifest before writing it (its push is from before the restart), drains the packs but
/// refuses the manifest and its index object, in one line; the restarted agent hears that no
/// server knows the checkpoint and stores it from the node; it restores bit for bit, every
/// time (a restore picks among copies of a blob by the order it loads index objects in).
#[test]
fn a_staged_manifest_naming_packs_a_prune_deleted_is_refused_and_stored_from_the_node() {
    let (_serial, _) = begin();
    let (env, root, durable, ssd, url) = rig("dedup-packs-gc");
    let secret = "dedup-packs-gc-secret";
    let mut server = StageServer::start(&env, &ssd, &url, secret, &[]);
    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP);
    let model = random(2 << 20, 71);
    write_checkpoint(&env, "/ck.1", &[("model.bin", &model)]);
    wait_complete(&mut agent, "/ck.1");
    let ck1_packs = packs(&durable);

    with_unreachable_target(&env, |target| server.restart(&env, target));
    let mut model2 = model.clone();
    model2[..10_000].copy_from_slice(&random(10_000, 72));
    write_checkpoint(&env, "/ck.2", &[("model.bin", &model2)]);
    let staged = wait_line_with(
        &mut agent,
        "cascade agent: checkpoint /ck.2 staged as packs on ",
    );
    let (new2, all2) = chunks_new(&staged);
    assert!(new2 * 5 < all2, "ck.2 dedups against ck.1: {staged}");
    agent.kill9();
    server.kill9();

    for session in files_below(&durable.join(".cascade-dedup/sessions")) {
        std::fs::remove_file(&session).expect("end the dead agent's session");
    }
    let pruned = env.cascade(&["prune", "ck.1", "--durable", &url], &[]);
    assert!(pruned.ok(), "{pruned}");
    let left = packs(&durable);
    assert!(
        ck1_packs.iter().any(|p| !left.contains(p)),
        "the prune deleted none of ck.1's packs: {pruned}"
    );

    server.restart(&env, &url);
    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP);
    wait_line_with(
        &mut agent,
        "cascade agent: no staging server knows checkpoint /ck.2 any more",
    );
    wait_complete(&mut agent, "/ck.2");
    stop_agent(&mut agent);
    let log = server.log();
    assert!(
        log.contains("manifest of ck.2 not written: pack")
            && log.contains("is not in the durable store (garbage collection deleted it)"),
        "{log}"
    );
    // The staged manifest is let go once the node's is in the durable store.
    assert!(
        wait_until(WAIT, || server.log().contains(
            "ck.2.json: its manifest was written without this server"
        )),
        "{}",
        server.log()
    );
    // Several times: a restore loads the index objects in no set order (with the refused
    // push's index object written, its delta blobs, whose bases were deleted, were read one
    // time in two before the index preferred copies it can rebuild).
    for i in 0..4 {
        let dest = root.join(format!("restored-ck.2-{i}"));
        restore_ok(&env, "ck.2", &dest, &url);
        assert!(
            std::fs::read(dest.join("model.bin")).expect("restored") == model2,
            "ck.2 differs"
        );
    }
}

/// A staging server whose dedup chunk store is full (`--chunk-capacity`) refuses the chunks;
/// the agent says so in one line and stores the checkpoint in the durable repository itself,
/// from where it restores bit for bit.
#[test]
fn a_full_staging_chunk_store_sends_the_checkpoint_to_the_durable_store_instead() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-stage-full", 96 << 20);
    let root = env.tmp.path().to_path_buf();
    let durable = root.join("durable");
    for d in [&durable, &root.join("ssd")] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let url = durable.to_str().expect("utf-8").to_string();
    let secret = "dedup-staging-full-secret";
    let server = StageServer::start(
        &env,
        &root.join("ssd"),
        &url,
        secret,
        &["--chunk-capacity", "1MiB", "--chunk-segment-size", "1MiB"],
    );
    let mut agent = agent_through(&env, &url, secret, &[&server], &DEDUP_AS_CHUNKS);
    let model = random(4 << 20, 41);
    write_checkpoint(&env, "/full.1", &[("model.bin", &model)]);
    let refused = wait_line_with(
        &mut agent,
        "cascade agent: sending /full.1 to the staging servers failed",
    );
    assert!(
        refused.contains("staging chunk store") && refused.contains("is full"),
        "{refused}"
    );
    wait_complete(&mut agent, "/full.1");
    let s = server.status().dedup;
    assert!(s.segment_bytes <= 1 << 20, "{s:?}");
    stop_agent(&mut agent);
    let dest = root.join("restored");
    restore_ok(&env, "full.1", &dest, &url);
    assert!(std::fs::read(dest.join("model.bin")).expect("restored") == model);
}

/// The files of a snapshot directory, relative paths sorted.
fn relative_files_below(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = files_below(dir)
        .iter()
        .map(|p| {
            p.strip_prefix(dir)
                .expect("below")
                .to_str()
                .expect("utf-8")
                .to_string()
        })
        .collect();
    files.sort();
    files
}

#[test]
fn real_checkpoint_series_are_stored_and_restored_bit_for_bit() {
    let (_serial, _) = begin();
    let series_dir = tempfile::tempdir().expect("series dir");
    real_series::make_quick(series_dir.path(), &["torch", "numpy", "lammps"]);

    let env = Env::new("dedup-real", 256 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let mut agent = env.agent(&url, &DEDUP);
    let mut stored: Vec<(String, String)> = Vec::new();
    for series in ["torch", "numpy", "lammps"] {
        let before = cascade_agent::status(&env.name).expect("status");
        let snaps = real_series::snapshots(series_dir.path(), series);
        assert_eq!(snaps.len(), 3, "{series}: {snaps:?}");
        let mut added = Vec::new();
        for snap in &snaps {
            let name = snap.file_name().expect("name").to_string_lossy();
            let ckpt = format!("/{series}/{name}");
            let files: Vec<(String, Vec<u8>)> = relative_files_below(snap)
                .into_iter()
                .map(|rel| {
                    let data = std::fs::read(snap.join(&rel)).expect("snapshot file");
                    (rel, data)
                })
                .collect();
            let refs: Vec<(&str, &[u8])> = files
                .iter()
                .map(|(r, d)| (r.as_str(), d.as_slice()))
                .collect();
            write_checkpoint(&env, &ckpt, &refs);
            added.push(chunks_new(&wait_complete(&mut agent, &ckpt)));
            stored.push((
                ckpt[1..].to_string(),
                snap.to_str().expect("utf-8").to_string(),
            ));
        }
        let after = cascade_agent::status(&env.name).expect("status");
        let bytes = after.dedup_bytes - before.dedup_bytes;
        let kept = after.dedup_stored_bytes - before.dedup_stored_bytes;
        match series {
            // Every atom moves every step: no chunk repeats, but doubles holding small
            // integers compress about 1.7x.
            "lammps" => assert!(
                kept * 3 < bytes * 2,
                "lammps: {kept} of {bytes} bytes stored"
            ),
            // A frozen layer, untouched embedding rows (torch), static masks and untouched
            // cells (numpy): later snapshots repeat part of their chunks.
            _ => {
                for (i, (new, all)) in added.iter().enumerate().skip(1) {
                    assert!(
                        new < all,
                        "{series} snapshot {i}: {new} of {all} chunks new"
                    );
                }
                // Whole-file zstd -3 alone keeps 63 % of the torch bytes; per chunk, zstd 1
                // keeps 12 % of numpy's.
                let most = if series == "torch" {
                    bytes * 58 / 100
                } else {
                    bytes * 15 / 100
                };
                assert!(kept < most, "{series}: {kept} of {bytes} bytes stored");
            }
        }
    }
    stop_agent(&mut agent);

    for (ckpt, source) in &stored {
        let dest = env.tmp.path().join("restored").join(ckpt);
        restore_ok(&env, ckpt, &dest, &url);
        let source = Path::new(source);
        let files = relative_files_below(source);
        assert_eq!(relative_files_below(&dest), files, "{ckpt}: restored files");
        for rel in files {
            assert!(
                std::fs::read(dest.join(&rel)).expect("restored")
                    == std::fs::read(source.join(&rel)).expect("source"),
                "{ckpt}/{rel} differs"
            );
        }
    }
}

/// From a completion line: how many chunks were stored as deltas, and against which
/// checkpoint; None if the line names no base.
fn deltas_against(line: &str) -> Option<(u64, String)> {
    let (before, after) = line.split_once(" as deltas against ")?;
    let count = before.rsplit(' ').next()?.parse().ok()?;
    let base = after.split([',', ' ']).next()?.to_string();
    Some((count, base))
}

/// Asserts that completion line `line` names `base` and stored some chunks as deltas on it;
/// how many.
fn assert_deltas_against(line: &str, base: &str) -> u64 {
    let (deltas, named) = deltas_against(line).unwrap_or_else(|| panic!("no deltas: {line}"));
    assert_eq!(named, base, "{line}");
    assert!(deltas > 0, "{line}");
    deltas
}

/// The model.pt of each of the three snapshots of the quick PyTorch series, made by a real
/// training loop (bench/datasets/make.sh --quick).
fn quick_torch_models() -> Vec<Vec<u8>> {
    let series_dir = tempfile::tempdir().expect("series dir");
    real_series::make_quick(series_dir.path(), &["torch"]);
    let models: Vec<Vec<u8>> = real_series::snapshots(series_dir.path(), "torch")
        .iter()
        .map(|snap| std::fs::read(snap.join("model.pt")).expect("model.pt"))
        .collect();
    assert_eq!(models.len(), 3);
    models
}

#[test]
fn later_checkpoints_are_stored_as_deltas_against_the_previous_one_in_memory() {
    let (_serial, _) = begin();
    let models = quick_torch_models();

    // The series stored without deltas, for comparison.
    let plain_env = Env::new("dedup-nodelta", 256 << 20);
    let plain_durable = tempfile::tempdir().expect("durable dir");
    let plain_url = plain_durable.path().to_str().expect("utf-8").to_string();
    let no_delta = [DEDUP[0], DEDUP[1], ("CASCADE_DEDUP_DELTA", "off")];
    let mut agent = plain_env.agent(&plain_url, &no_delta);
    for (i, model) in models.iter().enumerate() {
        let ckpt = format!("/torch/snap-{i:02}");
        write_checkpoint(&plain_env, &ckpt, &[("model.pt", model)]);
        let line = wait_complete(&mut agent, &ckpt);
        assert_eq!(deltas_against(&line), None, "{line}");
    }
    let without = cascade_agent::status(&plain_env.name).expect("status");
    assert_eq!(without.dedup_delta_chunks, 0, "{without:?}");
    stop_agent(&mut agent);

    let env = Env::new("dedup-delta", 256 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let mut agent = env.agent(&url, &DEDUP);
    write_checkpoint(&env, "/torch/snap-00", &[("model.pt", &models[0])]);
    let first = wait_complete(&mut agent, "/torch/snap-00");
    assert_eq!(deltas_against(&first), None, "nothing before it: {first}");
    write_checkpoint(&env, "/torch/snap-01", &[("model.pt", &models[1])]);
    let second = wait_complete(&mut agent, "/torch/snap-01");
    let deltas = assert_deltas_against(&second, "/torch/snap-00");
    let with = cascade_agent::status(&env.name).expect("status");
    assert_eq!(with.dedup_delta_chunks, deltas, "{with:?}");
    stop_agent(&mut agent);

    // A restarted agent knows no manifest yet: it reads snap-01's back from the repository.
    let mut agent = env.agent(&url, &DEDUP);
    write_checkpoint(&env, "/torch/snap-02", &[("model.pt", &models[2])]);
    let third = wait_complete(&mut agent, "/torch/snap-02");
    assert_deltas_against(&third, "/torch/snap-01");
    let restarted = cascade_agent::status(&env.name).expect("status");
    let stored = with.dedup_stored_bytes + restarted.dedup_stored_bytes;
    eprintln!(
        "torch quick series: {stored} bytes stored with deltas, {} without",
        without.dedup_stored_bytes
    );
    assert!(
        stored * 100 < without.dedup_stored_bytes * 90,
        "with deltas {stored} bytes stored, without {}",
        without.dedup_stored_bytes
    );

    stop_agent(&mut agent);

    // Single-file checkpoints of one directory, named per epoch (in a repository of their
    // own: this one has their chunks already).
    let files_env = Env::new("dedup-delta-files", 256 << 20);
    let files_durable = tempfile::tempdir().expect("durable dir");
    let files_url = files_durable.path().to_str().expect("utf-8").to_string();
    let mut agent = files_env.agent(&files_url, &DEDUP);
    files_env
        .store()
        .create_dir_all("/weights", 0o755)
        .expect("mkdir /weights");
    for (i, model) in models.iter().take(2).enumerate() {
        let path = format!("/weights/model-{i}.pt");
        files_env.write(&path, model);
        files_env.cascade_ok(&["commit", &path], &[]);
        let line = wait_complete(&mut agent, &path);
        if i == 1 {
            assert_deltas_against(&line, "/weights/model-0.pt");
        }
    }
    stop_agent(&mut agent);
    let dest = files_env.tmp.path().join("restored");
    restore_ok(&files_env, "weights/model-1.pt", &dest, &files_url);
    assert!(std::fs::read(dest.join("model-1.pt")).expect("restored") == models[1]);

    for (i, model) in models.iter().enumerate() {
        let dest = env.tmp.path().join(format!("restored-{i}"));
        restore_ok(&env, &format!("torch/snap-{i:02}"), &dest, &url);
        assert!(
            std::fs::read(dest.join("model.pt")).expect("restored") == *model,
            "snap-{i:02} differs"
        );
    }
}

/// Through two staging servers, with the default dedup settings, each checkpoint of a real
/// PyTorch series after the first goes as deltas against the previous one (complete, so in
/// the repository); server A is killed with SIGKILL right after acknowledging the second and
/// restarted: every checkpoint completes and restores bit for bit, and the adaptive level
/// learnt from each checkpoint the servers made durable.
#[test]
fn through_staging_servers_later_checkpoints_go_as_deltas_and_a_killed_server_loses_none() {
    let (_serial, _) = begin();
    let models = quick_torch_models();
    let env = Env::new("dedup-stage-delta", 256 << 20);
    let root = env.tmp.path().to_path_buf();
    let durable = root.join("durable");
    for d in [&durable, &root.join("ssd-a"), &root.join("ssd-b")] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let url = durable.to_str().expect("utf-8").to_string();
    let secret = "dedup-staging-delta-secret";
    let mut a = StageServer::start(&env, &root.join("ssd-a"), &url, secret, &[]);
    let b = StageServer::start(&env, &root.join("ssd-b"), &url, secret, &[]);
    let mut agent = agent_through(
        &env,
        &url,
        secret,
        &[&a, &b],
        &[("CASCADE_DEDUP", "on"), ("CASCADE_STAGING_DEDUP", "chunks")],
    );
    let pushed = |i: usize| {
        format!(
            "cascade agent: checkpoint /torch/snap-{i:02} pushed to the staging servers as chunks"
        )
    };
    let absorbed = |servers: &[&StageServer]| -> u64 {
        servers
            .iter()
            .map(|s| s.status().dedup.delta_chunks_absorbed)
            .sum()
    };

    write_checkpoint(&env, "/torch/snap-00", &[("model.pt", &models[0])]);
    let first = wait_line_with(&mut agent, &pushed(0));
    assert_eq!(deltas_against(&first), None, "nothing before it: {first}");
    wait_complete(&mut agent, "/torch/snap-00");

    write_checkpoint(&env, "/torch/snap-01", &[("model.pt", &models[1])]);
    let second = wait_line_with(&mut agent, &pushed(1));
    let mut deltas = assert_deltas_against(&second, "/torch/snap-00");
    assert_eq!(absorbed(&[&a, &b]), deltas, "{second}");
    // Each delta went to the server that took its base in snap-00, which checked it against
    // the base in its cache: no base was read back from the durable store.
    let (cached, read): (u64, u64) = [&a, &b]
        .iter()
        .map(|s| s.status().dedup)
        .map(|d| (d.delta_bases_from_cache, d.delta_bases_from_durable))
        .fold((0, 0), |(c, r), (c2, r2)| (c + c2, r + r2));
    assert!(
        cached > 0 && read == 0,
        "snap-01's delta bases: {cached} from the servers' caches, {read} read from the durable store"
    );
    let waiting = a.status().dedup.pending_chunks;
    a.kill9();
    eprintln!("server A killed with {waiting} acknowledged chunks not pushed yet");
    a.restart(&env, &url);
    wait_complete(&mut agent, "/torch/snap-01");

    write_checkpoint(&env, "/torch/snap-02", &[("model.pt", &models[2])]);
    let third = wait_line_with(&mut agent, &pushed(2));
    deltas += assert_deltas_against(&third, "/torch/snap-01");
    wait_complete(&mut agent, "/torch/snap-02");
    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.dedup_delta_chunks, deltas, "{status:?}");
    // "zstd:L (auto; last: zstd:A -> zstd:L (...))": the level moved (or held) on what the
    // agent measured of a checkpoint through the servers.
    assert!(
        status.dedup_compression.contains("(auto; last: "),
        "{status:?}"
    );
    for server in [&a, &b] {
        let s = server.status().dedup;
        assert_eq!((s.lost_chunks, s.pending_chunks), (0, 0), "{s:?}");
    }
    stop_agent(&mut agent);

    for (i, model) in models.iter().enumerate() {
        let dest = root.join(format!("restored-{i}"));
        restore_ok(&env, &format!("torch/snap-{i:02}"), &dest, &url);
        assert!(
            std::fs::read(dest.join("model.pt")).expect("restored") == *model,
            "snap-{i:02} differs"
        );
    }
    drop(b);
}

/// `len` bytes of float32 "weights" (a smooth function of the index, shifted by `seed`), each
/// scaled by `1 + nudge`: a training step that moves every value a little.
fn weights(len: usize, seed: u64, nudge: f32) -> Vec<u8> {
    (0..len / 4)
        .flat_map(|i| {
            let x = (i as f32 * 0.37 + seed as f32).sin() * (1.0 + nudge);
            x.to_le_bytes()
        })
        .collect()
}

#[test]
fn agent_killed_while_storing_deltas_loses_nothing_complete() {
    let (_serial, _) = begin();
    let env = Env::new("dedup-kill-delta", 256 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let names = ["a.bin", "b.bin", "c.bin"];
    let version = |nudge: f32| -> Vec<Vec<u8>> {
        (0..names.len() as u64)
            .map(|i| weights(24 << 20, i, nudge))
            .collect()
    };
    let files = |data: &[Vec<u8>]| -> Vec<(&str, Vec<u8>)> {
        names.iter().copied().zip(data.iter().cloned()).collect()
    };
    let first = version(0.0);
    let second = version(1e-4);
    let mut agent = env.agent(&url, &DEDUP);
    let refs = files(&first);
    let refs: Vec<(&str, &[u8])> = refs.iter().map(|(n, d)| (*n, d.as_slice())).collect();
    write_checkpoint(&env, "/ck.1", &refs);
    wait_complete(&mut agent, "/ck.1");
    let packs_before = packs(durable.path()).len();

    let manifest = durable.path().join(".cascade-dedup/manifests/ck.2.json");
    let refs = files(&second);
    let refs: Vec<(&str, &[u8])> = refs.iter().map(|(n, d)| (*n, d.as_slice())).collect();
    write_checkpoint(&env, "/ck.2", &refs);
    wait_for("a pack of /ck.2 in the durable store", WAIT, || {
        packs(durable.path()).len() > packs_before
    });
    agent.kill9();
    assert!(
        !manifest.exists(),
        "the manifest was written before the agent was killed; the test needs a bigger checkpoint"
    );

    let check = |dest: &Path, data: &[Vec<u8>]| {
        for (name, want) in names.iter().zip(data) {
            assert!(
                std::fs::read(dest.join(name)).expect("restored") == *want,
                "{} differs",
                dest.join(name).display()
            );
        }
    };
    let r1 = env.tmp.path().join("r1");
    restore_ok(&env, "ck.1", &r1, &url);
    check(&r1, &first);
    let refused = restore(&env, "ck.2", &env.tmp.path().join("r2-early"), &url);
    assert!(
        !refused.ok(),
        "an interrupted checkpoint restored: {refused}"
    );

    // A new agent reads /ck.1's manifest back and stores /ck.2 as deltas against it again.
    let mut agent2 = env.agent(&url, &DEDUP);
    let line = wait_complete(&mut agent2, "/ck.2");
    assert_deltas_against(&line, "/ck.1");
    stop_agent(&mut agent2);
    let r2 = env.tmp.path().join("r2");
    restore_ok(&env, "ck.2", &r2, &url);
    check(&r2, &second);
    restore_ok(&env, "ck.1", &env.tmp.path().join("r1-again"), &url);
}

/// The default configuration: `CASCADE_DEDUP=on` and no other dedup setting.
#[test]
fn the_default_configuration_stores_deltas_at_an_adaptive_level_and_restores_bit_for_bit() {
    let (_serial, _) = begin();
    let models = quick_torch_models();
    let env = Env::new("dedup-default", 256 << 20);
    let durable = tempfile::tempdir().expect("durable dir");
    let url = durable.path().to_str().expect("utf-8").to_string();
    let mut agent = env.agent(&url, &[("CASCADE_DEDUP", "on")]);
    for (i, model) in models.iter().enumerate() {
        let ckpt = format!("/torch/snap-{i:02}");
        write_checkpoint(&env, &ckpt, &[("model.pt", model)]);
        let line = wait_complete(&mut agent, &ckpt);
        if i > 0 {
            assert_deltas_against(&line, &format!("/torch/snap-{:02}", i - 1));
        }
    }
    let status = cascade_agent::status(&env.name).expect("status");
    assert_eq!(status.dedup_checkpoints, 3, "{status:?}");
    // "zstd:L (auto; last: zstd:A -> zstd:L (...))", L within the adaptive range.
    let shown = &status.dedup_compression;
    let level: i32 = shown
        .strip_prefix("zstd:")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("no level in {shown:?}"));
    assert!(
        (cascade_dedup::adaptive::AUTO_MIN_LEVEL..=cascade_dedup::adaptive::AUTO_MAX_LEVEL)
            .contains(&level),
        "{shown:?}"
    );
    assert!(shown.contains("(auto; last: "), "{shown:?}");
    let out = env.cascade_ok(&["status"], &[]);
    assert!(
        out.stdout.contains("compression zstd:"),
        "cascade status shows no compression: {out}"
    );
    stop_agent(&mut agent);

    // The repository's format: its config, and manifests that name the default chunking
    // and the level the agent starts at.
    let repo = durable.path().join(".cascade-dedup");
    let json = |path: PathBuf| -> serde_json::Value {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    assert_eq!(json(repo.join("config.json"))["format"], "cascade-dedup/1");
    for (i, model) in models.iter().enumerate() {
        let m = json(repo.join(format!("manifests/torch/snap-{i:02}.json")));
        assert_eq!(m["chunking"], "fixed:64KiB", "{m}");
        assert_eq!(m["compression"], "zstd:-2", "{m}");
        assert_eq!(m["files"][0]["size"], model.len() as u64, "{m}");
    }
    assert!(!packs(durable.path()).is_empty());

    for (i, model) in models.iter().enumerate() {
        let dest = env.tmp.path().join(format!("restored-{i}"));
        restore_ok(&env, &format!("torch/snap-{i:02}"), &dest, &url);
        assert!(
            std::fs::read(dest.join("model.pt")).expect("restored") == *model,
            "snap-{i:02} differs"
        );
    }
}
