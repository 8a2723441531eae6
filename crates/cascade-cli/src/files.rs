//! Namespace commands: ls, stat, mkdir, rm.

use std::process::ExitCode;

use cascade_config::{format_size, Config};
use cascade_store::{FileKind, Metadata, Store};

use crate::admin::attach;
use crate::failure::Failure;
use crate::format::{join, mode, time};

const DIR_MODE: u32 = 0o755;

fn stat_of(store: &Store, path: &str) -> Result<Metadata, Failure> {
    store.stat(path).map_err(|err| Failure::store(path, &err))
}

pub fn ls(config: &Config, path: &str, long: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let meta = stat_of(&store, path)?;
    if !meta.is_dir() {
        print_entry(path, &meta, long);
        return Ok(ExitCode::SUCCESS);
    }
    let entries = store
        .read_dir(path)
        .map_err(|err| Failure::store(path, &err))?;
    for entry in entries {
        if long {
            let meta = stat_of(&store, &join(path, &entry.name))?;
            print_entry(&entry.name, &meta, true);
        } else {
            println!("{}", entry.name);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_entry(name: &str, meta: &Metadata, long: bool) {
    if long {
        println!(
            "{} {:>6} {:>6} {:>14} {} {name}",
            mode(meta.kind, meta.mode),
            meta.uid,
            meta.gid,
            meta.size,
            time(meta.mtime)
        );
    } else {
        println!("{name}");
    }
}

pub fn stat(config: &Config, path: &str, as_json: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    let m = stat_of(&store, path)?;
    let kind = match m.kind {
        FileKind::Dir => "directory",
        FileKind::File => "regular file",
    };
    if as_json {
        let file = m.kind == FileKind::File;
        println!(
            "{}",
            serde_json::json!({
                "path": path,
                "type": if file { "file" } else { "directory" },
                "size": m.size,
                "inode": m.ino,
                "mode": m.mode,
                "uid": m.uid,
                "gid": m.gid,
                "chunks_in_memory": file.then_some(m.chunks_in_memory),
                "chunks_spilled": file.then_some(m.chunks_spilled),
                "chunk_size": m.chunk_size,
                "allocated_bytes": file.then(|| m.allocated_bytes()),
                "atime_ns": m.atime,
                "mtime_ns": m.mtime,
                "ctime_ns": m.ctime,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("  path    {path}");
    println!("  type    {kind}");
    println!("  size    {} ({})", m.size, format_size(m.size));
    println!("  inode   {}", m.ino);
    println!("  mode    {:04o} ({})", m.mode, mode(m.kind, m.mode));
    println!("  owner   uid {}, gid {}", m.uid, m.gid);
    if m.kind == FileKind::File {
        println!(
            "  chunks  {} in memory, {} spilled, of {} each ({} allocated)",
            m.chunks_in_memory,
            m.chunks_spilled,
            format_size(m.chunk_size),
            format_size(m.allocated_bytes())
        );
    }
    println!("  access  {}", time(m.atime));
    println!("  modify  {}", time(m.mtime));
    println!("  change  {}", time(m.ctime));
    Ok(ExitCode::SUCCESS)
}

pub fn mkdir(config: &Config, paths: &[String], parents: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    for path in paths {
        let made = if parents {
            store.create_dir_all(path, DIR_MODE)
        } else {
            store.mkdir(path, DIR_MODE)
        };
        made.map_err(|err| Failure::store(path, &err))?;
    }
    Ok(ExitCode::SUCCESS)
}

pub fn rm(config: &Config, paths: &[String], recursive: bool) -> Result<ExitCode, Failure> {
    let store = attach(config)?;
    for path in paths {
        let meta = stat_of(&store, path)?;
        if !meta.is_dir() {
            store
                .unlink(path)
                .map_err(|err| Failure::store(path, &err))?;
        } else if !recursive {
            return Err(Failure::new(format!(
                "{path}: Is a directory (use rm -r to remove it and its contents)"
            )));
        } else if meta.ino == stat_of(&store, "/")?.ino {
            return Err(Failure::new(
                "refusing to remove the root directory / (use 'cascade destroy' to delete the store)",
            ));
        } else {
            remove_tree(&store, path)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes a directory and everything under it, children first.
fn remove_tree(store: &Store, dir: &str) -> Result<(), Failure> {
    let entries = store
        .read_dir(dir)
        .map_err(|err| Failure::store(dir, &err))?;
    for entry in entries {
        let child = join(dir, &entry.name);
        match entry.kind {
            FileKind::Dir => remove_tree(store, &child)?,
            FileKind::File => store
                .unlink(&child)
                .map_err(|err| Failure::store(&child, &err))?,
        }
    }
    store.rmdir(dir).map_err(|err| Failure::store(dir, &err))
}
