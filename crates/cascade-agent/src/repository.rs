//! The durable store's dedup repository as the agent's dedup levels share it: opened at
//! first use, reopened when another writer added blobs, and the latest manifest of each
//! series remembered as the base of the next checkpoint's deltas.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cascade_dedup::adaptive::{
    self, Bottleneck, Controller, Reason, AUTO_MAX_LEVEL, AUTO_MIN_LEVEL,
};
use cascade_dedup::repo::{part_name, FileRecipe, Manifest, Repo, WriteStats, DEFAULT_PREFIX};
use cascade_dedup::Compression;
use cascade_durable::DurableKey;
use cascade_durable::DurableStore;
use cascade_store::{FileKind, LifeEntry, Store};

use crate::deltas::{recipe_in, PreviousVersion};
use crate::level::Listed;
use crate::node::Checkpoint;
use crate::options::DedupOptions;
use crate::store_write::write_fetched;
use crate::{Error, Result};

/// A checkpoint file found in a manifest of the repository.
pub(crate) struct RepoFile {
    repo: Arc<Repo>,
    recipe: FileRecipe,
    /// When its manifest was written.
    pub(crate) written_unix_ns: u64,
}

pub(crate) struct Repository {
    durable: Arc<DurableStore>,
    /// None: dedup off (the repository is only read, if there is one).
    dedup: Option<DedupOptions>,
    repo: Mutex<Option<Arc<Repo>>>,
    /// Per series (directory), the checkpoint last stored in the repository and its files'
    /// recipes (from its manifest): the base of the next one's deltas, without a read.
    latest_manifests: Mutex<HashMap<String, (String, Vec<FileRecipe>)>>,
    /// This node's name on a job of several nodes: its directory checkpoints are stored as
    /// its part (levels/job.rs joins the parts).
    part_of_node: Option<String>,
    /// The zstd level the next checkpoint is stored with, when the level is adaptive.
    level: Mutex<Controller>,
}

/// The adaptive level's move after a checkpoint (for the log line and `cascade status`).
pub(crate) struct LevelMove {
    pub(crate) from: i32,
    pub(crate) to: i32,
    pub(crate) reason: Reason,
    pub(crate) measured: adaptive::Measured,
}

impl LevelMove {
    /// "zstd:-1 -> zstd:1: upload 2.10 s (0.16 GB/s) against ingest 0.85 s (1.12 GB/s)".
    pub(crate) fn describe(&self) -> String {
        let m = &self.measured;
        let gbps = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.2}", r / 1e9));
        let why = match self.reason {
            Reason::Bottleneck(Some(Bottleneck::Link)) => "the link is the bottleneck",
            Reason::Bottleneck(Some(Bottleneck::Cpu)) => "the CPU is the bottleneck",
            Reason::Bottleneck(Some(Bottleneck::Balanced)) => "balanced",
            Reason::Bottleneck(None) => "too little data to tell",
            Reason::DidNotPay => "the step up shrank the new data by less than 2 %",
        };
        format!(
            "zstd:{} -> zstd:{} ({why}: upload {:.2} s at {} GB/s, ingest {:.2} s at {} GB/s)",
            self.from,
            self.to,
            m.upload_seconds,
            gbps(m.upload_rate()),
            m.ingest_seconds,
            gbps(m.ingest_rate()),
        )
    }
}

impl Repository {
    pub(crate) fn new(
        durable: Arc<DurableStore>,
        dedup: Option<DedupOptions>,
        part_of_node: Option<String>,
    ) -> Repository {
        Repository {
            durable,
            dedup,
            repo: Mutex::new(None),
            latest_manifests: Mutex::new(HashMap::new()),
            part_of_node,
            level: Mutex::new(Controller::new(
                match dedup.map(|d| d.compression) {
                    Some(Compression::Zstd { level }) => level,
                    _ => AUTO_MIN_LEVEL,
                },
                AUTO_MAX_LEVEL,
            )),
        }
    }

    /// The compression the next checkpoint is stored with: the configured one, or with an
    /// adaptive level the level in use.
    pub(crate) fn compression(&self) -> Compression {
        match self.dedup {
            Some(d) if d.adaptive => Compression::Zstd {
                level: self.level.lock().map_or(AUTO_MIN_LEVEL, |c| c.level),
            },
            Some(d) => d.compression,
            None => Compression::None,
        }
    }

    /// With an adaptive level, the level for the next checkpoint after one stored with
    /// `stats` (crate cascade_dedup::adaptive); None when the level is fixed.
    pub(crate) fn adapt(&self, stats: &WriteStats) -> Option<LevelMove> {
        self.adapt_measured(stats.measured())
    }

    /// [`Self::adapt`] from figures measured elsewhere (a checkpoint pushed through the
    /// staging servers: the agent's own work against the time until the servers made it
    /// durable).
    pub(crate) fn adapt_measured(&self, measured: adaptive::Measured) -> Option<LevelMove> {
        if !self.dedup.is_some_and(|d| d.adaptive) {
            return None;
        }
        let mut controller = self.level.lock().ok()?;
        let from = controller.level;
        let reason = controller.observe(&measured);
        Some(LevelMove {
            from,
            to: controller.level,
            reason,
            measured,
        })
    }

    /// The manifest name checkpoint `root` (durable name `ckpt`) is stored under, and
    /// whether that is this node's part of it rather than the whole checkpoint: on a job of
    /// several nodes a directory checkpoint is stored as the node's part; a single file is
    /// one node's own.
    pub(crate) fn stored_name(&self, root: &LifeEntry, ckpt: &str) -> (String, bool) {
        match &self.part_of_node {
            Some(node) if root.kind == FileKind::Dir => (part_name(ckpt, node), true),
            _ => (ckpt.to_string(), false),
        }
    }

    pub(crate) fn options(&self) -> Option<DedupOptions> {
        self.dedup
    }

    /// True if checkpoints are to be stored against the previous one of their series.
    pub(crate) fn deltas(&self) -> bool {
        self.dedup
            .is_some_and(|d| d.delta && d.compression != Compression::None)
    }

    /// The repository: opened (and created, when dedup is on) at first use. None when
    /// dedup is off and the durable store has no repository.
    pub(crate) fn get(&self) -> Result<Option<Arc<Repo>>> {
        let mut cached = self
            .repo
            .lock()
            .map_err(|_| Error::io("dedup", std::io::Error::other("lock poisoned")))?;
        if let Some(repo) = cached.as_ref() {
            return Ok(Some(Arc::clone(repo)));
        }
        let durable = Arc::clone(&self.durable);
        let repo = match self.dedup {
            Some(d) => Some(Repo::open_with_lease(
                durable,
                DEFAULT_PREFIX,
                d.chunking,
                d.compression,
                d.session_lease,
            )?),
            None => Repo::open_existing(durable, DEFAULT_PREFIX)?,
        };
        *cached = repo.map(Arc::new);
        Ok(cached.clone())
    }

    /// Drops the cached repository, so the next use reloads every index object (blobs that
    /// other writers added since it was opened).
    pub(crate) fn reopen(&self) {
        if let Ok(mut cached) = self.repo.lock() {
            *cached = None;
        }
    }

    /// Keeps checkpoint `ckpt`'s file recipes as the latest of its series (the next
    /// checkpoint's deltas need them; else they are read back from the repository).
    pub(crate) fn remember_manifest(&self, root: &LifeEntry, ckpt: &str, files: Vec<FileRecipe>) {
        if let Ok(mut latest) = self.latest_manifests.lock() {
            latest.insert(root.parent_dir().to_string(), (ckpt.to_string(), files));
        }
    }

    /// Checkpoint `p` as the previous version of the next one in its series: its manifest
    /// (remembered from storing it, else read back) and its files, still in the store. None
    /// if the repository does not hold it; a failure to read it only costs deltas.
    pub(crate) fn previous_version<'c>(
        &self,
        repo: &Repo,
        p: &Checkpoint<'c>,
    ) -> Option<PreviousVersion<'c>> {
        let ckpt = DurableKey::from_store_path(&p.root.path);
        let remembered = self
            .latest_manifests
            .lock()
            .ok()
            .and_then(|latest| latest.get(p.root.parent_dir()).cloned())
            .filter(|(key, _)| *key == *ckpt)
            .map(|(_, recipes)| recipes);
        let recipes = match remembered {
            Some(recipes) => recipes,
            None => repo.read_manifest(&ckpt).ok()??.files,
        };
        Some(PreviousVersion {
            checkpoint: p.root.path.clone(),
            root: p.root,
            files: p.files.clone(),
            recipes,
        })
    }

    /// The manifests that could hold `key` (a durable name): its own (a single-file
    /// checkpoint, or a directory checkpoint) and each ancestor's, nearest first.
    fn manifests_around(&self, repo: &Repo, key: &str) -> Result<Vec<(String, Manifest)>> {
        let mut found = Vec::new();
        let mut candidate = key;
        loop {
            if let Some(m) = repo.read_manifest(candidate)? {
                found.push((candidate.to_string(), m));
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return Ok(found),
            }
        }
    }

    /// The recipe of file `key` in a checkpoint of the repository, if one holds it.
    pub(crate) fn find_file(&self, key: &str) -> Result<Option<RepoFile>> {
        let Some(repo) = self.get()? else {
            return Ok(None);
        };
        for (ckpt, m) in self.manifests_around(&repo, key)? {
            let written_unix_ns = m.created_unix_ns;
            if let Some(recipe) = recipe_in(&ckpt, m, key) {
                return Ok(Some(RepoFile {
                    repo,
                    recipe,
                    written_unix_ns,
                }));
            }
        }
        Ok(None)
    }

    /// What lies directly in directory `key` ("" for the root) according to the
    /// repository's manifests: single-file checkpoints as files, directory checkpoints and
    /// directories above checkpoints as directories, and, inside a directory checkpoint, its
    /// files and subdirectories at that level. Times are the manifests' creation times.
    pub(crate) fn list(&self, key: &str) -> Result<Vec<Listed>> {
        let Some(repo) = self.get()? else {
            return Ok(Vec::new());
        };
        let dir = |name: &str| Listed {
            name: name.to_string(),
            dir: true,
            size: 0,
            modified_ns: 0,
        };
        let file = |name: &str, size: u64, m: &Manifest| Listed {
            name: name.to_string(),
            dir: false,
            size,
            modified_ns: i64::try_from(m.created_unix_ns).unwrap_or(i64::MAX),
        };
        let (checkpoints, subdirs) = repo.manifests_in(key)?;
        let mut out: Vec<Listed> = subdirs.iter().map(|d| dir(d)).collect();
        for name in checkpoints {
            let ckpt = if key.is_empty() {
                name.clone()
            } else {
                format!("{key}/{name}")
            };
            match repo.read_manifest(&ckpt)? {
                Some(m) if m.single_file => {
                    let size = m.files.first().map_or(0, |f| f.size);
                    out.push(file(&name, size, &m));
                }
                Some(_) => out.push(dir(&name)),
                None => {}
            }
        }
        if key.is_empty() {
            return Ok(out);
        }
        // Inside a directory checkpoint (the nearest one holding `key`): its entries here.
        let around = self.manifests_around(&repo, key)?;
        if let Some((ckpt, m)) = around.iter().find(|(_, m)| !m.single_file) {
            let prefix = match key.strip_prefix(ckpt.as_str()) {
                Some("") => String::new(),
                Some(rest) => format!("{}/", rest.trim_start_matches('/')),
                None => return Ok(out),
            };
            for f in &m.files {
                match f
                    .path
                    .strip_prefix(&prefix)
                    .map(|rest| rest.split_once('/'))
                {
                    Some(Some((sub, _))) => out.push(dir(sub)),
                    Some(None) => {
                        let name = &f.path[prefix.len()..];
                        out.push(file(name, f.size, m));
                    }
                    None => {}
                }
            }
        }
        Ok(out)
    }

    /// True if `key` is a directory of some checkpoint in the repository (a directory
    /// checkpoint, a directory inside one, or a directory above checkpoints).
    pub(crate) fn is_dir(&self, key: &str) -> Result<bool> {
        let Some(repo) = self.get()? else {
            return Ok(false);
        };
        if repo.has_manifests_below(key)? {
            return Ok(true);
        }
        for (ckpt, m) in self.manifests_around(&repo, key)? {
            if m.single_file {
                continue;
            }
            if ckpt == key {
                return Ok(true);
            }
            let inside = format!("{}/", &key[ckpt.len() + 1..]);
            if m.files.iter().any(|f| f.path.starts_with(&inside)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Rebuilds `file` into the store file `tmp`, verifying every chunk and the whole file;
    /// its size (on an error `tmp` is removed). A blob the loaded index does not name
    /// (written by another node since) makes it reload the index once.
    pub(crate) fn restore(&self, store: &Store, file: &RepoFile, tmp: &str) -> Result<u64> {
        let attempt = |repo: &Repo| -> Result<u64> {
            write_fetched(store, tmp, |out| Ok(repo.restore_file(&file.recipe, out)?))
        };
        match attempt(&file.repo) {
            Err(Error::Dedup(cascade_dedup::repo::Error::Missing(_))) => {
                self.reopen();
                let repo = self.get()?.ok_or_else(|| {
                    Error::io("dedup", std::io::Error::other("the repository went away"))
                })?;
                attempt(&repo)
            }
            other => other,
        }
    }
}
