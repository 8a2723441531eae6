//! A job on several simulated nodes (docs/cluster.md): mpirun starts the MPI heat solver
//! (examples/heat_mpi) under `cascade run`, each node with a node store and a node name of
//! its own (CASCADE_STORE, CASCADE_NODE per mpirun app context), one durable directory for
//! the job. Its checkpoints are complete only with every node's part, restore refuses a
//! partial one, and a restart on other nodes (another number of ranks) reads the
//! checkpoint back through read-through and ends on the grid of a run without Cascade.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cascade_testkit::{output_within, repo_root};

const CASCADE: &str = env!("CARGO_BIN_EXE_cascade");
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// The job: its work directory, durable store, programs and simulated nodes' stores.
struct Job {
    dir: tempfile::TempDir,
    id: String,
    stores: std::cell::RefCell<Vec<String>>,
    /// The durable store's URL, and the directory its objects are files in.
    durable_url: String,
    durable_dir: PathBuf,
    /// More environment for every rank (staging servers).
    extra_env: Vec<(String, String)>,
}

/// One simulated node of a run: its name, how many ranks it runs, and another durable
/// store for it alone, if any (a node whose files never reach the job's durable store).
struct NodeRun<'a> {
    name: &'a str,
    ranks: u32,
    elsewhere: Option<&'a Path>,
}

fn node(name: &str, ranks: u32) -> NodeRun<'_> {
    NodeRun {
        name,
        ranks,
        elsewhere: None,
    }
}

impl Job {
    fn new(tag: &str) -> Job {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("empty.toml"), "").expect("config file");
        std::fs::create_dir(dir.path().join("durable")).expect("durable dir");
        let durable = dir.path().join("durable");
        let job = Job {
            id: format!("{tag}-{}", std::process::id()),
            durable_url: durable.display().to_string(),
            durable_dir: durable,
            dir,
            stores: Default::default(),
            extra_env: Vec::new(),
        };
        job.build("cc", "examples/heat/heat.c", "heat");
        job.build("mpicc", "examples/heat_mpi/heat_mpi.c", "heat_mpi");
        job
    }

    /// Starts a staging server draining to the job's durable store and points every rank
    /// at it; the server's environment and handle live as long as the caller keeps them.
    fn through_a_staging_server(
        &mut self,
        tag: &str,
    ) -> (cascade_testkit::Env, cascade_testkit::StageServer) {
        let env = cascade_testkit::Env::new(tag, 16 << 20);
        let arenas = self.path("arenas");
        std::fs::create_dir(&arenas).expect("arena dir");
        let server =
            cascade_testkit::StageServer::start(&env, &arenas, &self.durable_url, "s3cret", &[]);
        // The ranks hold only the job's credential, not the cluster secret: what a Slurm
        // prolog would hand them (docs/security.md, "Staging servers").
        let credential = self.path("staging-credential");
        let printed = Command::new(cascade_testkit::cascade_bin())
            .args(["stage-server", "credential"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CASCADE_CONFIG", self.path("empty.toml"))
            .env("CASCADE_JOB", &self.id)
            .env("CASCADE_JOB_NAME", "heat")
            .env("CASCADE_STAGING_SECRET", "s3cret")
            .output()
            .expect("cascade stage-server credential");
        assert!(printed.status.success(), "{}", text(&printed.stderr));
        std::fs::write(&credential, &printed.stdout).expect("credential file");
        std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o600))
            .expect("chmod credential");
        self.extra_env = vec![
            ("CASCADE_STAGING".into(), server.addr.clone()),
            (
                "CASCADE_STAGING_CREDENTIAL_FILE".into(),
                credential.display().to_string(),
            ),
        ];
        (env, server)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn build(&self, cc: &str, source: &str, out: &str) {
        let built = Command::new(cc)
            .arg("-I")
            .arg(repo_root().join("examples/heat"))
            .args(["-O2", "-o"])
            .arg(self.path(out))
            .arg(repo_root().join(source))
            .args(["-lm", "-ldl"])
            .output()
            .unwrap_or_else(|e| panic!("{cc}: {e} (CI installs build-essential, libopenmpi-dev)"));
        assert!(
            built.status.success(),
            "{cc} {source}: {}",
            text(&built.stderr)
        );
    }

    fn store_of(&self, node: &str) -> String {
        let store = format!("/cascade-jobs-{}-{node}", self.id);
        let mut stores = self.stores.borrow_mut();
        if !stores.contains(&store) {
            stores.push(store.clone());
        }
        store
    }

    /// A clean environment for mpirun and what it starts: the job's identity and durable
    /// store, small node stores, no inherited CASCADE_* or launcher variables.
    fn mpirun(&self, nodes: &[NodeRun], names: &[&str], heat_args: &[&str]) -> Output {
        let heat_mpi = self.path("heat_mpi").display().to_string();
        let mut program = vec![
            heat_mpi.as_str(),
            "--dir",
            "/cascade/heat",
            "--commit-by",
            "node",
        ];
        program.extend(heat_args);
        self.mpirun_program(nodes, names, &program)
    }

    /// `program` on every rank, each under `cascade run` on its simulated node.
    fn mpirun_program(&self, nodes: &[NodeRun], names: &[&str], program: &[&str]) -> Output {
        let mut cmd = Command::new("mpirun");
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .env("CASCADE_CONFIG", self.path("empty.toml"))
            .env("CASCADE_DURABLE", &self.durable_url)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .env("CASCADE_JOB", &self.id)
            .env("CASCADE_JOB_NAME", "heat")
            .env("CASCADE_JOB_NODES", names.join(","))
            .env("CASCADE_CAPACITY", "64MiB")
            .env("CASCADE_SPILL_SIZE", "0")
            // Debian's Open MPI 4.1 can hang in its own finalize without it (openpmix#1233).
            .env("PMIX_MCA_gds", "hash")
            .args(["-q", "--oversubscribe", "--allow-run-as-root"]);
        for (i, node) in nodes.iter().enumerate() {
            if i > 0 {
                cmd.arg(":");
            }
            cmd.args(["-np", &node.ranks.to_string(), "env"])
                .arg(format!("CASCADE_STORE={}", self.store_of(node.name)))
                .arg(format!("CASCADE_NODE={}", node.name))
                // mpirun's local size counts every simulated node's ranks on this host.
                .arg(format!("CASCADE_NODE_RANKS={}", node.ranks));
            if let Some(durable) = node.elsewhere {
                cmd.arg(format!("CASCADE_DURABLE={}", durable.display()));
            }
            cmd.args([CASCADE, "run", "--"]).args(program);
        }
        output_within(cmd, RUN_LIMIT)
    }

    /// The final grid checksum of the serial solver run without Cascade.
    fn reference(&self, args: &[&str]) -> String {
        let out = output_within(
            {
                let mut c = Command::new(self.path("heat"));
                c.arg("--dir").arg(self.path("reference")).args(args);
                c
            },
            RUN_LIMIT,
        );
        assert!(out.status.success(), "heat: {}", text(&out.stderr));
        final_checksum(&text(&out.stdout))
    }

    /// The durable directory of checkpoint `name` (below the job's namespace).
    fn durable_checkpoint(&self, name: &str) -> PathBuf {
        find_dir(&self.durable_dir, name)
            .unwrap_or_else(|| panic!("{name} is not in the durable store"))
    }

    fn cascade(&self, args: &[&str]) -> Output {
        let mut c = Command::new(CASCADE);
        c.args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("CASCADE_CONFIG", self.path("empty.toml"));
        output_within(c, RUN_LIMIT)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for store in self.stores.borrow().iter() {
            let _ = Command::new(CASCADE)
                .args(["destroy", "--force", "--store", store])
                .output();
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn final_checksum(stdout: &str) -> String {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("final "))
        .unwrap_or_else(|| panic!("no final line in {stdout}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("fnv1a64="))
        .expect("fnv1a64 field")
        .to_string()
}

fn succeeded(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The first directory named `name` below `root`.
fn find_dir(root: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(found) = find_dir(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

/// The files a checkpoint's marker lists, sorted, and the nodes it names.
fn marker_of(ckpt_dir: &Path) -> (Vec<String>, Vec<String>) {
    let bytes = std::fs::read(ckpt_dir.join(".cascade-complete"))
        .unwrap_or_else(|_| panic!("{} has no completion marker", ckpt_dir.display()));
    let marker: serde_json::Value = serde_json::from_slice(&bytes).expect("marker json");
    let mut files: Vec<String> = marker["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].as_str().expect("path").to_string())
        .collect();
    files.sort();
    let nodes = marker["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    (files, nodes)
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_job_on_two_nodes_completes_its_checkpoints_and_restarts_on_one_node_and_back() {
    let job = Job::new("two");
    let first = [node("a", 2), node("b", 2)];
    let out = job.mpirun(
        &first,
        &["a", "b"],
        &["--n", "64", "--steps", "30", "--every", "10"],
    );
    succeeded(&out, "the job on nodes a and b");
    let ckpt = job.durable_checkpoint("ckpt.000030");
    let (files, nodes) = marker_of(&ckpt);
    let mut expected = vec!["meta.txt".to_string()];
    for rank in 0..4 {
        expected.push(format!("meta.{rank}.txt"));
        expected.push(format!("rank.{rank}.bin"));
    }
    expected.sort();
    assert_eq!(files, expected);
    assert_eq!(nodes, names(&["a", "b"]));
    assert!(ckpt.join(".cascade-part.a").exists() && ckpt.join(".cascade-part.b").exists());

    // `cascade restore` returns every node's files.
    let restored = job.path("restored");
    let durable_root = ckpt.parent().and_then(Path::parent).expect("namespace dir");
    let out = job.cascade(&[
        "restore",
        "heat/ckpt.000030",
        restored.to_str().expect("utf-8"),
        "--from",
        durable_root.to_str().expect("utf-8"),
    ]);
    succeeded(&out, "cascade restore");
    assert!(restored.join("rank.3.bin").exists() && restored.join("meta.txt").exists());

    // 4 ranks on 2 nodes restart as 2 ranks on another node: read-through brings latest and
    // the checkpoint back; it ends on the grid of an uninterrupted run without Cascade.
    restart_of_four_ranks_on_node_c(&job);
    let (_, nodes) = marker_of(&job.durable_checkpoint("ckpt.000050"));
    assert_eq!(
        nodes,
        Vec::<String>::new(),
        "a one-node job's marker names no nodes"
    );

    // And back: 2 ranks on one node restart as 4 ranks on two new nodes.
    let third = [node("d", 2), node("e", 2)];
    let out = job.mpirun(
        &third,
        &["d", "e"],
        &["--n", "64", "--steps", "70", "--every", "10"],
    );
    let stdout = succeeded(&out, "the restart on nodes d and e");
    assert!(
        stdout.contains("restarted from ckpt.000050 step=50 written_by=2 ranks=4"),
        "{stdout}"
    );
    let reference = job.reference(&["--n", "64", "--steps", "70", "--every", "10"]);
    assert_eq!(final_checksum(&stdout), reference);
    assert_eq!(
        marker_of(&job.durable_checkpoint("ckpt.000070")).1,
        names(&["d", "e"])
    );
}

#[test]
fn a_node_whose_part_never_arrives_leaves_the_checkpoint_refused_and_the_previous_one_whole() {
    let job = Job::new("lost");
    let both = [node("a", 1), node("b", 1)];
    let out = job.mpirun(
        &both,
        &["a", "b"],
        &["--n", "48", "--steps", "20", "--every", "10"],
    );
    succeeded(&out, "the job's first run");
    // The second run: node b's files go to a copy of the durable store, never to the
    // job's (read-through still finds the first run's checkpoint there), then it is lost.
    let elsewhere = job.path("durable-b");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(job.path("durable"))
        .arg(&elsewhere)
        .status()
        .expect("cp");
    assert!(copied.success());
    let lossy = [
        node("a", 1),
        NodeRun {
            name: "b",
            ranks: 1,
            elsewhere: Some(&elsewhere),
        },
    ];
    let out = job.mpirun(
        &lossy,
        &["a", "b"],
        &["--n", "48", "--steps", "30", "--every", "10"],
    );
    succeeded(&out, "the job's second run");
    let _ = job.cascade(&["destroy", "--force", "--store", &job.store_of("b")]);

    let ckpt = job.durable_checkpoint("ckpt.000030");
    assert!(ckpt.join(".cascade-part.a").exists());
    assert!(
        !ckpt.join(".cascade-complete").exists(),
        "complete without node b"
    );
    let durable_root = ckpt.parent().and_then(Path::parent).expect("namespace dir");
    let from = durable_root.to_str().expect("utf-8");
    let restored = job.path("restored");
    let dest = restored.to_str().expect("utf-8");
    let out = job.cascade(&["restore", "heat/ckpt.000030", dest, "--from", from]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a partial checkpoint restored: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("parts from 1 of 2 nodes (a); missing b"),
        "{err}"
    );
    // Node a's agent says the same when asked to wait for it.
    let on_node_a = |args: &[&str]| {
        let mut c = Command::new(CASCADE);
        c.args(args)
            .env_clear()
            .env("HOME", job.dir.path())
            .env("CASCADE_CONFIG", job.path("empty.toml"))
            .env("CASCADE_STORE", job.store_of("a"))
            .env("CASCADE_DURABLE", job.path("durable"))
            .env("CASCADE_JOB", &job.id)
            .env("CASCADE_JOB_NAME", "heat")
            .env("CASCADE_JOB_NODES", "a,b")
            .env("CASCADE_NODE", "a");
        output_within(c, RUN_LIMIT)
    };
    let out = on_node_a(&[
        "wait",
        "/heat/ckpt.000030",
        "--level",
        "durable",
        "--timeout",
        "0",
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("missing b"), "{err}");
    let listing = succeeded(
        &on_node_a(&["ls", "--levels", "/heat"]),
        "cascade ls --levels",
    );
    assert!(
        listing
            .lines()
            .any(|l| l.contains("parts from 1 of 2 nodes (a); missing b")
                && l.ends_with("heat/ckpt.000030")),
        "{listing}"
    );
    // Read-through on a new node refuses the files of the partial checkpoint, not those of
    // the one before.
    let read_on_new_node = |file: &str| {
        let mut c = Command::new(CASCADE);
        c.args(["run", "--", "sh", "-c"])
            .arg(format!("cat /cascade/heat/{file} > /dev/null"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", job.dir.path())
            .env("CASCADE_CONFIG", job.path("empty.toml"))
            .env("CASCADE_STORE", job.store_of("z"))
            .env("CASCADE_CAPACITY", "64MiB")
            .env("CASCADE_SPILL_SIZE", "0")
            .env("CASCADE_DURABLE", job.path("durable"))
            .env("CASCADE_JOB", &job.id)
            .env("CASCADE_JOB_NAME", "heat")
            .env("CASCADE_JOB_NODES", "z")
            .env("CASCADE_NODE", "z");
        output_within(c, RUN_LIMIT)
    };
    let refused = read_on_new_node("ckpt.000030/rank.0.bin");
    assert!(
        !refused.status.success(),
        "read a file of a partial checkpoint"
    );
    assert!(
        text(&refused.stderr).contains("missing b"),
        "{}",
        text(&refused.stderr)
    );
    succeeded(
        &read_on_new_node("ckpt.000020/rank.1.bin"),
        "read-through of ckpt.000020",
    );
    // --partial restores node a's files and names node b.
    let partial = job.path("partial");
    let out = job.cascade(&[
        "restore",
        "heat/ckpt.000030",
        partial.to_str().expect("utf-8"),
        "--from",
        from,
        "--partial",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("parts from 1 of 2 nodes (a); missing b"),
        "{err}"
    );
    assert!(partial.join("rank.0.bin").exists() && partial.join("meta.0.txt").exists());
    assert!(!partial.join("rank.1.bin").exists());
    // The job restarted on a new node falls back from the partial checkpoint (its files are
    // refused) to the one before, and ends on the grid of a run without Cascade.
    let out = job.mpirun(
        &[node("y", 2)],
        &["y"],
        &["--n", "48", "--steps", "40", "--every", "10", "--fallback"],
    );
    let stdout = succeeded(&out, "the restart on node y");
    assert!(
        stdout.contains("restarted from ckpt.000020 step=20 written_by=2 ranks=2"),
        "{stdout}"
    );
    let reference = job.reference(&["--n", "48", "--steps", "40", "--every", "10"]);
    assert_eq!(final_checksum(&stdout), reference);
    // The checkpoint before is whole.
    let out = job.cascade(&["restore", "heat/ckpt.000020", dest, "--from", from]);
    succeeded(&out, "restore of the previous checkpoint");
    for file in ["rank.0.bin", "rank.1.bin", "meta.txt"] {
        assert!(restored.join(file).exists(), "{file}");
    }
}

/// The cluster scripts of contrib/ (docs/cluster.md) parse, and every `cascade` command they
/// run exists with the options they give it.
#[test]
fn the_cluster_scripts_parse_and_call_real_commands() {
    let dir = repo_root().join("contrib/slurm");
    let mut called = 0;
    for entry in std::fs::read_dir(&dir).expect("contrib/slurm").flatten() {
        let path = entry.path();
        let out = Command::new("bash")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            text(&out.stderr)
        );
        let script = std::fs::read_to_string(&path).expect("script");
        for line in script.lines().filter(|l| !l.trim_start().starts_with('#')) {
            let Some(at) = line.find("cascade ") else {
                continue;
            };
            let words: Vec<&str> = line[at + "cascade ".len()..].split_whitespace().collect();
            let Some(command) = words
                .first()
                .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            else {
                continue;
            };
            let flags: Vec<&str> = words
                .iter()
                .filter(|w| w.starts_with("--") && **w != "--")
                .copied()
                .collect();
            let help = Command::new(CASCADE)
                .args([*command, "--help"])
                .output()
                .expect("cascade --help");
            let help_text = text(&help.stdout);
            assert!(
                help.status.success(),
                "{}: cascade {command}",
                path.display()
            );
            if *command != "run" {
                for flag in flags {
                    assert!(
                        help_text.contains(flag),
                        "{}: cascade {command} {flag}",
                        path.display()
                    );
                }
            }
            called += 1;
        }
    }
    assert!(called >= 5, "{called} cascade calls found in contrib/slurm");
}

/// examples/heat_mpi/check.sh: the MPI solver gives heat.c's grid on 1 to 4 ranks, restarts
/// N-to-M after a kill, refuses corrupt checkpoints, and commits where it should.
#[test]
fn the_mpi_heat_solver_matches_the_serial_one_and_restarts_n_to_m() {
    let mut check = Command::new("sh");
    check.arg(repo_root().join("examples/heat_mpi/check.sh"));
    let out = output_within(check, Duration::from_secs(600));
    let stdout = succeeded(&out, "examples/heat_mpi/check.sh");
    assert!(stdout.contains("heat_mpi check: all passed"), "{stdout}");
}

/// Runs the solver on `nodes` simulated nodes of one rank each and checks that its last
/// checkpoint's marker lists every rank's files and every node.
fn job_on_nodes_completes(job: &Job, nodes: &[&str]) {
    let runs: Vec<NodeRun> = nodes.iter().map(|n| node(n, 1)).collect();
    let out = job.mpirun(
        &runs,
        nodes,
        &["--n", "64", "--steps", "20", "--every", "10"],
    );
    succeeded(&out, "the job");
    let (files, marker_nodes) = marker_of(&job.durable_checkpoint("ckpt.000020"));
    let mut expected = vec!["meta.txt".to_string()];
    for rank in 0..nodes.len() {
        expected.push(format!("meta.{rank}.txt"));
        expected.push(format!("rank.{rank}.bin"));
    }
    expected.sort();
    assert_eq!(files, expected);
    assert_eq!(marker_nodes, names(nodes));
}

#[test]
fn a_job_on_four_nodes_completes_its_checkpoints_on_s3() {
    let server = cascade_testkit::Versitygw::start();
    server.create_bucket("jobs");
    let mut job = Job::new("s3");
    job.durable_url = server.url("jobs");
    job.durable_dir = server.bucket_dir("jobs");
    job_on_nodes_completes(&job, &["n1", "n2", "n3", "n4"]);
}

#[test]
fn a_job_on_two_nodes_completes_its_checkpoints_through_a_staging_server() {
    let mut job = Job::new("staged");
    let (_env, server) = job.through_a_staging_server("jobs-staged");
    job_on_nodes_completes(&job, &["a", "b"]);
    assert!(
        server.status().drained_files >= 10,
        "the files went through the server: {:?}",
        server.status()
    );
}

/// With dedup, through a staging server: each node's ranks' files become its part manifest
/// (staged as packs, written by the server), the last node joins them into the checkpoint's manifest; `cascade
/// restore` returns every rank's files and the job restarts on one node from the repository,
/// ending on the reference grid.
#[test]
fn with_dedup_through_a_staging_server_a_job_on_two_nodes_restarts_on_one_node() {
    let mut job = Job::new("dedup");
    let (_env, server) = job.through_a_staging_server("jobs-dedup");
    job.extra_env.extend([
        ("CASCADE_DEDUP".into(), "fixed:64KiB".into()),
        ("CASCADE_COMPRESS".into(), "zstd:1".into()),
    ]);
    let out = job.mpirun(
        &[node("a", 2), node("b", 2)],
        &["a", "b"],
        &["--n", "64", "--steps", "30", "--every", "10"],
    );
    succeeded(&out, "the job on nodes a and b");
    let repo = find_dir(&job.durable_dir, ".cascade-dedup").expect("a dedup repository");
    let manifests = find_dir(&repo.join("manifests"), "heat").unwrap_or_else(|| {
        panic!(
            "no manifests of the job: {:?}; the job said {}",
            cascade_testkit::files_below(&job.durable_dir),
            text(&out.stderr)
        )
    });
    for ckpt in ["ckpt.000010", "ckpt.000020", "ckpt.000030"] {
        let text = std::fs::read_to_string(manifests.join(format!("{ckpt}.json")))
            .unwrap_or_else(|e| panic!("{ckpt} has no manifest: {e}"));
        for rank in 0..4 {
            assert!(
                text.contains(&format!("\"rank.{rank}.bin\"")),
                "{ckpt}: {text}"
            );
        }
        for part in ["a", "b"] {
            let part = manifests
                .join(ckpt)
                .join(format!(".cascade-part.{part}.json"));
            assert!(part.exists(), "{}", part.display());
        }
    }
    // Staged as packs (the default): every part manifest is a file the server drained.
    assert!(
        server.status().drained_files >= 6,
        "the server wrote the nodes' part manifests: {:?}",
        server.status()
    );

    let restored = job.path("restored");
    let namespace = repo.parent().expect("namespace dir");
    let out = job.cascade(&[
        "restore",
        "heat/ckpt.000030",
        restored.to_str().expect("utf-8"),
        "--from",
        namespace.to_str().expect("utf-8"),
    ]);
    succeeded(&out, "cascade restore");
    for rank in 0..4 {
        assert!(restored.join(format!("rank.{rank}.bin")).exists());
    }

    restart_of_four_ranks_on_node_c(&job);
}

/// The job written by 4 ranks up to step 30 restarts as 2 ranks on a new node c, runs to
/// step 50 and ends on the grid of an uninterrupted run without Cascade.
fn restart_of_four_ranks_on_node_c(job: &Job) {
    let steps = ["--n", "64", "--steps", "50", "--every", "10"];
    let out = job.mpirun(&[node("c", 2)], &["c"], &steps);
    let stdout = succeeded(&out, "the restart on node c");
    assert!(
        stdout.contains("restarted from ckpt.000030 step=30 written_by=4 ranks=2"),
        "{stdout}"
    );
    assert_eq!(final_checksum(&stdout), job.reference(&steps));
}

/// A program that never calls Cascade (a shell writing each rank's file), two ranks on each of
/// two nodes: the last rank of each node commits the job's directory at its end, and the
/// checkpoint is complete with both nodes' parts.
#[test]
fn a_program_that_never_calls_cascade_on_two_nodes_completes_with_both_parts() {
    let job = Job::new("plain");
    let write = "mkdir -p /cascade/job && head -c 3000000 /dev/urandom \
                 > /cascade/job/rank.$OMPI_COMM_WORLD_RANK";
    let out = job.mpirun_program(
        &[node("a", 2), node("b", 2)],
        &["a", "b"],
        &["sh", "-c", write],
    );
    succeeded(&out, "the shell ranks on nodes a and b");
    let (files, nodes) = marker_of(&job.durable_checkpoint("job"));
    assert_eq!(files, names(&["rank.0", "rank.1", "rank.2", "rank.3"]));
    assert_eq!(nodes, names(&["a", "b"]));
}
