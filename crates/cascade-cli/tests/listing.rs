//! What only the levels below hold shows in listings (docs/agent.md, "Read-through"): a job
//! restarted on a node whose store is empty finds its newest checkpoint by listing (`ls`,
//! Python's glob), the names arrive without their data (remote files), and a file is fetched
//! when it is opened. A program that never commits does not fill the store: durable files
//! outside every checkpoint are made remote for writers waiting for space. And what the end
//! of a job committed on its own does not trap the next job's commits below it.

use cascade_testkit::Env;

fn setup(env: &Env, capacity: &str) -> (std::path::PathBuf, Vec<(String, String)>) {
    env.durable_job(capacity)
}

fn run(env: &Env, vars: &[(String, String)], args: &[&str]) -> cascade_testkit::Out {
    env.cascade_env(args, vars)
}

/// The `cascade ls --levels` lines of files whose content is only below.
fn remote_paths(listing: &str) -> Vec<&str> {
    listing
        .lines()
        .filter(|l| l.contains("not in memory; fetched when opened"))
        .filter_map(|l| l.split_whitespace().last())
        .collect()
}

#[test]
fn a_restart_on_an_empty_store_finds_the_newest_checkpoint_by_listing() {
    let env = Env::without_store("listing-restart");
    let (_durable, vars) = setup(&env, "64MiB");
    let originals = env.tmp.path().join("originals");
    std::fs::create_dir_all(&originals).expect("originals");
    let mut v = vars.clone();
    v.push(("ORIG".into(), originals.display().to_string()));
    let first_job = "for n in 1 2 3; do mkdir -p /cascade/sim/ckpt.$n && \
                     head -c 3000000 /dev/urandom > /cascade/sim/ckpt.$n/state && \
                     cp /cascade/sim/ckpt.$n/state \"$ORIG/state.$n\" || exit 9; done";
    let out = run(&env, &v, &["run", "--", "sh", "-c", first_job]);
    assert!(out.ok(), "{out}");
    // The node is gone: its store with it.
    let out = run(&env, &vars, &["destroy", "--force"]);
    assert!(out.ok(), "{out}");

    // The restarted job lists, globs and stats before it opens anything.
    let restart = "ls /cascade/sim > \"$ORIG/ls\" && ls /cascade/sim/ckpt.3 > \"$ORIG/ls3\" && \
                   stat -c %s /cascade/sim/ckpt.2/state > \"$ORIG/size2\" && \
                   /usr/bin/python3 -c 'import glob; print(max(glob.glob(\"/cascade/sim/ckpt.*\")))' \
                   > \"$ORIG/newest\" && cascade ls --levels /sim > \"$ORIG/levels\" && \
                   cat \"$(cat \"$ORIG/newest\")/state\" > \"$ORIG/restarted\"";
    let mut v2 = v.clone();
    v2.push(env.cascade_on_path());
    let out = run(&env, &v2, &["run", "--", "sh", "-c", restart]);
    assert!(out.ok(), "{out}");
    let read = |name: &str| std::fs::read_to_string(originals.join(name)).expect(name);
    assert_eq!(
        read("ls"),
        "ckpt.1\nckpt.2\nckpt.3\n",
        "ls of the directory"
    );
    assert_eq!(read("ls3"), "state\n", "ls of a checkpoint");
    assert_eq!(
        read("size2").trim(),
        "3000000",
        "stat of a file not fetched"
    );
    assert_eq!(read("newest").trim(), "/cascade/sim/ckpt.3", "glob");
    // Listing fetched no data: the files of the directories listed (and of the one whose
    // file was stat'ed) were remote until opened; ckpt.1 was never looked into.
    let levels = read("levels");
    let mut remote = remote_paths(&levels);
    remote.sort();
    assert_eq!(
        remote,
        ["/sim/ckpt.2/state", "/sim/ckpt.3/state"],
        "{levels}"
    );
    assert!(
        std::fs::read(originals.join("restarted")).expect("restarted")
            == std::fs::read(originals.join("state.3")).expect("original"),
        "the restart read other bytes than the checkpoint's"
    );
    // What was not opened is still only below.
    let after = run(&env, &vars, &["ls", "--levels", "/sim"]).stdout;
    let mut remote = remote_paths(&after);
    remote.sort();
    assert_eq!(remote, ["/sim/ckpt.2/state"], "{after}");
}

#[test]
fn a_remote_file_cannot_be_read_without_an_agent_and_says_why() {
    let env = Env::without_store("listing-noagent");
    let (_durable, vars) = setup(&env, "64MiB");
    let out = run(
        &env,
        &vars,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "mkdir -p /cascade/r && echo hello > /cascade/r/a",
        ],
    );
    assert!(out.ok(), "{out}");
    run(&env, &vars, &["destroy", "--force"]);
    // Listed by a job (with its agent), then read by a process without one.
    let out = run(&env, &vars, &["run", "--", "ls", "/cascade/r"]);
    assert!(out.ok() && out.stdout == "a\n", "{out}");
    // The CLI reads the store directly: a clear error, no zeros.
    let local = env.tmp.path().join("a");
    let out = run(
        &env,
        &vars,
        &["get", "/r/a", local.to_str().expect("utf-8")],
    );
    assert!(!out.ok(), "a remote file was copied out: {out}");
    assert!(out.stderr.contains("only in a level below"), "{out}");
    assert_eq!(out.err_lines().len(), 1, "{out}");
    // A program under the interposition library with no agent to fetch it.
    let out = env.preloaded("cat", &["/cascade/r/a"]);
    assert!(!out.ok(), "a remote file read as {:?}", out.stdout);
    assert!(
        out.stderr.contains("no node agent runs to fetch it"),
        "{out}"
    );
}

/// Ten 16 MB files through a 64 MiB store by a program that never commits and has no
/// checkpoint rules: files already durable are made remote for the writer, nothing fails,
/// and each reads back bit for bit through read-through.
#[test]
fn files_in_no_checkpoint_are_evicted_once_durable_and_read_back() {
    let env = Env::without_store("listing-evict");
    let (durable, vars) = setup(&env, "64MiB");
    let keep = env.tmp.path().join("copies");
    std::fs::create_dir_all(&keep).expect("copies");
    let mut v = vars.clone();
    v.push(("KEEP".into(), keep.display().to_string()));
    let script = "mkdir -p /cascade/lmp; for s in 1 2 3 4 5 6 7 8 9 10; do \
                  head -c 16000000 /dev/urandom > /cascade/lmp/restart.$s || exit 9; \
                  cp /cascade/lmp/restart.$s \"$KEEP/restart.$s\" || exit 8; done; \
                  for s in 1 5 10; do cmp /cascade/lmp/restart.$s \"$KEEP/restart.$s\" || exit 7; done";
    let out = run(&env, &v, &["run", "--", "sh", "-c", script]);
    assert!(out.ok(), "{out}");
    let listing = run(&env, &vars, &["ls", "--levels", "/lmp"]).stdout;
    assert!(
        !remote_paths(&listing).is_empty(),
        "nothing was evicted:\n{listing}"
    );
    for s in 1..=10 {
        let name = format!("restart.{s}");
        let stored = std::fs::read(durable.join("lmp").join(&name)).expect("durable copy");
        assert!(
            stored == std::fs::read(keep.join(&name)).expect("copy"),
            "{name} differs in the durable store"
        );
    }
}

/// The end of job 1 commits /run1 (nothing else did); job 2's `cascade commit
/// /run1/ckpt.42` supersedes that instead of being refused, and completes.
#[test]
fn a_commit_inside_what_the_end_of_a_job_committed_supersedes_it() {
    let env = Env::without_store("listing-supersede");
    let (durable, vars) = setup(&env, "64MiB");
    let out = run(
        &env,
        &vars,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "mkdir -p /cascade/run1/ckpt.41 && head -c 100000 /dev/urandom > /cascade/run1/ckpt.41/d",
        ],
    );
    assert!(out.ok(), "{out}");
    assert!(durable.join("run1/.cascade-complete").exists());
    let out = run(&env, &vars, &["ls", "--levels", "/run1"]);
    assert!(out.stdout.contains("checkpoint #"), "{out}");

    let mut v = vars.clone();
    v.push(env.cascade_on_path());
    let out = run(
        &env,
        &v,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "mkdir -p /cascade/run1/ckpt.42 && head -c 100000 /dev/urandom > /cascade/run1/ckpt.42/d \
             && cascade commit /run1/ckpt.42 && cascade wait /run1/ckpt.42 --timeout 60",
        ],
    );
    assert!(out.ok(), "{out}");
    assert!(durable.join("run1/ckpt.42/.cascade-complete").exists());
    let levels = run(&env, &vars, &["ls", "--levels", "/run1"]).stdout;
    let state = |path: &str| {
        levels
            .lines()
            .find(|l| l.split_whitespace().last() == Some(path))
            .unwrap_or_default()
            .to_string()
    };
    assert!(!state("/run1/").contains("checkpoint"), "{levels}");
    assert!(state("/run1/ckpt.42/").contains("complete"), "{levels}");
}

/// The same restart when the checkpoints went to the dedup repository: the listing comes
/// from its manifests (a directory of checkpoints, and the files inside one).
#[test]
fn a_restart_finds_dedup_checkpoints_by_listing() {
    let env = Env::without_store("listing-dedup");
    let (_durable, mut vars) = setup(&env, "64MiB");
    vars.push(("CASCADE_DEDUP".into(), "fixed:64KiB".into()));
    let originals = env.tmp.path().join("originals");
    std::fs::create_dir_all(&originals).expect("originals");
    let mut v = vars.clone();
    v.push(("ORIG".into(), originals.display().to_string()));
    v.push(env.cascade_on_path());
    let first_job = "for n in 1 2 3; do mkdir -p /cascade/sim/ckpt.$n && \
                     head -c 2000000 /dev/urandom > /cascade/sim/ckpt.$n/state && \
                     cp /cascade/sim/ckpt.$n/state \"$ORIG/state.$n\" && \
                     cascade commit /sim/ckpt.$n || exit 9; done";
    let out = run(&env, &v, &["run", "--", "sh", "-c", first_job]);
    assert!(out.ok(), "{out}");
    let out = run(&env, &vars, &["destroy", "--force"]);
    assert!(out.ok(), "{out}");

    let restart = "ls /cascade/sim > \"$ORIG/ls\" && ls /cascade/sim/ckpt.3 > \"$ORIG/ls3\" && \
                   /usr/bin/python3 -c 'import glob; print(max(glob.glob(\"/cascade/sim/ckpt.*\")))' \
                   > \"$ORIG/newest\" && cat \"$(cat \"$ORIG/newest\")/state\" > \"$ORIG/restarted\" && \
                   ls /cascade/sim/ckpt.2 > /dev/null && mkdir /cascade/sim/ckpt.4 && \
                   head -c 100000 /dev/urandom > /cascade/sim/ckpt.4/state";
    // The job commits nothing: its end commits /sim, which holds a remote file (ckpt.2's,
    // listed, never opened); stored whole in the repository, it is fetched first.
    let out = run(&env, &v, &["run", "--", "sh", "-c", restart]);
    assert!(out.ok(), "{out}");
    let read = |name: &str| std::fs::read_to_string(originals.join(name)).expect(name);
    assert_eq!(
        read("ls"),
        "ckpt.1\nckpt.2\nckpt.3\n",
        "ls of the directory"
    );
    assert_eq!(read("ls3"), "state\n", "ls of a checkpoint");
    assert_eq!(read("newest").trim(), "/cascade/sim/ckpt.3", "glob");
    assert!(
        std::fs::read(originals.join("restarted")).expect("restarted")
            == std::fs::read(originals.join("state.3")).expect("original"),
        "the restart read other bytes than the checkpoint's"
    );
    let levels = run(&env, &vars, &["ls", "--levels", "/sim"]).stdout;
    let sim = levels
        .lines()
        .find(|l| l.split_whitespace().last() == Some("/sim/"))
        .unwrap_or_default();
    assert!(sim.contains("complete"), "{levels}");
}

/// Several processes open the files of a directory on an empty store at once: each open
/// finds a remote file that another process's fetch may be replacing at that moment (and
/// whose inode may be reused at once). Every process reads every file whole.
#[test]
fn processes_racing_to_fetch_the_same_listed_files_all_read_them_whole() {
    let env = Env::without_store("listing-race");
    let (_durable, vars) = setup(&env, "64MiB");
    let out = run(
        &env,
        &vars,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "mkdir -p /cascade/race && for i in $(seq 1 60); do echo \"file $i\" > /cascade/race/f$i; done",
        ],
    );
    assert!(out.ok(), "{out}");
    run(&env, &vars, &["destroy", "--force"]);
    // Four readers at once, each reading the sixty files in a different order.
    let reader = |order: &str| {
        format!(
            "for i in $({order}); do read line < /cascade/race/f$i || exit 3; \
             [ \"$line\" = \"file $i\" ] || {{ echo \"f$i: '$line'\"; exit 4; }}; done"
        )
    };
    let script = format!(
        "({a}) & p1=$!; ({b}) & p2=$!; ({a}) & p3=$!; ({b}) & p4=$!; \
         wait $p1 && wait $p2 && wait $p3 && wait $p4",
        a = reader("seq 1 60"),
        b = reader("seq 60 -1 1"),
    );
    let out = run(&env, &vars, &["run", "--", "sh", "-c", &script]);
    assert!(out.ok(), "{out}");
}
