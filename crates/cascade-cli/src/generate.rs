//! `cascade completions SHELL` and `cascade man --out DIR`: shell completions and man pages
//! generated from the clap definitions themselves (clap_complete, clap_mangen), so they
//! list exactly the subcommands and flags the binary parses. scripts/install.sh installs
//! what they write.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::cli::Cli;
use crate::failure::Failure;

pub const COMPLETIONS_ABOUT: &str = "Prints a completion script for SHELL on standard \
output, generated from this binary's own command line. Install it where the shell looks:
  bash  PREFIX/share/bash-completion/completions/cascade
  zsh   PREFIX/share/zsh/site-functions/_cascade
  fish  PREFIX/share/fish/vendor_completions.d/cascade.fish
scripts/install.sh does this.";

pub const MAN_ABOUT: &str = "Writes the man pages (section 1) of cascade and of each of its \
subcommands into DIR: cascade.1, cascade-run.1, cascade-stage-server-status.1, ... They are \
generated from this binary's own command line and help texts. scripts/install.sh installs \
them into PREFIX/share/man/man1.";

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Writes `shell`'s completion script for `cascade` to standard output.
pub fn completions(args: &CompletionsArgs) -> Result<ExitCode, Failure> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "cascade", &mut script);
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::io("standard output", &e))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes one man page per command and subcommand into `args.out`; prints each path.
pub fn man(args: &ManArgs) -> Result<ExitCode, Failure> {
    let dir = &args.out;
    std::fs::create_dir_all(dir).map_err(|e| Failure::io(&dir.display().to_string(), &e))?;
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Builds every subcommand, giving each its display name ("cascade-run").
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, dir, &mut written)?;
    let mut stdout = io::stdout().lock();
    for path in &written {
        // A closed stdout only loses the listing; the pages are written.
        let _ = writeln!(stdout, "{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<(), Failure> {
    let page = clap_mangen::Man::new(cmd.clone()).manual("Cascade");
    let path = dir.join(page.get_filename());
    let render = || -> io::Result<()> {
        let mut out = BufWriter::new(File::create(&path)?);
        page.render(&mut out)?;
        out.flush()
    };
    render().map_err(|e| Failure::io(&path.display().to_string(), &e))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
