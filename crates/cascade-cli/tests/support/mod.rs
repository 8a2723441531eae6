//! Shared by the CLI's integration tests: the repository root and the preload library built
//! by the cargo that runs the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds `packages` (which must include cascade-preload) with the cargo running these tests
/// and returns the path of libcascade.so.
pub fn build_preload_library(packages: &[&str]) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut args = vec!["build"];
    for p in packages {
        args.extend(["-p", p]);
    }
    args.push("--message-format=json");
    let out = Command::new(cargo)
        .args(&args)
        .current_dir(repo_root())
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p cascade-preload failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "cascade")
        .flat_map(|m| {
            m["filenames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|f| f.as_str().map(PathBuf::from))
        })
        .find(|f| f.extension().is_some_and(|e| e == "so"))
        .expect("cargo reported no libcascade.so")
}
