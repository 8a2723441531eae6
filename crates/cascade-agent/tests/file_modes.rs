//! Checkpoints are private data: the files the real processes create for them on disk — a
//! staging server's arenas, indexes and chunk segments, the durable directory's objects and
//! markers written by a server's drain, by `cascade agent`, by `cascade drain` and by the
//! agent embedded in `cascade run` — get the `files.mode` setting (default 0600, directories
//! 0700), whatever the umask of whoever started them. The program `cascade run` runs keeps
//! the umask it was started with.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cascade_testkit::*;

const SECRET: &str = "file-modes-tests-secret";
const WAIT: Duration = Duration::from_secs(90);

/// (path, kind, permission bits) of everything below `root` that is not `mode` (files) or
/// `dir_mode` (directories), and how many files there are.
fn modes_below(
    root: &Path,
    mode: u32,
    dir_mode: u32,
) -> (Vec<(PathBuf, &'static str, u32)>, usize) {
    let mut wrong = Vec::new();
    let mut files = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("list {}: {e}", d.display()));
        for p in entries.flatten().map(|e| e.path()) {
            let meta = std::fs::symlink_metadata(&p).expect("lstat");
            let perm = meta.mode() & 0o7777;
            if meta.is_dir() {
                if perm != dir_mode {
                    wrong.push((p.clone(), "directory", perm));
                }
                stack.push(p);
            } else {
                files += 1;
                if perm != mode {
                    wrong.push((p, "file", perm));
                }
            }
        }
    }
    (wrong, files)
}

fn assert_modes(root: &Path, mode: u32, dir_mode: u32) {
    let (wrong, files) = modes_below(root, mode, dir_mode);
    assert!(files > 0, "nothing below {}", root.display());
    assert!(
        wrong.is_empty(),
        "below {} files should be {mode:04o} and directories {dir_mode:04o}: {:?}",
        root.display(),
        wrong
            .iter()
            .map(|(p, k, m)| format!("{k} {} {m:04o}", p.display()))
            .collect::<Vec<_>>()
    );
}

fn write_checkpoint(env: &Env, ckpt: &str) {
    env.store()
        .create_dir_all(&format!("{ckpt}/sub"), 0o755)
        .expect("mkdir");
    env.write(&format!("{ckpt}/a.bin"), &random(3 << 20, 1));
    env.write(&format!("{ckpt}/sub/b.bin"), &random(5000, 2));
}

fn wait_durable(env: &Env, ckpt: &str, logs: &dyn Fn() -> String) {
    let out = env.cascade(
        &[
            "wait",
            ckpt,
            "--level",
            "durable",
            "--timeout",
            &WAIT.as_secs().to_string(),
        ],
        &[],
    );
    assert!(out.ok(), "cascade wait {ckpt}: {out}\n{}", logs());
}

/// A directory the test makes with the modes a loose umask would give (0755), so that only
/// what the processes create below it is checked.
fn dir(env: &Env, name: &str) -> PathBuf {
    let d = env.tmp.path().join(name);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

#[test]
fn a_staging_server_and_its_drain_create_private_files() {
    let (_serial, _) = begin();
    let env = Env::new("modes-staged", 64 << 20);
    let ssd = dir(&env, "ssd");
    let durable = dir(&env, "durable");
    let durable_url = durable.display().to_string();
    let server = StageServer::start(&env, &ssd, &durable_url, SECRET, &[]);
    write_checkpoint(&env, "/ck");
    env.cascade_ok(&["commit", "/ck"], &[]);
    let agent = env.agent(
        &durable_url,
        &[
            ("CASCADE_STAGING", &server.addr),
            ("CASCADE_STAGING_SECRET", SECRET),
        ],
    );
    wait_durable(&env, "/ck", &|| {
        format!("{}\n{}", agent.log(), server.log())
    });
    assert!(
        durable.join("ck/.cascade-complete").exists(),
        "{}",
        server.log()
    );
    assert_modes(&ssd, 0o600, 0o700);
    assert_modes(&durable, 0o600, 0o700);
}

#[test]
fn the_agent_and_cascade_drain_create_private_files_or_the_configured_mode() {
    let (_serial, _) = begin();
    let env = Env::new("modes-agent", 64 << 20);
    let durable = dir(&env, "durable");
    let durable_url = durable.display().to_string();
    write_checkpoint(&env, "/ck");
    env.cascade_ok(&["commit", "/ck"], &[]);
    let agent = env.agent(&durable_url, &[]);
    wait_durable(&env, "/ck", &|| agent.log());
    assert_modes(&durable, 0o600, 0o700);
    drop(agent);

    let shared = dir(&env, "shared");
    write_checkpoint(&env, "/ck2");
    env.cascade_ok(
        &["drain", "/ck2", "--to", &shared.display().to_string()],
        &[("CASCADE_FILE_MODE", "0640")],
    );
    assert!(shared.join("ck2/.cascade-complete").exists());
    assert_modes(&shared, 0o640, 0o750);

    let bad = env.cascade(
        &["drain", "/ck2", "--to", &durable_url],
        &[("CASCADE_FILE_MODE", "0755")],
    );
    assert!(!bad.ok(), "{bad}");
    assert!(bad.stderr.contains("CASCADE_FILE_MODE"), "{bad}");
}

#[test]
fn cascade_run_writes_private_checkpoints_and_the_program_keeps_its_umask() {
    let (_serial, _) = begin();
    let env = Env::new("modes-run", 64 << 20);
    let mount = format!("/cascade-modes-run-{}", std::process::id());
    let _mount = RemoveDir(mount.clone());
    let durable = dir(&env, "durable");
    let own = env.tmp.path().join("own.txt");
    let script = format!(
        "umask; mkdir -p {mount}/ck && head -c 100000 /dev/urandom > {mount}/ck/a.bin && echo x > {}",
        own.display()
    );
    let mut cmd = env.cli();
    cmd.args([
        "run",
        "--mount",
        &mount,
        "--durable",
        &durable.display().to_string(),
        "--",
    ])
    .args(["/bin/sh", "-c", &script]);
    // SAFETY: runs in the forked child before exec; umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    assert!(out.ok(), "cascade run: {out}");
    assert_eq!(out.stdout.trim(), "0022", "the program's umask: {out}");
    assert_eq!(
        std::fs::metadata(&own).expect("own file").mode() & 0o777,
        0o644,
        "a file of the program's own follows its umask"
    );
    assert!(
        durable.join("ck/a.bin").exists(),
        "not drained at the end of the job: {out}"
    );
    assert_modes(&durable, 0o600, 0o700);
}
