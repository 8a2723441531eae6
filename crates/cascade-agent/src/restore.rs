//! Restoring a complete checkpoint from the durable tier.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cascade_dedup::repo::{part_name, Manifest, Repo};
use cascade_durable::{DurableStore, FileDigest, Marker, MarkerFile, PartsIn, MARKER_NAME};
use cascade_store::Store;

use crate::report::{marker_file, Progress, Report};
use crate::store_write::{create_for_writing, StoreWriter};
use crate::{Error, Result};

/// Suffix of files being restored; they are renamed into place only once every file of the
/// checkpoint has been downloaded and verified.
fn staging_suffix() -> String {
    format!(".cascade-restore-{}", std::process::id())
}

/// Where a complete checkpoint's files come from: the plain layout (its completion marker)
/// or the dedup repository (its manifest).
enum Source<'a> {
    Plain {
        durable: &'a DurableStore,
        marker: Marker,
    },
    Dedup {
        repo: &'a Repo,
        manifest: Manifest,
    },
    /// What the parts of a checkpoint of several nodes list, when not every node's part is
    /// there (a partial restore).
    Parts {
        durable: &'a DurableStore,
        ckpt: String,
        files: Vec<MarkerFile>,
    },
}

impl Source<'_> {
    fn files(&self) -> Vec<MarkerFile> {
        match self {
            Source::Plain { marker, .. } => marker.files.clone(),
            Source::Dedup { manifest, .. } => manifest.files.iter().map(marker_file).collect(),
            Source::Parts { files, .. } => files.clone(),
        }
    }

    /// Writes file `i` into `out`, verified against its checksum (plain) or every chunk's
    /// score and the file's BLAKE3 (dedup); on an error the output must be discarded.
    fn write<W: Write + Send>(&self, i: usize, out: &mut W) -> Result<FileDigest> {
        match self {
            Source::Plain { durable, marker } => durable
                .download_to(&marker.object_key(&marker.files[i]), out)
                .map_err(Error::Durable),
            Source::Dedup { repo, manifest } => {
                let recipe = &manifest.files[i];
                let size = repo.restore_file(recipe, out)?;
                Ok(FileDigest {
                    size,
                    blake3: recipe.blake3.clone(),
                })
            }
            Source::Parts {
                durable,
                ckpt,
                files,
            } => durable
                .download_to(&format!("{ckpt}/{}", files[i].path), out)
                .map_err(Error::Durable),
        }
    }
}

/// The source of a complete checkpoint: its marker in the plain layout, else its manifest in
/// the dedup repository (when one is given), else [`Error::Incomplete`].
fn complete_source<'a>(
    durable: &'a DurableStore,
    repo: Option<&'a Repo>,
    ckpt: &str,
) -> Result<(String, Source<'a>)> {
    let ckpt =
        cascade_durable::normalize_rel(ckpt.trim_end_matches('/')).map_err(Error::Durable)?;
    if let Some(marker) = durable.read_marker(&ckpt).map_err(Error::Durable)? {
        return Ok((ckpt, Source::Plain { durable, marker }));
    }
    if let Some(repo) = repo {
        if let Some(manifest) = repo.read_manifest(&ckpt)? {
            return Ok((ckpt, Source::Dedup { repo, manifest }));
        }
    }
    let parts = durable.read_parts(&ckpt).map_err(Error::Durable)?;
    if !parts.is_empty() {
        return Err(Error::IncompleteJob {
            store: durable.name().to_string(),
            checkpoint: ckpt,
            parts: PartsIn::of(&parts).describe(),
        });
    }
    // Nothing at all under the name, or files without their marker (a drain that never
    // finished) are different problems. A dedup repository's packs cannot be told apart by
    // checkpoint, so with one it stays "not complete".
    if repo.is_none()
        && durable
            .list(&format!("{ckpt}/"))
            .map_err(Error::Durable)?
            .is_empty()
    {
        return Err(Error::NoCheckpoint {
            store: durable.name().to_string(),
            checkpoint: ckpt.clone(),
            why: format!("nothing under {ckpt}/ in the durable store"),
        });
    }
    Err(Error::Incomplete {
        store: durable.name().to_string(),
        checkpoint: ckpt,
        marker: MARKER_NAME,
    })
}

/// Counts bytes through to `progress` while writing to `inner`.
struct Counting<'a, W> {
    inner: W,
    done: u64,
    progress: Progress<'a>,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.done += n as u64;
        (self.progress)(self.done);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Checks a downloaded file against its marker entry (download_to already checked it
/// against its `.blake3` object).
fn check_against_marker(
    rel: &str,
    digest: &cascade_durable::FileDigest,
    entry: &cascade_durable::MarkerFile,
) -> Result<()> {
    if digest.size != entry.size || digest.blake3 != entry.blake3 {
        return Err(Error::Mismatch {
            path: rel.to_string(),
            reason: format!(
                "does not match the checkpoint's marker (marker: {} bytes, blake3 {}; \
                 downloaded: {} bytes, blake3 {})",
                entry.size, entry.blake3, digest.size, digest.blake3
            ),
        });
    }
    Ok(())
}

/// Downloads every file of the complete checkpoint `ckpt` into the local directory `dest`
/// (created if missing), verifying each against its checksum and the marker. Files are
/// staged under temporary names and renamed into place only when all of them verified, so a
/// failure leaves no restored file behind. An incomplete checkpoint (no marker) is refused.
pub fn restore_checkpoint(
    durable: &DurableStore,
    repo: Option<&Repo>,
    ckpt: &str,
    dest: &Path,
    progress: Progress<'_>,
) -> Result<Report> {
    let (ckpt, source) = complete_source(durable, repo, ckpt)?;
    restore_to_dir(ckpt, &source, dest, progress)
}

/// Restores what the nodes' parts of checkpoint `ckpt` list, when not every node's part is
/// there (a checkpoint of several nodes that never completed), into the local directory
/// `dest` as [`restore_checkpoint`] does, each file verified against its `.blake3` and its
/// part; with which nodes are missing. A complete checkpoint is restored whole; one without
/// parts is refused as [`restore_checkpoint`] refuses it.
pub fn restore_partial_checkpoint(
    durable: &DurableStore,
    repo: Option<&Repo>,
    ckpt: &str,
    dest: &Path,
    progress: Progress<'_>,
) -> Result<(Report, Option<PartsIn>)> {
    match complete_source(durable, repo, ckpt) {
        Err(Error::IncompleteJob { .. }) => {}
        other => {
            let (ckpt, source) = other?;
            return Ok((restore_to_dir(ckpt, &source, dest, progress)?, None));
        }
    }
    let ckpt =
        cascade_durable::normalize_rel(ckpt.trim_end_matches('/')).map_err(Error::Durable)?;
    let parts = durable.read_parts(&ckpt).map_err(Error::Durable)?;
    let progress_in = PartsIn::of(&parts);
    let source = match repo.filter(|r| stored_as_parts(r, &ckpt, &progress_in.present)) {
        // Stored with dedup: the nodes' part manifests in the repository.
        Some(repo) => Source::Dedup {
            repo,
            manifest: repo.joined_parts(&ckpt, &progress_in.present)?,
        },
        None => {
            let mut files: Vec<MarkerFile> = parts.iter().flat_map(|p| p.files.clone()).collect();
            files.sort_by(|a, b| a.path.cmp(&b.path));
            files.dedup();
            Source::Parts {
                durable,
                ckpt: ckpt.clone(),
                files,
            }
        }
    };
    let report = restore_to_dir(ckpt, &source, dest, progress)?;
    Ok((report, Some(progress_in)))
}

/// True if the nodes' parts of `ckpt` are part manifests in `repo` (the job ran with dedup).
fn stored_as_parts(repo: &Repo, ckpt: &str, nodes: &[String]) -> bool {
    nodes.first().is_some_and(|node| {
        repo.read_manifest(&part_name(ckpt, node))
            .is_ok_and(|m| m.is_some())
    })
}

/// Downloads every file of `source` into the local directory `dest`, verified, renamed into
/// place only once all of them verified.
fn restore_to_dir(
    ckpt: String,
    source: &Source<'_>,
    dest: &Path,
    progress: Progress<'_>,
) -> Result<Report> {
    let started = Instant::now();
    let files = source.files();
    let suffix = staging_suffix();
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut done = 0u64;
    let result = (|| {
        for (i, entry) in files.iter().enumerate() {
            let rel = cascade_durable::normalize_rel(&entry.path).map_err(Error::Durable)?;
            let final_path = dest.join(&rel);
            if let Some(parent) = final_path.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
            }
            let mut tmp = final_path.clone().into_os_string();
            tmp.push(&suffix);
            let tmp = PathBuf::from(tmp);
            let file = std::fs::File::create(&tmp)
                .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
            staged.push((tmp.clone(), final_path));
            let mut out = Counting {
                inner: io::BufWriter::with_capacity(1 << 20, file),
                done,
                progress,
            };
            let digest = source.write(i, &mut out)?;
            let file = out
                .inner
                .into_inner()
                .map_err(|e| Error::io(format!("write {}", tmp.display()), e.into_error()))?;
            file.sync_all()
                .map_err(|e| Error::io(format!("sync {}", tmp.display()), e))?;
            check_against_marker(&rel, &digest, entry)?;
            done += digest.size;
        }
        for (tmp, final_path) in &staged {
            std::fs::rename(tmp, final_path)
                .map_err(|e| Error::io(format!("rename to {}", final_path.display()), e))?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(err);
    }
    Ok(Report {
        checkpoint: ckpt,
        files,
        bytes: done,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Like [`restore_checkpoint`], but into the node store under the directory `dest_path`
/// (created if missing): file `rel` of the checkpoint becomes `dest_path/rel`. Existing files
/// of the same names are replaced (atomically, by rename) only once every file verified.
pub fn restore_into_store(
    durable: &DurableStore,
    repo: Option<&Repo>,
    ckpt: &str,
    store: &Store,
    dest_path: &str,
    progress: Progress<'_>,
) -> Result<Report> {
    let started = Instant::now();
    let (ckpt, source) = complete_source(durable, repo, ckpt)?;
    let files = source.files();
    let dest_dir = format!("/{}", dest_path.trim_matches('/'));
    let suffix = staging_suffix();
    let mut staged: Vec<(String, String)> = Vec::new();
    let mut done = 0u64;
    let result = (|| {
        for (i, entry) in files.iter().enumerate() {
            let rel = cascade_durable::normalize_rel(&entry.path).map_err(Error::Durable)?;
            let final_path = if dest_dir == "/" {
                format!("/{rel}")
            } else {
                format!("{dest_dir}/{rel}")
            };
            let tmp = format!("{final_path}{suffix}");
            let file = create_for_writing(store, &tmp)?;
            staged.push((tmp.clone(), final_path));
            let mut out = Counting {
                inner: StoreWriter::new(&file, &tmp),
                done,
                progress,
            };
            let digest = source.write(i, &mut out)?;
            check_against_marker(&rel, &digest, entry)?;
            done += digest.size;
        }
        for (tmp, final_path) in &staged {
            store
                .rename(tmp, final_path)
                .map_err(|e| Error::store(final_path, e))?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for (tmp, _) in &staged {
            let _ = store.unlink(tmp);
        }
        return Err(err);
    }
    Ok(Report {
        checkpoint: ckpt,
        files,
        bytes: done,
        seconds: started.elapsed().as_secs_f64(),
    })
}
