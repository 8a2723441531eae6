//! `cascade-posix-diff`: run one random sequence of POSIX file-system calls on two directory
//! trees and compare every result (see the library docs).
//!
//! Exit codes: 0 the sides agreed throughout (a one-line summary on stdout); 1 a mismatch
//! (the report on stderr); 2 bad usage or the run could not start.

use std::io::Write;
use std::process::ExitCode;

use cascade_posix_diff::{run, Config, Level, RunError, Sabotage};
use clap::Parser;

#[derive(Parser)]
#[command(
    version,
    about = "Differential POSIX test: the same random file-system calls on two trees (e.g. \
Cascade and tmpfs), comparing every return value, errno and byte read",
    after_help = "Run Cascade vs tmpfs with: cascade run -- cascade-posix-diff --a \
/cascade/diff --b /dev/shm/diff ... The directories are created if missing; give fresh ones \
(existing contents are compared before the first op)."
)]
struct Cli {
    /// Which calls: posix (raw system-call wrappers) or libc (mkstemp, glob, nftw, fts,
    /// scandir, posix_spawn file actions, exec of stored programs, ...)
    #[arg(long, default_value = "posix", value_name = "LEVEL")]
    level: Level,
    /// Seed of the sequence; the same seed replays the same calls (default: random, printed)
    #[arg(long)]
    seed: Option<u64>,
    /// Number of random operations
    #[arg(long, default_value_t = 1000)]
    ops: u64,
    /// Side A directory (e.g. under the Cascade mount prefix)
    #[arg(long, value_name = "DIR")]
    a: String,
    /// Side B directory (the reference, e.g. on tmpfs)
    #[arg(long, value_name = "DIR")]
    b: String,
    /// Compare the whole trees every K ops (0: only before the first op and at the end)
    #[arg(long, value_name = "K", default_value_t = 100)]
    check_every: u64,
    /// Plain paths only: no trailing slashes, x/../y, ./, //, or 255/256-byte names
    #[arg(long)]
    no_quirks: bool,
    /// Libc level: leave out these calls (names as in the summary, e.g. glob,remove), to
    /// look past a known difference
    #[arg(long, value_name = "CALLS", value_delimiter = ',')]
    skip: Vec<String>,
    /// Print every op and its result to stdout as it happens
    #[arg(long)]
    trace: bool,
    /// Deliberately corrupt side A (flip-byte@N or short-write@N), to test the harness
    #[arg(long, value_name = "KIND@N", hide = true)]
    sabotage: Option<Sabotage>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(rand::random);
    let cfg = Config {
        level: cli.level,
        seed,
        ops: cli.ops,
        a: cli.a,
        b: cli.b,
        check_every: cli.check_every,
        quirks: !cli.no_quirks,
        sabotage: cli.sabotage,
        skip: cli.skip,
    };
    let mut stdout = std::io::stdout().lock();
    let trace: Option<&mut dyn Write> = if cli.trace { Some(&mut stdout) } else { None };
    let result = run(&cfg, trace);
    let _ = stdout.flush();
    match result {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(RunError::Mismatch(m)) => {
            eprintln!("{m}");
            ExitCode::from(1)
        }
        Err(RunError::Setup(msg)) => {
            eprintln!("cascade-posix-diff: seed={seed}: {msg}");
            ExitCode::from(2)
        }
    }
}
