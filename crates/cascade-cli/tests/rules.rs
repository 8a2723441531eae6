//! Checkpoint rules (`checkpoint.rules`, docs/agent.md "Checkpoint rules"): a program that
//! never calls Cascade, run under `cascade run` with a durable store, has its restart files
//! and checkpoint directories committed by the agent, so that a run writing far more than
//! the store holds completes with every checkpoint durable and the newest in memory.

use cascade_testkit::Env;

/// The durable directory of a test and the environment every `cascade` command gets.
fn setup(env: &Env, rules: &str) -> (std::path::PathBuf, Vec<(String, String)>) {
    let durable = env.tmp.path().join("durable");
    std::fs::create_dir_all(&durable).expect("durable dir");
    let vars = vec![
        ("CASCADE_CAPACITY".to_string(), "64MiB".to_string()),
        ("CASCADE_SPILL_SIZE".to_string(), "0".to_string()),
        ("CASCADE_DURABLE".to_string(), durable.display().to_string()),
        ("CASCADE_FULL_WAIT".to_string(), "30".to_string()),
        ("CASCADE_CHECKPOINT_RULES".to_string(), rules.to_string()),
    ];
    (durable, vars)
}

/// The paths `cascade ls --levels` shows in memory, sorted.
fn in_memory(listing: &str) -> Vec<&str> {
    let mut paths: Vec<&str> = listing
        .lines()
        .filter(|l| l.starts_with("memory"))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    paths.sort();
    paths
}

fn run(env: &Env, vars: &[(String, String)], args: &[&str]) -> cascade_testkit::Out {
    let envs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    env.cascade(args, &envs)
}

/// Ten 16 MB restart files through a 64 MiB store, as a simulation writing `restart.N`:
/// without rules the writer waits until durable files are made remote; with `restart.*`
/// every file is a single-file checkpoint, all ten are durable and restore bit for bit, and
/// the newest two (checkpoint.keep) stay in memory.
#[test]
fn restart_files_of_a_program_that_never_commits_do_not_fill_the_store() {
    let script = "mkdir -p /cascade/lmp; for s in 1 2 3 4 5 6 7 8 9 10; do \
                  head -c 16000000 /dev/urandom > /cascade/lmp/restart.$s || exit 9; \
                  cp /cascade/lmp/restart.$s \"$KEEP/restart.$s\" || exit 8; done";

    let without = Env::without_store("rules-none");
    let (_, vars) = setup(&without, "");
    let keep = without.tmp.path().join("copies");
    std::fs::create_dir_all(&keep).expect("copies");
    let mut v = vars.clone();
    v.push(("KEEP".into(), keep.display().to_string()));
    v.push(("CASCADE_FULL_WAIT".into(), "2".into()));
    let out = run(&without, &v, &["run", "--", "sh", "-c", script]);
    // Without rules the restart files are in no checkpoint: the durable ones are made remote
    // for the writer (crates/cascade-cli/tests/listing.rs), and the run completes.
    assert!(out.ok(), "{out}");
    // The writer is told what fills the store while it waits: restart files safe below but
    // in no checkpoint.
    assert!(
        out.stderr
            .contains("safe below but in no checkpoint (commit it, or set checkpoint.rules)"),
        "{out}"
    );

    let env = Env::without_store("rules-files");
    let (durable, vars) = setup(&env, "restart.*");
    let keep = env.tmp.path().join("copies");
    std::fs::create_dir_all(&keep).expect("copies");
    let mut v = vars.clone();
    v.push(("KEEP".into(), keep.display().to_string()));
    let out = run(&env, &v, &["run", "--", "sh", "-c", script]);
    assert!(out.ok(), "{out}");

    let listing = run(&env, &vars, &["ls", "--levels", "/lmp"]).stdout;
    for s in 1..=10 {
        let name = format!("restart.{s}");
        assert!(
            durable
                .join("lmp")
                .join(format!("{name}.cascade-complete"))
                .exists(),
            "{name} is not a complete checkpoint in the durable store:\n{listing}"
        );
        let dest = env.tmp.path().join("restored").join(&name);
        let out = run(
            &env,
            &vars,
            &[
                "restore",
                &format!("lmp/{name}"),
                dest.to_str().expect("utf-8"),
                "--from",
                durable.to_str().expect("utf-8"),
            ],
        );
        assert!(out.ok(), "restore {name}: {out}");
        let restored = std::fs::read(dest.join(&name))
            .or_else(|_| std::fs::read(&dest))
            .expect("restored file");
        let original = std::fs::read(keep.join(&name)).expect("copy");
        assert!(restored == original, "{name} differs after restore");
    }
    assert_eq!(
        in_memory(&listing),
        ["/lmp/restart.10", "/lmp/restart.9"],
        "{listing}"
    );
    assert!(
        !durable.join("lmp/.cascade-complete").exists(),
        "the directory above the restart files became a checkpoint"
    );
}

/// Checkpoint directories `ckpt_N/`: each is committed once the next one appears, the last
/// at the end of the job; the directory above them is not a checkpoint.
#[test]
fn checkpoint_directories_are_committed_one_by_one() {
    let env = Env::without_store("rules-dirs");
    let (durable, vars) = setup(&env, "ckpt_*/");
    let script = "for n in 1 2 3; do mkdir -p /cascade/sim/ckpt_$n && \
                  head -c 1000000 /dev/urandom > /cascade/sim/ckpt_$n/rank.0 && \
                  head -c 1000000 /dev/urandom > /cascade/sim/ckpt_$n/rank.1 || exit 9; done";
    let out = run(&env, &vars, &["run", "--", "sh", "-c", script]);
    assert!(out.ok(), "{out}");
    for n in 1..=3 {
        let marker = durable.join(format!("sim/ckpt_{n}/.cascade-complete"));
        let text = std::fs::read_to_string(&marker)
            .unwrap_or_else(|e| panic!("ckpt_{n} has no marker ({e})"));
        assert!(
            text.contains("rank.0") && text.contains("rank.1"),
            "ckpt_{n}: {text}"
        );
    }
    assert!(!durable.join("sim/.cascade-complete").exists());
}

/// A bad rule is one line naming the setting, and nothing runs.
#[test]
fn a_bad_rule_is_refused_with_one_line() {
    let env = Env::without_store("rules-bad");
    let (_, vars) = setup(&env, "dir/restart.*");
    let out = run(&env, &vars, &["run", "--", "true"]);
    assert!(!out.ok());
    assert!(
        out.stderr.contains("CASCADE_CHECKPOINT_RULES") && out.stderr.trim().lines().count() == 1,
        "{out}"
    );
}

/// LAMMPS (Debian's `lmp`) writing `restart 20 melt.*.restart` for 30 snapshots (about 85 MB)
/// into a 32 MiB store, never calling Cascade: with the rule `melt.*.restart` the run
/// completes, every restart file is a complete checkpoint in the durable store, the newest
/// two are in memory, and a second job restarts from the newest (read_restart) and runs on.
#[test]
fn lammps_restart_files_far_larger_than_the_store() {
    let env = Env::without_store("rules-lammps");
    let (durable, mut vars) = setup(&env, "melt.*.restart");
    vars.retain(|(k, _)| k != "CASCADE_CAPACITY");
    vars.push(("CASCADE_CAPACITY".into(), "32MiB".into()));
    let input = "units lj\natom_style atomic\nlattice fcc 0.8442\n\
                 region box block 0 20 0 20 0 20\ncreate_box 1 box\ncreate_atoms 1 box\n\
                 mass 1 1.0\nvelocity all create 3.0 87287 loop geom\n\
                 pair_style lj/cut 2.5\npair_coeff 1 1 1.0 1.0 2.5\nneighbor 0.3 bin\n\
                 neigh_modify every 20 delay 0 check no\nfix 1 all nve\nthermo 100\n\
                 restart 20 /cascade/lmp/melt.*.restart\nrun 600\n";
    std::fs::write(env.tmp.path().join("in.melt"), input).expect("input");
    let out = run(
        &env,
        &vars,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "mkdir -p /cascade/lmp && lmp -in in.melt -log none -screen none -nocite",
        ],
    );
    assert!(out.ok(), "lmp under cascade run: {out}");
    let listing = run(&env, &vars, &["ls", "--levels", "/lmp"]).stdout;
    for step in (20..=600).step_by(20) {
        let marker = durable.join(format!("lmp/melt.{step}.restart.cascade-complete"));
        assert!(
            marker.exists(),
            "melt.{step}.restart not complete:\n{listing}"
        );
    }
    assert_eq!(
        in_memory(&listing),
        ["/lmp/melt.580.restart", "/lmp/melt.600.restart"],
        "{listing}"
    );

    // A new job restarts from the newest restart file, in memory.
    let again = "read_restart /cascade/lmp/melt.600.restart\n\
                 neighbor 0.3 bin\nneigh_modify every 20 delay 0 check no\n\
                 fix 1 all nve\nthermo 10\nrun 20\n";
    std::fs::write(env.tmp.path().join("in.again"), again).expect("input");
    let out = run(
        &env,
        &vars,
        &[
            "run",
            "--",
            "sh",
            "-c",
            "lmp -in in.again -log none -nocite",
        ],
    );
    assert!(out.ok(), "restart: {out}");
    assert!(
        out.stdout.contains("Loop time"),
        "the restarted run did not run: {out}"
    );
}
