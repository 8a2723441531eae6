//! Read-through (docs/agent.md, "Read-through and the control socket"): a store path the
//! application looks for and the store lacks is fetched from the levels below. Every level
//! is asked; the newest version found wins (the nearest level on a tie), is written under a
//! temporary name, verified, and renamed into place.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cascade_durable::DurableKey;

use crate::agent::Agent;
use crate::level::Listed;
use crate::store_write::fetch_temp_name;
use crate::{Error, Result};

/// How long a directory's listing from the levels below is trusted: other nodes of the job
/// may add to it meanwhile.
const LIST_AGAIN: Duration = Duration::from_secs(5);

impl Agent {
    /// Makes `path` (a store path) exist in the store from the levels below: a file is
    /// fetched, verified (against its `.blake3` object, or every chunk and the file's
    /// BLAKE3), and renamed into place; a directory (a prefix with objects below it) is
    /// created. ENOENT if no level has either, EIO if the data does not match its checksum.
    pub fn fetch(&self, path: &str) -> Result<()> {
        let path = format!("/{}", path.trim_matches('/'));
        if self.is_here(&path) {
            return Ok(());
        }
        // One download per path: later requests wait for the first.
        {
            let mut busy = self
                .fetching
                .lock()
                .map_err(|_| Error::io("fetch", std::io::Error::other("lock poisoned")))?;
            while busy.contains(&path) {
                busy = self
                    .fetched
                    .wait(busy)
                    .map_err(|_| Error::io("fetch", std::io::Error::other("lock poisoned")))?;
            }
            if self.is_here(&path) {
                return Ok(());
            }
            busy.insert(path.clone());
        }
        let result = self.fetch_uncached(&path);
        if let Ok(mut busy) = self.fetching.lock() {
            busy.remove(&path);
        }
        self.fetched.notify_all();
        result
    }

    /// `path` is in the store with its content (not a remote file, whose content is below).
    fn is_here(&self, path: &str) -> bool {
        self.store().stat(path).is_ok_and(|m| !m.remote)
    }

    /// Makes directory `path` (a store path) show what the levels below hold directly in it:
    /// each subdirectory is created, and each file the store lacks is created remote (name,
    /// size and time; its content is fetched when it is opened). The newest version of a
    /// name wins across levels; what the store has already stays. A directory listed less
    /// than [`LIST_AGAIN`] ago is not listed again. ENOENT if no level has it and the store
    /// lacks it.
    pub fn list(&self, path: &str) -> Result<()> {
        let path = format!("/{}", path.trim_matches('/'));
        {
            let mut listed = self
                .listed
                .lock()
                .map_err(|_| Error::io("list", std::io::Error::other("lock poisoned")))?;
            if listed
                .get(&path)
                .is_some_and(|at| at.elapsed() < LIST_AGAIN)
            {
                return Ok(());
            }
            listed.insert(path.clone(), Instant::now());
        }
        let key = DurableKey::from_store_path(&path);
        let mut below: BTreeMap<String, Listed> = BTreeMap::new();
        for level in &self.levels {
            for entry in level.list(&self.node, &key)? {
                match below.get(&entry.name) {
                    Some(seen) if seen.dir || seen.modified_ns >= entry.modified_ns => {}
                    _ => {
                        below.insert(entry.name.clone(), entry);
                    }
                }
            }
        }
        if below.is_empty() {
            return Ok(());
        }
        let store = self.store();
        store
            .create_dir_all(&path, 0o755)
            .map_err(|e| Error::store(&path, e))?;
        let mut shown = 0usize;
        for (name, entry) in below {
            let child = if path == "/" {
                format!("/{name}")
            } else {
                format!("{path}/{name}")
            };
            let made = if entry.dir {
                match store.mkdir(&child, 0o755) {
                    Ok(()) => true,
                    Err(e) if e.errno() == libc::EEXIST => false,
                    Err(e) => return Err(Error::store(&child, e)),
                }
            } else {
                store
                    .create_remote(&child, entry.size, entry.modified_ns)
                    .map_err(|e| Error::store(&child, e))?
            };
            shown += usize::from(made);
        }
        if shown > 0 {
            self.node
                .log(|| format!("listed {path}: {shown} entries from the levels below"));
        }
        Ok(())
    }

    fn fetch_uncached(&self, path: &str) -> Result<()> {
        let key = DurableKey::from_store_path(path);
        let started = Instant::now();
        let tmp = fetch_temp_name(path);
        let mut found = Vec::new();
        for (i, level) in self.levels.iter().enumerate() {
            if let Some(f) = level.find(&self.node, &key)? {
                found.push((i, f));
            }
        }
        found.sort_by_key(|(i, f)| (Reverse(f.stamp), *i));
        for (i, f) in found {
            // None: gone meanwhile (drained and reclaimed, or the server failed).
            if let Some(size) = (f.fetch)(&tmp)? {
                let staged_only = !self.levels[i].durable();
                return self.install_fetched(&tmp, path, size, staged_only, started);
            }
        }
        for level in &self.levels {
            if level.is_dir(&self.node, &key)? {
                return self
                    .store()
                    .create_dir_all(path, 0o755)
                    .map_err(|e| Error::store(path, e));
            }
        }
        Err(Error::Durable(cascade_durable::Error::NotFound {
            store: self.durable().name().to_string(),
            path: key.to_string(),
        }))
    }

    /// Renames a verified fetched file into place and records the level it came from
    /// (staged only, or durable), so it is not sent back down.
    fn install_fetched(
        &self,
        tmp: &str,
        path: &str,
        size: u64,
        staged_only: bool,
        started: Instant,
    ) -> Result<()> {
        self.store()
            .rename_fetched(tmp, path, staged_only)
            .map_err(|e| Error::store(path, e))?;
        self.node.count(|s| {
            s.fetched_files += 1;
            s.fetched_bytes += size;
        });
        let from = if staged_only {
            " from a staging server"
        } else {
            ""
        };
        self.node.log(|| {
            format!(
                "fetched {path} ({size} bytes, verified){from} in {:.3} s",
                started.elapsed().as_secs_f64()
            )
        });
        Ok(())
    }
}
