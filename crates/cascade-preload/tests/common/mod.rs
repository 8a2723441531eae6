//! Shared by the integration tests: libcascade.so and the `cascade` binary (from the test kit)
//! and C programs compiled against them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

pub mod env;

pub use cascade_testkit::{cascade_bin, repo_root};

/// The directory of libcascade.so (built once with the cargo running the tests).
pub fn library_dir() -> &'static Path {
    cascade_testkit::preload_library()
        .parent()
        .expect("the library is in a directory")
}

/// Compiles C `source` (written to `<name>.c` in the test target's scratch directory) with
/// `cc` against include/cascade.h and libcascade.so (linked with -lcascade and an rpath, so
/// the program also runs without `cascade run`). Once per name and test run.
pub fn compile_c_with_cascade(name: &str, source: &str) -> PathBuf {
    let lib = library_dir();
    let mut args: Vec<String> = vec![
        "-I".into(),
        repo_root().join("include").display().to_string(),
    ];
    args.extend([
        "-L".into(),
        lib.display().to_string(),
        "-lcascade".into(),
        format!("-Wl,-rpath,{}", lib.display()),
        "-lpthread".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    compile_c(name, source, &args)
}

/// Compiles C `source` (written to `<name>.c` in the test target's scratch directory) with
/// `cc -std=gnu11 -O1 -g -Wall -Wextra -Werror` and `args` (e.g. `-shared -fPIC` for a
/// library named `libx.so`) into `<name>`. Once per name and test run.
pub fn compile_c(name: &str, source: &str, args: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, exe)) = built.iter().find(|(n, _)| n == name) {
        return exe.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write C source");
    let exe = dir.join(name);
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(args)
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
