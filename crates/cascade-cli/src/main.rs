//! `cascade`: the command line of every Cascade level. It creates, inspects, checks and fills
//! the node store (`cascade-store`, settings from `cascade-config`); runs programs under
//! libcascade.so (`run`) and checks or links binaries for it; runs the node agent
//! (`cascade-agent`), a staging server (`cascade-staging`) and the FUSE mount
//! (`cascade-fuse`); commits, waits for, drains, restores and prunes checkpoints in the
//! durable store and the dedup repository (`cascade-durable`, `cascade-dedup`); and carries
//! `analyze` (`cascade-analyze`), `demo`, and `completions` and `man`, which generate shell
//! completions and man pages from the command line itself (scripts/install.sh installs
//! them). Every failure ends as one line on stderr and a non-zero exit code.

mod admin;
mod analyze;
mod binary;
mod checkpoint;
mod cli;
mod demo;
mod dependencies;
mod failure;
mod files;
mod format;
mod fuse;
mod generate;
mod intercepted;
mod io_functions;
mod lifecycle;
mod observe;
mod prune;
mod run;
mod staging;
mod transfer;
mod umask;

use std::process::ExitCode;

use cascade_config::{Config, Inputs};
use clap::error::ErrorKind;
use clap::Parser;

use cli::{Cli, Command, StageServerAction};
use failure::{Failure, EXIT_USAGE};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    // Commands that talk to servers keep SIGPIPE ignored (Rust's default): a server closing a
    // connection must be an error to retry, not the death of the agent.
    let talks_to_servers = matches!(
        cli.command,
        Command::Agent { .. }
            | Command::Run { .. }
            | Command::Drain { .. }
            | Command::Restore { .. }
            | Command::Prune { .. }
            | Command::Demo(..)
            | Command::Wait { .. }
            | Command::Status { .. }
            | Command::StageServer { .. }
    );
    if !talks_to_servers {
        restore_default_sigpipe();
    }
    match run(cli) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("cascade: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Store paths given on the command line, each as [`Config::store_path`] takes it.
fn store_paths(config: &Config, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .map(|p| config.store_path(p).into_owned())
        .collect()
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    format::set_verbosity(cli.verbose, cli.quiet);
    let load = |flags: &[&[(&'static str, String)]]| load_config(&cli, flags);
    let none = || load(&[]);
    match &cli.command {
        Command::Init { params } => admin::init(&load(&[&params.values])?),
        Command::Status { json } => admin::status(&none()?, *json),
        Command::Fsck { repair, json } => admin::fsck(&none()?, *repair, *json),
        Command::Destroy { force } => admin::destroy(&none()?, *force),
        Command::Config {
            json,
            params,
            mount,
        } => admin::show_config(&load(&[&params.values, &mount.values])?, *json),
        Command::Ls {
            levels: true,
            path,
            json,
            ..
        } => {
            let config = none()?;
            lifecycle::ls_levels(&config, &config.store_path(path), *json)
        }
        Command::Ls { long, path, .. } => {
            let config = none()?;
            files::ls(&config, &config.store_path(path), *long)
        }
        Command::Stat { path, json } => {
            let config = none()?;
            files::stat(&config, &config.store_path(path), *json)
        }
        Command::Mkdir { parents, paths } => {
            let config = none()?;
            files::mkdir(&config, &store_paths(&config, paths), *parents)
        }
        Command::Rm { recursive, paths } => {
            let config = none()?;
            files::rm(&config, &store_paths(&config, paths), *recursive)
        }
        Command::Put {
            parents,
            local,
            store_path,
        } => {
            let config = none()?;
            transfer::put(&config, local, &config.store_path(store_path), *parents)
        }
        Command::Get { store_path, local } => {
            let config = none()?;
            transfer::get(&config, &config.store_path(store_path), local)
        }
        Command::Run {
            mount,
            agent,
            dedup,
            command,
        } => {
            // A missing command is a usage error, found before any store is touched.
            run::require_command(command)?;
            run::run(
                &load(&[&mount.values, &agent.values, &dedup.values])?,
                command,
            )
        }
        Command::Agent { agent, dedup, log } => {
            let config = load(&[&agent.values, &dedup.values, &log.values])?;
            let _log = observe::start_logs(&config, cli.quiet)?;
            lifecycle::agent(&config, cli.verbose)
        }
        Command::Commit { path } => {
            let config = none()?;
            lifecycle::commit(&config, &config.store_path(path))
        }
        Command::Wait {
            path,
            level,
            timeout,
            json,
        } => {
            let config = none()?;
            lifecycle::wait(&config, &config.store_path(path), *level, *timeout, *json)
        }
        Command::Drain {
            path,
            durable,
            dedup,
            json,
        } => {
            let config = load(&[&dedup.values])?;
            let to = durable_or_configured(&config, durable.as_deref(), "--durable")?;
            checkpoint::drain(&config, &config.store_path(path), &to, *json)
        }
        Command::Restore {
            ckpt,
            dest,
            durable,
            into_store,
            partial,
            json,
        } => {
            let config = none()?;
            let from = durable_or_configured(&config, durable.as_deref(), "--durable")?;
            if *into_store {
                let dest = dest.as_deref().map(|d| config.store_path(d));
                checkpoint::restore_into_store(&config, ckpt, dest.as_deref(), &from, *json)
            } else {
                checkpoint::restore_local(ckpt, dest.as_deref(), &from, *partial, *json)
            }
        }
        Command::Prune {
            checkpoints,
            keep_last,
            dry_run,
            orphans,
            durable,
            json,
        } => {
            let config = none()?;
            let url = durable_or_configured(&config, durable.as_deref(), "--durable")?;
            umask::restrict(&config)?;
            prune::prune(&url, checkpoints, *keep_last, *dry_run, *orphans, *json)
        }
        Command::LinkFlags => binary::link_flags(),
        Command::CheckBinary { program } => binary::check_binary(program),
        Command::StageServer {
            action:
                Some(StageServerAction::Status {
                    server,
                    json,
                    params,
                }),
            ..
        } => staging::status(&load(&[&params.values])?, server.as_deref(), *json),
        Command::StageServer {
            action: Some(StageServerAction::Credential { namespace, params }),
            ..
        } => staging::credential(&load(&[&params.values])?, namespace.as_deref()),
        Command::StageServer {
            action: None,
            params,
            log,
        } => {
            let config = load(&[&params.values, &log.values])?;
            let _log = observe::start_logs(&config, cli.quiet)?;
            staging::serve(&config, cli.verbose)
        }
        Command::Mount {
            mountpoint,
            threads,
            kernel_cache,
            allow_other,
        } => fuse::mount(
            &none()?,
            mountpoint,
            &cascade_fuse::MountOptions {
                threads: *threads as usize,
                kernel_cache: *kernel_cache,
                allow_other: *allow_other,
            },
        ),
        Command::Umount { mountpoint, lazy } => fuse::umount(mountpoint, *lazy),
        Command::Analyze(args) => analyze::analyze(args),
        Command::Demo(args) => {
            let args = demo::DemoArgs {
                quiet: cli.quiet,
                ..args.clone()
            };
            demo::demo(&args, cli.store.as_deref(), cli.config.as_deref())
        }
        Command::Completions(args) => generate::completions(args),
        Command::Man(args) => generate::man(args),
    }
}

/// The durable store given on the command line, else the configured one.
fn durable_or_configured(
    config: &Config,
    given: Option<&str>,
    flag: &str,
) -> Result<String, Failure> {
    if let Some(url) = given.filter(|u| cascade_secret::redact_url(u) != *u) {
        eprintln!(
            "cascade: warning: {flag} {} puts a secret on the command line, where ps shows it to every user of the machine; use CASCADE_S3_CREDENTIALS_FILE or CASCADE_S3_ACCESS_KEY_ID/CASCADE_S3_SECRET_ACCESS_KEY instead",
            cascade_secret::redact_url(url)
        );
    }
    given
        .map(str::to_string)
        .or(config.durable_url())
        .ok_or_else(|| {
            Failure::new(format!(
                "no durable store: give {flag} URL or set CASCADE_DURABLE (durable.url)"
            ))
        })
}

/// The configuration from the process's environment, config file and these flag values
/// (by setting key), plus the global --store and --config.
fn load_config(cli: &Cli, flags: &[&[(&'static str, String)]]) -> Result<Config, Failure> {
    let mut inputs = Inputs::from_process();
    inputs.config_flag = cli.config.clone();
    if let Some(store) = &cli.store {
        inputs.flags.push(("store.name", store.clone()));
    }
    for group in flags {
        inputs.flags.extend(group.iter().cloned());
    }
    let config = Config::load(&inputs)?;
    for warning in config.warnings() {
        eprintln!("cascade: {warning}");
    }
    Ok(config)
}

/// Help and version go to stdout as clap formats them; real usage errors become one line.
fn usage_error(err: clap::Error) -> ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // If printing help fails, stdout is gone and there is no one to tell.
            let _ = err.print();
            ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(EXIT_USAGE))
        }
        _ => {
            let rendered = err.to_string();
            // clap lists missing arguments on indented lines after the first; keep them.
            let mut lines = rendered.lines();
            let first = lines.next().unwrap_or("invalid command line");
            let mut message = first.strip_prefix("error: ").unwrap_or(first).to_string();
            for detail in lines.take_while(|l| l.starts_with("  ") && !l.trim().is_empty()) {
                message.push(' ');
                message.push_str(detail.trim());
            }
            // "Usage: cascade init [OPTIONS]" names the (sub)command whose help to point to.
            let command = rendered
                .lines()
                .find_map(|line| line.strip_prefix("Usage: "))
                .map(|usage| {
                    let words: Vec<&str> = usage
                        .split_whitespace()
                        .take_while(|w| !w.starts_with(['[', '<', '-']))
                        .collect();
                    words.join(" ")
                })
                .filter(|command| !command.is_empty())
                .unwrap_or_else(|| "cascade".to_string());
            eprintln!("cascade: {message} (see '{command} --help')");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// Rust ignores SIGPIPE, which turns `cascade get x - | head` into an error message; a
/// command-line tool should just stop, as cat does.
fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL at startup, before any threads exist.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
