//! Shared by the integration tests: builds libcascade.so with the cargo running the tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

pub mod env;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds the cdylib with the same cargo that runs this test and returns its directory.
pub fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        artifact("cascade-preload", "cascade", "so")
            .parent()
            .unwrap()
            .to_path_buf()
    })
}

/// Builds the `cascade` CLI (it finds libcascade.so next to itself) and returns its path.
pub fn cascade_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        library_dir();
        artifact("cascade-cli", "cascade", "")
    })
}

/// Builds `package` and returns the file cargo reports for target `target` whose extension
/// is `ext` ("" for an executable).
fn artifact(package: &str, target: &str, ext: &str) -> PathBuf {
    {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let out = Command::new(cargo)
            .args(["build", "-p", package, "--message-format=json"])
            .current_dir(repo_root())
            .output()
            .expect("run cargo build");
        assert!(
            out.status.success(),
            "cargo build -p {package} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let so = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == target)
            .flat_map(|m| {
                m["filenames"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|f| f.as_str().map(PathBuf::from))
            })
            .find(|f| f.extension().map_or(ext.is_empty(), |e| e == ext))
            .unwrap_or_else(|| panic!("cargo reported no {target} artifact"));
        so
    }
}

/// Compiles C `source` (written to `<name>.c` in the test target's scratch directory) with
/// `cc` against include/cascade.h and libcascade.so (linked with -lcascade and an rpath, so
/// the program also runs without `cascade run`). Once per name and test run.
pub fn compile_c_with_cascade(name: &str, source: &str) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, exe)) = built.iter().find(|(n, _)| n == name) {
        return exe.clone();
    }
    let lib = library_dir();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write C source");
    let exe = dir.join(name);
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .args([
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(repo_root().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib)
        .arg("-lcascade")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lpthread")
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    built.push((name.to_string(), exe.clone()));
    exe
}
