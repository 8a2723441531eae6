//! Shared by the integration tests: builds libcascade.so with the cargo running the tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
