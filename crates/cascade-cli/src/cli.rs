//! Command-line syntax. Store parameters (`--capacity`, `--chunk-size`, ...) are not listed
//! here: [`StoreParams`] adds one flag per row of `cascade_config::SETTINGS`, so a new
//! setting gets its flag, help text and env variable from the table.

use std::path::PathBuf;

use cascade_config::SETTINGS;
use clap::{Arg, ArgMatches, Args, FromArgMatches, Parser, Subcommand};

const SIZES: &str = "Sizes are bytes, or a number with a unit: 64k, 1M, 4G (binary, \
same as 64KiB, 1MiB, 4GiB); 1kB, 1MB, 1GB are decimal; fractions such as 1.5GiB work.";

const PRECEDENCE: &str = "Every setting comes from, in this order: a flag, its CASCADE_* \
environment variable, the config file, a default. 'cascade config' shows which.";

#[derive(Debug, Parser)]
#[command(
    name = "cascade",
    version,
    about = "Cascade node store: checkpoint files at memory speed in a shared-memory block",
    long_about = "Cascade keeps checkpoint files in a node-local POSIX shared-memory block \
(spilling to a file on local SSD when memory is full). Files survive the processes that \
wrote them and are gone only when the store is destroyed or the node reboots.",
    after_help = PRECEDENCE,
    propagate_version = true
)]
pub struct Cli {
    /// Store to use: its POSIX shared-memory name, e.g. /cascade-ckpt
    /// [env: CASCADE_STORE] [default: /cascade-<uid>]
    #[arg(long, global = true, value_name = "NAME")]
    pub store: Option<String>,

    /// TOML config file to read [env: CASCADE_CONFIG]
    /// [default: ~/.config/cascade/config.toml, else /etc/cascade/config.toml, if present]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the store: a shared-memory block, plus a spill file if spill is on
    #[command(after_help = format!("{SIZES}\n\n{PRECEDENCE}"))]
    Init {
        #[command(flatten)]
        params: StoreParams,
    },

    /// Show capacity, usage, spill, files, attached processes and the last ENOSPC
    #[command(after_help = "Sizes are shown in binary units (1 GiB = 2^30 bytes).")]
    Status {
        /// Print machine-readable JSON (all sizes in bytes, times in ns since the epoch)
        #[arg(long)]
        json: bool,
    },

    /// List a directory of the store (or show one file)
    Ls {
        /// Long listing: type and permissions, owner, size in bytes, modification time (UTC)
        #[arg(short = 'l')]
        long: bool,
        /// Store path to list
        #[arg(default_value = "/", value_name = "PATH")]
        path: String,
    },

    /// Show a file's or directory's metadata and where its chunks are
    Stat {
        /// Store path, e.g. /ckpt.0001/rank0.dat
        #[arg(value_name = "PATH")]
        path: String,
    },

    /// Copy a local file into the store (1 MiB writes; prints bytes and GB/s)
    #[command(
        after_help = "GB/s is decimal (10^9 bytes per second). A progress bar is shown \
on a terminal for files of 64 MiB and more. If the store fills up, the command fails with \
'No space left on device', the part written so far is kept, and 'cascade status' shows why."
    )]
    Put {
        /// Create missing parent directories of STORE_PATH
        #[arg(short = 'p', long)]
        parents: bool,
        /// Local file to read, or - for standard input
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
        /// Destination in the store; an existing directory gets LOCAL's file name
        #[arg(value_name = "STORE_PATH")]
        store_path: String,
    },

    /// Copy a file from the store to a local file (1 MiB reads; prints bytes and GB/s)
    #[command(
        after_help = "GB/s is decimal (10^9 bytes per second). Holes read back as \
zeros. With LOCAL = -, data goes to standard output; whenever LOCAL is - or a pipe or \
device, the summary goes to standard error."
    )]
    Get {
        /// File in the store
        #[arg(value_name = "STORE_PATH")]
        store_path: String,
        /// Local file to write (replaced if it exists), a directory, or - for standard output
        #[arg(value_name = "LOCAL")]
        local: PathBuf,
    },

    /// Remove files (and with -r, directories and everything in them); frees space at once
    Rm {
        /// Remove directories and their contents
        #[arg(short = 'r', long)]
        recursive: bool,
        /// Store paths to remove
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<String>,
    },

    /// Create directories in the store (mode 0755)
    Mkdir {
        /// Create missing parents too; no error if the directory exists
        #[arg(short = 'p', long)]
        parents: bool,
        /// Directories to create
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<String>,
    },

    /// Check the store's invariants; exit 0 when clean, 1 when errors are found
    #[command(
        after_help = "Warnings (crash leftovers such as leaked chunks or leases of dead \
processes) do not make the check fail; --repair reclaims them. Errors are violated invariants."
    )]
    Fsck {
        /// Repair what can be repaired (reclaim leaked chunks and dead processes' leases)
        #[arg(long)]
        repair: bool,
    },

    /// Delete the store: its shared-memory block and its spill file, with every file in it
    #[command(
        after_help = "Refuses while other processes are attached, unless --force. \
Processes still attached then keep their mapping until they exit; the memory is freed when \
the last one detaches."
    )]
    Destroy {
        /// Destroy even if processes are still attached
        #[arg(long)]
        force: bool,
    },

    /// Print every setting's effective value and where it came from
    #[command(after_help = format!("{PRECEDENCE}\n\n{SIZES}"))]
    Config {
        /// Print machine-readable JSON (sizes in bytes)
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        params: StoreParams,
    },
}

/// Flag values for store settings, by setting key ("store.capacity").
#[derive(Debug, Clone, Default)]
pub struct StoreParams {
    pub values: Vec<(&'static str, String)>,
}

/// Settings with a flag of their own under init/config; `--store` is global instead.
fn param_settings() -> impl Iterator<Item = (&'static str, &'static cascade_config::SettingDef)> {
    SETTINGS
        .iter()
        .filter_map(|def| def.flag.map(|flag| (flag, def)))
        .filter(|(flag, _)| *flag != "store")
}

impl Args for StoreParams {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        param_settings().fold(cmd, |cmd, (flag, def)| {
            let help = format!(
                "{} [env: {}] [default: {}]",
                def.help, def.env, def.default_help
            );
            cmd.arg(
                Arg::new(flag)
                    .long(flag)
                    .value_name(def.value_name)
                    .help(help)
                    .help_heading("Store parameters")
                    .num_args(1),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for StoreParams {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let values = param_settings()
            .filter_map(|(flag, def)| {
                let value = matches.get_one::<String>(flag)?;
                Some((def.key, value.clone()))
            })
            .collect();
        Ok(StoreParams { values })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn table_flags_reach_the_settings() {
        let cli = Cli::try_parse_from([
            "cascade",
            "--store",
            "/s",
            "init",
            "--capacity",
            "64MiB",
            "--spill-size",
            "0",
        ])
        .expect("parses");
        assert_eq!(cli.store.as_deref(), Some("/s"));
        let Command::Init { params } = cli.command else {
            panic!("not init: {:?}", cli.command);
        };
        assert_eq!(
            params.values,
            vec![
                ("store.capacity", "64MiB".to_string()),
                ("spill.size", "0".to_string())
            ]
        );
    }
}
