//! `cascade-torture`: stress and check a Cascade node store.
//!
//! - `run`: a long random sequence of operations (see the library's `torture` module); runs
//!   until killed with `--ops 0`.
//! - `check`: the crash-independent content check of every file under a root.
//! - `serve`: scripted operations, one command per line on stdin (see `serve`).
//! - `destroy`: remove the store (tests use it to destroy damaged stores out of process).
//!
//! Exit codes: 0 success, 1 bad usage or the store cannot be attached, 3 an invariant was
//! violated, 4 an operation failed unexpectedly.

use std::process::ExitCode;

use cascade_store::Store;
use cascade_torture::{check_tree, serve::serve, Failure, RunParams, Torture};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(version, about = "Stress and check a Cascade node store")]
struct Cli {
    /// Store (shared-memory object) name, e.g. /cascade-1000.
    #[arg(long, env = "CASCADE_STORE")]
    store: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Perform random operations.
    Run {
        /// Directory to work in.
        #[arg(long, default_value = "/")]
        root: String,
        /// Seed of the random sequence (default: from the clock and pid).
        #[arg(long)]
        seed: Option<u64>,
        /// Number of operations; 0 runs until killed.
        #[arg(long, default_value_t = 1000)]
        ops: u64,
        #[arg(long, default_value_t = 256 << 10)]
        max_file_size: u64,
        #[arg(long, default_value_t = 48 << 10)]
        max_write: u64,
        #[arg(long, default_value_t = 48)]
        max_files: usize,
        #[arg(long, default_value_t = 12)]
        max_dirs: usize,
        #[arg(long, default_value_t = 3)]
        max_depth: usize,
        /// Other writers work in the same root (no exact model, races tolerated).
        #[arg(long)]
        shared: bool,
        /// Compare the whole tree with the model every N operations (0: only at the end).
        #[arg(long, default_value_t = 100)]
        verify_every: u64,
    },
    /// Check every file under a root against the pattern named by its file name.
    Check {
        #[arg(long, default_value = "/")]
        root: String,
        #[arg(long, default_value_t = 256 << 10)]
        max_file_size: u64,
    },
    /// Serve scripted commands from stdin.
    Serve,
    /// Destroy the store (its shared-memory object and spill file).
    Destroy,
}

fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Destroy = cli.cmd {
        return destroy(&cli.store);
    }
    let store = match Store::attach(&cli.store) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cascade-torture: attach {}: {e}", cli.store);
            return ExitCode::from(1);
        }
    };
    match cli.cmd {
        Cmd::Run {
            root,
            seed,
            ops,
            max_file_size,
            max_write,
            max_files,
            max_dirs,
            max_depth,
            shared,
            verify_every,
        } => run(
            &store,
            RunParams {
                root,
                seed: seed.unwrap_or_else(clock_seed),
                ops,
                max_file_size,
                max_write,
                max_files,
                max_dirs,
                max_depth,
                shared,
                verify_every,
            },
        ),
        Cmd::Check {
            root,
            max_file_size,
        } => check(&store, &root, max_file_size),
        Cmd::Destroy => ExitCode::SUCCESS, // handled before attaching
        Cmd::Serve => serve_stdio(&store),
    }
}

/// `destroy`: removes the store without attaching it (it may be damaged).
fn destroy(name: &str) -> ExitCode {
    match Store::destroy(name) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cascade-torture: destroy {name}: {e}");
            ExitCode::from(1)
        }
    }
}

/// `run`: the random operations; prints their statistics.
fn run(store: &Store, params: RunParams) -> ExitCode {
    if params.max_file_size == 0 || params.max_write == 0 || params.max_dirs == 0 {
        eprintln!("cascade-torture: sizes and --max-dirs must be positive");
        return ExitCode::from(1);
    }
    let seed = params.seed;
    eprintln!(
        "cascade-torture: pid {} seed {seed} root {}",
        std::process::id(),
        params.root
    );
    let result = Torture::new(store, params).and_then(|mut t| t.run());
    match result {
        Ok(stats) => {
            println!("{stats}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("cascade-torture: seed {seed}: {f}");
            match f {
                Failure::Violation(_) => ExitCode::from(3),
                Failure::Unexpected(_) => ExitCode::from(4),
            }
        }
    }
}

/// `check`: the content check of every file under `root`.
fn check(store: &Store, root: &str, max_file_size: u64) -> ExitCode {
    match check_tree(store, root, max_file_size) {
        Ok(s) => {
            println!(
                "ok: {} files, {} directories, {} bytes ({} written), {} allocated",
                s.files, s.dirs, s.bytes, s.written_bytes, s.allocated_bytes
            );
            ExitCode::SUCCESS
        }
        Err(problems) => {
            for p in problems {
                eprintln!("VIOLATION: {p}");
            }
            ExitCode::from(3)
        }
    }
}

/// `serve`: scripted commands from stdin, answers on stdout.
fn serve_stdio(store: &Store) -> ExitCode {
    let stdin = std::io::stdin().lock();
    let stdout = std::io::stdout().lock();
    match serve(store, stdin, stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cascade-torture: serve: {e}");
            ExitCode::from(1)
        }
    }
}
