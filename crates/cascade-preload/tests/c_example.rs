//! Builds libcascade.so, compiles the C programs (examples/c/chunk_list.c and
//! tests/c/api_errors.c) against include/cascade.h with `cc`, and runs them against real
//! stores: one held entirely in memory and one where part of the file spilled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use cascade_store::{Prefault, SpillConfig, Store, StoreConfig};

mod common;
use common::{library_dir, repo_root};

/// Compiles one C file against include/cascade.h and libcascade.so (once per test run).
fn compile(source: &Path, name: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap();
    if let Some(exe) = built.get(name) {
        return exe.clone();
    }
    let lib = library_dir();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()))
        .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(repo_root().join("include"))
        .arg(source)
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
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(name.to_string(), exe.clone());
    exe
}

/// Destroys a store and its spill directory when dropped (the test passes or fails).
struct DestroyOnDrop {
    name: String,
    spill_dir: PathBuf,
}

impl Drop for DestroyOnDrop {
    fn drop(&mut self) {
        if let Err(e) = Store::destroy(&self.name) {
            if e.errno() != libc::ENOENT {
                eprintln!("warning: could not destroy test store {}: {e}", self.name);
            }
        }
        let _ = std::fs::remove_dir_all(&self.spill_dir);
    }
}

/// A store for one test. Fields drop in order: the handle first (destroy refuses a store
/// that a live process, this one included, is attached to), then the guard destroys it.
struct TestStore {
    name: String,
    store: Store,
    _guard: DestroyOnDrop,
}

impl TestStore {
    fn new(capacity: u64, chunk_size: u64, spill: Option<u64>) -> TestStore {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let name = format!("/cascade-test-{}-capi{n}", std::process::id());
        let spill_dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&spill_dir).unwrap();
        let guard = DestroyOnDrop {
            name: name.clone(),
            spill_dir: spill_dir.clone(),
        };
        let cfg = StoreConfig {
            name: name.clone(),
            capacity,
            chunk_size,
            max_files: 64,
            spill: spill.map(|size| SpillConfig {
                path: spill_dir.join("spill"),
                size,
            }),
            prefault: Prefault::Off,
        };
        let store = Store::create(&cfg).unwrap();
        TestStore {
            name,
            store,
            _guard: guard,
        }
    }
}

struct Summary {
    chunks: usize,
    memory: usize,
    spilled: usize,
}

fn run_chunk_list(store: &TestStore, size: u64, path: &str) -> Summary {
    let exe = compile(&repo_root().join("examples/c/chunk_list.c"), "chunk_list");
    let out = Command::new(&exe)
        .arg(&store.name)
        .arg(size.to_string())
        .arg(path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chunk_list failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    assert!(line.ends_with(" OK"), "unexpected output: {stdout}");
    let field = |key: &str| -> usize {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .unwrap_or_else(|| panic!("no {key}= in {line}"))
            .parse()
            .unwrap()
    };
    assert_eq!(field("bytes") as u64, size);
    Summary {
        chunks: field("chunks"),
        memory: field("memory"),
        spilled: field("spilled"),
    }
}

#[test]
fn chunk_list_example_reads_memory_chunks_in_place() {
    let ts = TestStore::new(8 << 20, 4096, None);
    let size = (1 << 20) + 1234;
    let s = run_chunk_list(&ts, size, "/ckpt.0001/rank0.dat");

    // The C program's view agrees with the store's own.
    let chunks = ts.store.chunk_list("/ckpt.0001/rank0.dat").unwrap();
    assert_eq!(s.chunks, chunks.len());
    assert_eq!(s.chunks as u64, size.div_ceil(4096));
    assert_eq!((s.memory, s.spilled), (s.chunks, 0));
    let meta = ts.store.stat("/ckpt.0001/rank0.dat").unwrap();
    assert_eq!(meta.size, size);
}

#[test]
fn chunk_list_example_reads_spilled_chunks_with_pread() {
    // 256 KiB of memory, 8 MiB of spill: a 2 MiB file mostly spills.
    let ts = TestStore::new(256 << 10, 4096, Some(8 << 20));
    let size = 2 << 20;
    let s = run_chunk_list(&ts, size, "/spilled.ckpt");

    let meta = ts.store.stat("/spilled.ckpt").unwrap();
    assert_eq!(s.chunks as u64, size / 4096);
    assert!(s.spilled > 0, "nothing spilled");
    assert!(s.memory > 0, "memory chunks were not used before spilling");
    assert_eq!(s.memory as u64, meta.chunks_in_memory);
    assert_eq!(s.spilled as u64, meta.chunks_spilled);
}

#[test]
fn c_api_error_contract() {
    let ts = TestStore::new(1 << 20, 4096, None);
    let exe = compile(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/api_errors.c"),
        "api_errors",
    );
    let missing = format!("/cascade-test-{}-capi-missing", std::process::id());
    let out = Command::new(&exe)
        .arg(&ts.name)
        .arg(&missing)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "api_errors failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("api_errors OK"));
    // What the C program left behind is visible through the Rust API.
    assert_eq!(ts.store.stat("/d/after").unwrap().size, 100_000);
    assert!(ts.store.stat("/d/big").is_err());
}
