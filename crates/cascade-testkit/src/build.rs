//! The workspace's own artifacts for tests that run them: the `cascade` binary, libcascade.so
//! and libcascade_wrap.a.
//!
//! A test of one package cannot use another package's `CARGO_BIN_EXE_*`, so [`build`] runs
//! `cargo build -p ...` with the cargo that runs the tests ($CARGO), into the target
//! directory and profile the test executable was built in (it lives in
//! `<target>/<profile>/deps/`), and returns `<target>/<profile>`. The `cascade` binary there
//! finds libcascade.so next to itself.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `<target>/<profile>` of the running test executable.
fn profile_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        // <target>/<profile>/deps/<test>-<hash>
        exe.parent()
            .and_then(Path::parent)
            .expect("test executable outside <target>/<profile>/deps")
            .to_path_buf()
    })
}

/// Builds `packages` (once per test binary and package) and returns the directory their
/// artifacts are in, `<target>/<profile>`.
pub fn build(packages: &[&str]) -> &'static Path {
    static BUILT: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !built.contains(*p))
        .collect();
    let dir = profile_dir();
    if missing.is_empty() {
        return dir;
    }
    let target_dir = dir.parent().expect("target dir");
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(repo_root());
    for p in &missing {
        cmd.args(["-p", p]);
    }
    // Cargo's per-package variables of this test would leak into build scripts (ring's
    // reruns when CARGO_MANIFEST_DIR changes) and make every later build start over.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_MANIFEST")
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_CRATE")
            || k == "CARGO_PRIMARY_PACKAGE"
        {
            cmd.env_remove(&*k);
        }
    }
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p {} failed:\n{}",
        missing.join(" -p "),
        String::from_utf8_lossy(&out.stderr)
    );
    built.extend(missing.iter().map(|p| p.to_string()));
    dir
}

/// The `cascade` executable, with libcascade.so next to it (both built once).
pub fn cascade_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = build(&["cascade-cli", "cascade-preload"]);
        let bin = dir.join("cascade");
        assert!(bin.is_file(), "{} was not built", bin.display());
        assert!(
            dir.join("libcascade.so").is_file(),
            "libcascade.so was not built in {}",
            dir.display()
        );
        bin
    })
}

/// libcascade.so, the preload library (built once).
pub fn preload_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = build(&["cascade-preload"]).join("libcascade.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// Compiles the bundled heat solver (examples/heat/heat.c, with the flags of its header
/// comment) into `dir`; its path.
pub fn compile_heat(dir: &Path) -> PathBuf {
    let src = repo_root().join("examples/heat/heat.c");
    let exe = dir.join("heat");
    let out = std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lm", "-ldl"])
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}
