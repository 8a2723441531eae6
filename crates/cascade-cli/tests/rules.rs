//! Checkpoint rules (`checkpoint.rules`, docs/agent.md "Checkpoint rules"): a program that
//! never calls Cascade, run under `cascade run` with a durable store, has its restart files
//! and checkpoint directories committed by the agent, so that a run writing far more than
//! the store holds completes with every checkpoint durable and the newest in memory.

use cascade_testkit::Env;

/// The durable directory of a test and the environment every `cascade` command gets: a
/// 64 MiB store and the checkpoint rules.
fn setup(env: &Env, rules: &str) -> (std::path::PathBuf, Vec<(String, String)>) {
    let (durable, mut vars) = env.durable_job("64MiB");
    vars.push(("CASCADE_CHECKPOINT_RULES".to_string(), rules.to_string()));
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
    env.cascade_env(args, vars)
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

/// The quiet time (`checkpoint.quiet`): a program writes `ckpt_1/` and then runs on without
/// starting `ckpt_2/`; with a quiet time of 1 s the agent commits `ckpt_1/` while the program
/// still runs (the program itself waits, up to 30 s, for its marker in the durable store),
/// and `ckpt_2/`, written next, is committed at the end of the job. With the quiet time off
/// the marker does not appear within 5 s.
#[test]
fn a_quiet_checkpoint_directory_is_committed_while_the_job_runs() {
    let script = "mkdir -p /cascade/sim/ckpt_1 && \
                  head -c 1000000 /dev/urandom > /cascade/sim/ckpt_1/rank.0 && \
                  head -c 1000000 /dev/urandom > /cascade/sim/ckpt_1/rank.1 || exit 9; \
                  end=$(( $(date +%s) + $WAIT )); \
                  until test -e \"$CASCADE_DURABLE/sim/ckpt_1/.cascade-complete\"; do \
                  test $(date +%s) -lt $end || exit 7; sleep 0.1; done; \
                  mkdir /cascade/sim/ckpt_2 && \
                  head -c 1000000 /dev/urandom > /cascade/sim/ckpt_2/rank.0 || exit 9";

    let off = Env::without_store("rules-quiet-off");
    let (durable, mut vars) = setup(&off, "ckpt_*/");
    vars.push(("CASCADE_CHECKPOINT_QUIET".into(), "0".into()));
    vars.push(("WAIT".into(), "5".into()));
    let out = run(&off, &vars, &["run", "--", "sh", "-c", script]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "without a quiet time ckpt_1 is committed only once ckpt_2 appears: {out}"
    );
    assert!(
        durable.join("sim/ckpt_1/.cascade-complete").exists(),
        "{out}"
    );

    let env = Env::without_store("rules-quiet");
    let (durable, mut vars) = setup(&env, "ckpt_*/");
    vars.push(("CASCADE_CHECKPOINT_QUIET".into(), "1".into()));
    vars.push(("WAIT".into(), "30".into()));
    let out = run(&env, &vars, &["run", "--", "sh", "-c", script]);
    assert!(
        out.ok(),
        "ckpt_1 was not committed while the job ran: {out}"
    );
    for (n, files) in [(1, &["rank.0", "rank.1"][..]), (2, &["rank.0"][..])] {
        let marker = durable.join(format!("sim/ckpt_{n}/.cascade-complete"));
        let text = std::fs::read_to_string(&marker)
            .unwrap_or_else(|e| panic!("ckpt_{n} has no marker ({e})"));
        for f in files {
            assert!(text.contains(f), "ckpt_{n}: {text}");
        }
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

    // The node is gone: the same restart reads the file back from the durable store.
    let out = run(&env, &vars, &["destroy", "--force"]);
    assert!(out.ok(), "{out}");
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
    assert!(out.ok(), "restart after destroy: {out}");
    assert!(
        out.stdout.contains("Loop time"),
        "the restarted run did not run: {out}"
    );
}

/// FNV-1a 64, as heat.c checksums its grid (meta.txt's `fnv1a64=`).
fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The last line of heat's output, `final step=S fnv1a64=HEX ...`: its checksum.
fn final_fnv(stdout: &str) -> String {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("final "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("fnv1a64="))
        })
        .unwrap_or_else(|| panic!("no final line in {stdout}"))
        .to_string()
}

/// The bundled heat solver without its cascade_commit calls (`--no-commit`): twenty 8 MiB
/// checkpoint directories `ckpt.<step>/` (160 MiB) through a 40 MiB store with the rule
/// `ckpt.*/`. The run completes with the same result as on a plain directory; every
/// checkpoint is complete in the durable store and its grid matches the checksum in its
/// meta.txt; the newest two are in memory; a second job restarts from the newest and ends
/// where an uninterrupted run of as many steps ends; and after `cascade destroy` a third
/// finds the newest by listing the empty store's directory and restarts from it.
#[test]
fn heat_without_commits_through_a_store_a_quarter_of_its_output() {
    let env = Env::without_store("rules-heat");
    let (durable, mut vars) = setup(&env, "ckpt.*/");
    vars.retain(|(k, _)| k != "CASCADE_CAPACITY");
    vars.push(("CASCADE_CAPACITY".into(), "40MiB".into()));
    let exe = cascade_testkit::compile_heat(env.tmp.path());
    let exe = exe.to_str().expect("utf-8");
    let args = ["--n", "1024", "--every", "10", "--no-commit"];
    let plain = |steps: &str, dir: &str| {
        let out = std::process::Command::new(exe)
            .args(args)
            .args(["--steps", steps, "--dir"])
            .arg(env.tmp.path().join(dir))
            .output()
            .expect("heat");
        assert!(out.status.success(), "plain heat: {out:?}");
        final_fnv(&String::from_utf8_lossy(&out.stdout))
    };

    let heat = |steps: &str| {
        let cmd = [
            &["run", "--", exe][..],
            &args,
            &["--steps", steps, "--dir", "/cascade/heat"],
        ]
        .concat();
        run(&env, &vars, &cmd)
    };
    let out = heat("200");
    assert!(out.ok(), "heat under cascade run: {out}");
    assert_eq!(final_fnv(&out.stdout), plain("200", "plain200"));
    assert!(out.stdout.starts_with("starting fresh\n"), "{out}");

    let listing = run(&env, &vars, &["ls", "--levels", "/heat"]).stdout;
    for step in (10..=200).step_by(10) {
        let ckpt = durable.join(format!("heat/ckpt.{step:06}"));
        let marker = std::fs::read_to_string(ckpt.join(".cascade-complete"))
            .unwrap_or_else(|e| panic!("ckpt.{step:06} is not complete ({e}):\n{listing}"));
        assert!(
            marker.contains("grid.bin") && marker.contains("meta.txt"),
            "ckpt.{step:06}: {marker}"
        );
        let meta = std::fs::read_to_string(ckpt.join("meta.txt")).expect("meta.txt");
        let grid = std::fs::read(ckpt.join("grid.bin")).expect("grid.bin");
        assert_eq!(grid.len(), 1024 * 1024 * 8, "ckpt.{step:06}");
        assert!(
            meta.contains(&format!("step={step}\n"))
                && meta.contains(&format!("fnv1a64={}", fnv1a64(&grid))),
            "ckpt.{step:06}: the durable grid does not match its meta.txt {meta}"
        );
    }
    let memory: Vec<&str> = in_memory(&listing)
        .into_iter()
        .filter(|p| p.contains("/ckpt."))
        .collect();
    assert!(
        memory
            .iter()
            .all(|p| p.starts_with("/heat/ckpt.000190") || p.starts_with("/heat/ckpt.000200"))
            && memory.iter().any(|p| p.starts_with("/heat/ckpt.000190"))
            && memory.iter().any(|p| p.starts_with("/heat/ckpt.000200")),
        "not the newest two in memory:\n{listing}"
    );

    // A second job restarts from the newest checkpoint (in memory) and runs on to step 240.
    let out = heat("240");
    assert!(out.ok(), "restart: {out}");
    let first_lines: Vec<&str> = out.stdout.lines().take(1).collect();
    assert_eq!(
        first_lines,
        ["restarted from ckpt.000200 step=200"],
        "{out}"
    );
    assert_eq!(
        final_fnv(&out.stdout),
        plain("240", "plain240"),
        "the restart did not end where an uninterrupted run ends: {out}"
    );

    // The node is gone; a job on an empty store finds its newest checkpoint by listing
    // (--find-latest: readdir of the directory and a stat of each meta.txt, as restart logic
    // that globs does) and restarts from it, fetched from the durable store.
    let out = run(&env, &vars, &["destroy", "--force"]);
    assert!(out.ok(), "{out}");
    let cmd = [
        &["run", "--", exe][..],
        &args,
        &["--steps", "260", "--dir", "/cascade/heat", "--find-latest"],
    ]
    .concat();
    let out = run(&env, &vars, &cmd);
    assert!(out.ok(), "restart by listing: {out}");
    assert_eq!(
        out.stdout.lines().next(),
        Some("restarted from ckpt.000240 step=240"),
        "{out}"
    );
    assert_eq!(final_fnv(&out.stdout), plain("260", "plain260"), "{out}");
}

/// GROMACS inputs: SPC/E water in a 6 nm box (about 7000 waters; a checkpoint is about
/// 500 KB), both seeds fixed.
const GMX_TOPOLOGY: &str = "#include \"oplsaa.ff/forcefield.itp\"\n\
                            #include \"oplsaa.ff/spce.itp\"\n\n[ system ]\nwater\n\n[ molecules ]\n";
const GMX_MDP: &str = "integrator = md\ndt = 0.002\nnsteps = 400\ncutoff-scheme = Verlet\n\
                       nstlist = 10\ncoulombtype = reaction-field\nrcoulomb = 0.8\n\
                       vdwtype = cut-off\nrvdw = 0.8\ntcoupl = v-rescale\ntc-grps = System\n\
                       tau-t = 0.1\nref-t = 300\ngen-vel = yes\ngen-temp = 300\ngen-seed = 42\n\
                       ld-seed = 1234\nconstraints = h-bonds\nnstenergy = 10\nnstlog = 10\n\
                       nstcalcenergy = 10\n";

/// The steps of the energy blocks of a GROMACS log, in order.
fn gmx_log_steps(log: &str) -> Vec<u64> {
    let lines: Vec<&str> = log.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].split_whitespace().eq(["Step", "Time"]))
        .filter_map(|w| w[1].split_whitespace().next()?.parse().ok())
        .collect()
}

/// GROMACS (Debian's `gmx`) mdrun checkpointing every neighbour-search step (`-cpt`) into
/// the store, never calling Cascade, with the rule `*.cpt`: twenty checkpoints of about 500 KB
/// through a 2 MiB store. GROMACS writes `state_stepN.cpt`, copies `state.cpt` onto
/// `state_prev.cpt` and renames the new file onto `state.cpt`. The run completes;
/// `state.cpt` is a complete checkpoint in the durable store, restores bit for bit, and a
/// continuation (`mdrun -cpi`) from the restored copy starts at the checkpoint's step.
#[test]
fn gromacs_checkpoints_far_larger_than_the_store() {
    let env = Env::without_store("rules-gmx");
    let (durable, mut vars) = setup(&env, "*.cpt");
    vars.retain(|(k, _)| k != "CASCADE_CAPACITY");
    vars.push(("CASCADE_CAPACITY".into(), "2MiB".into()));
    vars.push(("CASCADE_CHUNK_SIZE".into(), "64KiB".into()));
    let host = env.tmp.path().join("host");
    std::fs::create_dir_all(&host).expect("host dir");
    std::fs::write(host.join("topol.top"), GMX_TOPOLOGY).expect("topol.top");
    std::fs::write(host.join("md.mdp"), GMX_MDP).expect("md.mdp");
    let prep = std::process::Command::new("sh")
        .current_dir(&host)
        .args([
            "-c",
            "gmx -quiet solvate -cs spc216.gro -box 6 6 6 -o conf.gro -p topol.top && \
             gmx -quiet grompp -f md.mdp -c conf.gro -p topol.top -o topol.tpr",
        ])
        .output()
        .expect("gmx (install the Debian package gromacs)");
    assert!(prep.status.success(), "gmx solvate/grompp: {prep:?}");

    // The checkpoints in the store; the other outputs (coordinates, energies, log) on the
    // host: outside every checkpoint they would fill the store.
    let h = host.display().to_string();
    let mdrun = format!(
        "mkdir -p /cascade/md && cd /cascade/md && gmx -quiet mdrun -ntmpi 1 -ntomp 1 \
         -reprod -s {h}/topol.tpr -cpt 0.0001 -cpo state.cpt -c {h}/confout.gro \
         -e {h}/ener.edr -g {h}/md.log -nsteps 400"
    );
    let out = run(&env, &vars, &["run", "--", "sh", "-c", &mdrun]);
    assert!(out.ok(), "mdrun under cascade run: {out}");
    let log = std::fs::read_to_string(host.join("md.log")).expect("md.log");
    let written = log.matches("Writing checkpoint, step").count();
    assert!(
        written >= 16,
        "only {written} checkpoints (8 MB wanted through the 2 MiB store):\n{log}"
    );
    assert_eq!(gmx_log_steps(&log).last(), Some(&400));

    let listing = run(&env, &vars, &["ls", "--levels", "/md"]).stdout;
    assert!(
        durable.join("md/state.cpt.cascade-complete").exists(),
        "state.cpt is not complete in the durable store:\n{listing}"
    );
    let in_store = env.tmp.path().join("in-store.cpt");
    let out = run(
        &env,
        &vars,
        &["get", "/md/state.cpt", in_store.to_str().expect("utf-8")],
    );
    assert!(out.ok(), "{out}");
    let restored = env.tmp.path().join("restored");
    let out = run(
        &env,
        &vars,
        &[
            "restore",
            "md/state.cpt",
            restored.to_str().expect("utf-8"),
            "--from",
            durable.to_str().expect("utf-8"),
        ],
    );
    assert!(out.ok(), "restore: {out}");
    let restored = if restored.is_dir() {
        restored.join("state.cpt")
    } else {
        restored
    };
    assert!(
        std::fs::read(&restored).expect("restored") == std::fs::read(&in_store).expect("copy"),
        "the restored state.cpt differs from the store's"
    );

    // A continuation from the restored checkpoint starts at step 400 and runs 20 more.
    let cont = env.tmp.path().join("cont");
    std::fs::create_dir_all(&cont).expect("cont dir");
    let out = std::process::Command::new("gmx")
        .current_dir(&cont)
        .args([
            "-quiet",
            "mdrun",
            "-ntmpi",
            "1",
            "-ntomp",
            "1",
            "-reprod",
            "-noappend",
        ])
        .arg("-s")
        .arg(host.join("topol.tpr"))
        .arg("-cpi")
        .arg(&restored)
        .args(["-nsteps", "20", "-g", "cont.log"])
        .output()
        .expect("gmx mdrun -cpi");
    assert!(out.status.success(), "mdrun -cpi: {out:?}");
    let log = std::fs::read_to_string(cont.join("cont.part0002.log"))
        .or_else(|_| std::fs::read_to_string(cont.join("cont.log")))
        .expect("continuation log");
    let steps = gmx_log_steps(&log);
    assert_eq!(
        (steps.first(), steps.last()),
        (Some(&400), Some(&420)),
        "{log}"
    );
}

/// A committed single-file checkpoint renamed (`mv state.cpt state_prev.cpt`, as a code
/// keeping its previous checkpoint does) stays a checkpoint under its new name: it is sent
/// again and completed there, with its bytes; the new `state.cpt` is a checkpoint of its own.
#[test]
fn a_renamed_checkpoint_file_is_a_checkpoint_under_its_new_name() {
    let env = Env::without_store("rules-rename");
    let (durable, mut vars) = setup(&env, "*.cpt");
    let keep = env.tmp.path().join("copies");
    std::fs::create_dir_all(&keep).expect("copies");
    vars.push(("KEEP".into(), keep.display().to_string()));
    let script = "mkdir -p /cascade/ck && cd /cascade/ck && \\
                  head -c 1000000 /dev/urandom > state.cpt && cp state.cpt \"$KEEP/first\" || exit 9; \\
                  end=$(( $(date +%s) + 30 )); \\
                  until test -e \"$CASCADE_DURABLE/ck/state.cpt.cascade-complete\"; do \\
                  test $(date +%s) -lt $end || exit 7; sleep 0.1; done; \\
                  mv state.cpt state_prev.cpt && \\
                  head -c 1000000 /dev/urandom > state.cpt && cp state.cpt \"$KEEP/second\" || exit 9";
    let out = run(&env, &vars, &["run", "--", "sh", "-c", script]);
    assert!(out.ok(), "{out}");
    let listing = run(&env, &vars, &["ls", "--levels", "/ck"]).stdout;
    for (name, copy) in [("state_prev.cpt", "first"), ("state.cpt", "second")] {
        assert!(
            durable.join(format!("ck/{name}.cascade-complete")).exists(),
            "{name} is not a complete checkpoint:\n{listing}"
        );
        assert!(
            std::fs::read(durable.join("ck").join(name)).expect("durable copy")
                == std::fs::read(keep.join(copy)).expect("copy"),
            "the durable {name} does not hold its bytes"
        );
        let line =
            cascade_testkit::levels_line(&listing, &format!("/ck/{name}")).unwrap_or_default();
        assert!(
            line.contains("checkpoint") && line.contains("complete"),
            "{name}: {line:?}\n{listing}"
        );
    }
}

/// The rule `builtin` (LAMMPS, GROMACS and heat restart files) under one job: LAMMPS writing
/// `restart.*`, the heat solver without its commits writing `ckpt.<step>/`, and a `state.cpt`
/// are all complete checkpoints in the durable store; the LAMMPS log beside the restart
/// files is not one.
#[test]
fn builtin_rules_name_the_restart_files_of_common_codes() {
    let env = Env::without_store("rules-builtin");
    let (durable, vars) = setup(&env, "builtin");
    let exe = cascade_testkit::compile_heat(env.tmp.path());
    let input = "units lj\natom_style atomic\nlattice fcc 0.8442\n\
                 region box block 0 8 0 8 0 8\ncreate_box 1 box\ncreate_atoms 1 box\n\
                 mass 1 1.0\nvelocity all create 3.0 87287 loop geom\n\
                 pair_style lj/cut 2.5\npair_coeff 1 1 1.0 1.0 2.5\nneighbor 0.3 bin\n\
                 fix 1 all nve\nthermo 50\nrestart 50 /cascade/lmp/restart.*\nrun 100\n";
    std::fs::write(env.tmp.path().join("in.melt"), input).expect("input");
    let script = format!(
        "mkdir -p /cascade/lmp /cascade/md && \
         lmp -in in.melt -log /cascade/lmp/log.lammps -screen none -nocite && \
         {} --dir /cascade/heat --n 128 --steps 30 --every 10 --no-commit --quiet && \
         head -c 100000 /dev/urandom > /cascade/md/state.cpt",
        exe.display()
    );
    let out = run(&env, &vars, &["run", "--", "sh", "-c", &script]);
    assert!(out.ok(), "{out}");
    let listing = run(&env, &vars, &["ls", "--levels", "/"]).stdout;
    for marker in [
        "lmp/restart.50.cascade-complete",
        "lmp/restart.100.cascade-complete",
        "heat/ckpt.000010/.cascade-complete",
        "heat/ckpt.000020/.cascade-complete",
        "heat/ckpt.000030/.cascade-complete",
        "md/state.cpt.cascade-complete",
    ] {
        assert!(durable.join(marker).exists(), "no {marker}:\n{listing}");
    }
    assert!(durable.join("lmp/log.lammps").exists(), "{listing}");
    assert!(
        !durable.join("lmp/log.lammps.cascade-complete").exists()
            && !durable.join("lmp/.cascade-complete").exists(),
        "the LAMMPS log became a checkpoint:\n{listing}"
    );
}
