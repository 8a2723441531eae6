//! Streaming uploads to S3: one PUT with a known Content-Length whose body is fed piece by
//! piece while it is being sent ([`StreamingPut`]), so that an upload can start before all
//! of the file is at hand (a staging server's drain, docs/staging.md "Streaming drain").
//!
//! object_store's `put` needs every byte up front, so the request is built here: signed with
//! AWS SigV4 from the store's own credentials and sent with reqwest (the client object_store
//! uses). The body goes as `aws-chunked` with a signature per chunk
//! (STREAMING-AWS4-HMAC-SHA256-PAYLOAD), whatever the store's `sign_payload` says: the server
//! checks every byte, and the body ends with an explicit last chunk.
//!
//! The object appears only once the whole body arrived: a stream that is aborted (or whose
//! feeder goes away) fails the request mid-body, and S3 keeps nothing of an incomplete PUT.
//! That needs the framing: sent as it is (UNSIGNED-PAYLOAD, with only a Content-Length), a
//! body cut off by the abort was taken for a whole one by versitygw now and then (24 of 300
//! aborts on a loaded 2-core machine), which stored the first 2 MiB under the name, over
//! the object it held before. A framed body cut off lacks its last chunk and is refused.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use ring::{digest, hmac};

use super::AsyncDurableStore;
use crate::{error, Error, Result, Spec, SINGLE_PUT_MAX};

/// Bytes per signed chunk of an `aws-chunked` body (the last one may be shorter). Each
/// chunk costs about 90 bytes of framing and one SHA-256 over its data.
const SIGNED_CHUNK: usize = 1 << 20;

/// What S3's SigV4 leaves unencoded in a path segment (RFC 3986 unreserved characters).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

type Piece = std::result::Result<Bytes, std::io::Error>;

/// A PUT in flight whose body is fed with [`StreamingPut::send`]. Dropping it without
/// [`StreamingPut::finish`] aborts the request (no object is written).
pub struct StreamingPut {
    store: String,
    rel: String,
    len: u64,
    sent: u64,
    tx: Option<mpsc::UnboundedSender<Piece>>,
    task: Option<tokio::task::JoinHandle<Result<()>>>,
}

impl std::fmt::Debug for StreamingPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingPut")
            .field("rel", &self.rel)
            .field("len", &self.len)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl StreamingPut {
    /// Appends the next bytes of the body (in order). False once the request has ended
    /// (failed): then [`StreamingPut::finish`] says why.
    pub fn send(&mut self, mut piece: Bytes) -> bool {
        // A chunk at a time (slices, not copies): the body signs what it holds whole before
        // it sends any of it, so a piece of 1 GiB would be hashed whole before its first
        // byte left, where a chunk's hash overlaps the sending of the chunk before.
        while !piece.is_empty() {
            let next = piece.split_to(piece.len().min(SIGNED_CHUNK));
            self.sent += next.len() as u64;
            match &self.tx {
                Some(tx) if tx.unbounded_send(Ok(next)).is_ok() => {}
                _ => return false,
            }
        }
        true
    }

    /// Bytes handed to [`StreamingPut::send`] so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Fails the request mid-body, so that the store keeps no object.
    pub fn abort(mut self) {
        self.abort_now();
    }

    fn abort_now(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.unbounded_send(Err(std::io::Error::other("upload aborted")));
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Ends the body and waits for the store's answer. Fewer bytes sent than announced fail
    /// the request (no object is written); so does a request that failed already, with its
    /// own error.
    pub async fn finish(mut self) -> Result<()> {
        let failed_early = self.task.as_ref().is_some_and(|t| t.is_finished());
        if self.sent != self.len && !failed_early {
            self.abort_now();
            return Err(Error::ShortSource {
                store: self.store.clone(),
                path: self.rel.clone(),
                got: self.sent,
                expected: self.len,
            });
        }
        drop(self.tx.take());
        let Some(task) = self.task.take() else {
            return Err(self.failed("the upload was aborted".into()));
        };
        match task.await {
            Ok(Ok(())) if self.sent != self.len => Err(self.failed(format!(
                "the store answered after {} of {} bytes",
                self.sent, self.len
            ))),
            Ok(r) => r,
            Err(e) => Err(self.failed(format!("the upload task ended: {e}"))),
        }
    }

    fn failed(&self, detail: String) -> Error {
        Error::Store {
            store: self.store.clone(),
            op: "put",
            path: self.rel.clone(),
            detail,
        }
    }
}

impl Drop for StreamingPut {
    fn drop(&mut self) {
        self.abort_now();
    }
}

/// Hex of bytes, lower case.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac_sign(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
        .as_ref()
        .to_vec()
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time (SigV4's x-amz-date).
fn amz_date(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Length of an `aws-chunked` body carrying `len` bytes in chunks of `chunk`.
fn chunked_len(len: u64, chunk: u64) -> u64 {
    let frame = |n: u64| format!("{n:x}").len() as u64 + ";chunk-signature=".len() as u64 + 64 + 4;
    let full = len / chunk;
    let rest = len % chunk;
    full * (frame(chunk) + chunk) + if rest > 0 { frame(rest) + rest } else { 0 } + frame(0)
}

/// Signs the chunks of an `aws-chunked` body, each with the previous signature.
struct ChunkSigner {
    key: Vec<u8>,
    date: String,
    scope: String,
    previous: String,
}

impl ChunkSigner {
    fn frame(&mut self, pieces: &[Bytes]) -> Bytes {
        let mut ctx = digest::Context::new(&digest::SHA256);
        let mut n = 0usize;
        for p in pieces {
            ctx.update(p);
            n += p.len();
        }
        let to_sign = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{}\n{}",
            self.date,
            self.scope,
            self.previous,
            sha256_hex(b""),
            hex(ctx.finish().as_ref())
        );
        self.previous = hex(&hmac_sign(&self.key, to_sign.as_bytes()));
        Bytes::from(format!("{n:x};chunk-signature={}\r\n", self.previous))
    }
}

/// The request body: the fed pieces, checked against `len` and framed as signed chunks.
fn body_stream(
    rx: mpsc::UnboundedReceiver<Piece>,
    len: u64,
    signer: ChunkSigner,
) -> impl futures::Stream<Item = Piece> + Send + 'static {
    struct State {
        rx: mpsc::UnboundedReceiver<Piece>,
        len: u64,
        got: u64,
        signer: ChunkSigner,
        held: Vec<Bytes>,
        held_len: usize,
        done: bool,
    }
    let state = State {
        rx,
        len,
        got: 0,
        signer,
        held: Vec::new(),
        held_len: 0,
        done: false,
    };
    let short = |got: u64, len: u64| {
        std::io::Error::other(format!("body ended after {got} of {len} bytes"))
    };
    futures::stream::unfold(state, move |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            let next = s.rx.next().await;
            let piece = match next {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    s.done = true;
                    return Some((vec![Err(e)], s));
                }
                None if s.got < s.len => {
                    s.done = true;
                    let e = short(s.got, s.len);
                    return Some((vec![Err(e)], s));
                }
                None => {
                    s.done = true;
                    let mut out = Vec::new();
                    if s.held_len > 0 {
                        out.push(Ok(s.signer.frame(&s.held)));
                        out.extend(s.held.drain(..).map(Ok));
                        out.push(Ok(Bytes::from_static(b"\r\n")));
                    }
                    out.push(Ok(s.signer.frame(&[])));
                    out.push(Ok(Bytes::from_static(b"\r\n")));
                    return Some((out, s));
                }
            };
            s.got += piece.len() as u64;
            if s.got > s.len {
                s.done = true;
                let e = std::io::Error::other(format!("body longer than {} bytes", s.len));
                return Some((vec![Err(e)], s));
            }
            // Whole chunks out of the held pieces (a piece may straddle two chunks).
            let mut piece = piece;
            let mut out = Vec::new();
            while s.held_len + piece.len() >= SIGNED_CHUNK {
                let take = SIGNED_CHUNK - s.held_len;
                s.held.push(piece.split_to(take));
                out.push(Ok(s.signer.frame(&s.held)));
                out.extend(s.held.drain(..).map(Ok));
                out.push(Ok(Bytes::from_static(b"\r\n")));
                s.held_len = 0;
            }
            if !piece.is_empty() {
                s.held_len += piece.len();
                s.held.push(piece);
            }
            if !out.is_empty() {
                return Some((out, s));
            }
        }
    })
    .flat_map(futures::stream::iter)
}

impl AsyncDurableStore {
    /// True if [`Self::put_stream`] can stream to this store (S3; a directory store can not).
    pub fn can_stream(&self) -> bool {
        self.s3.is_some()
    }

    /// Uploads `parts` in one request like [`Self::put_buffers`], streamed to S3: signed a
    /// chunk at a time while it is sent, where a single PUT is signed with the SHA-256 of its
    /// whole body before its first byte leaves (docs/durable-layout.md; 0.25 s per 256 MiB
    /// on the durable suite's Intel host). A stream that fails is sent again with
    /// [`Self::put_buffers`], which the store retries, and this store streams no more.
    pub async fn put_buffers_streamed(&self, rel: &str, parts: Vec<Bytes>) -> Result<()> {
        if self.can_stream() && !self.stream_failed.load(Relaxed) {
            let len = parts.iter().map(|p| p.len() as u64).sum();
            let streamed = match self.put_stream(rel, len).await {
                Ok(mut put) => {
                    // A failed send ends the request; finish says why.
                    let _ = parts.iter().all(|p| put.send(p.clone()));
                    put.finish().await
                }
                Err(e) => Err(e),
            };
            if streamed.is_ok() {
                return Ok(());
            }
            self.stream_failed.store(true, Relaxed);
        }
        self.put_buffers(rel, parts).await
    }

    /// Starts a PUT of `len` bytes to `rel` (data only, no checksum object) whose body is
    /// fed with [`StreamingPut::send`] and ended with [`StreamingPut::finish`]. The object
    /// appears whole or not at all. One request, no retries (the fed bytes are gone): a
    /// caller that fails falls back to an ordinary upload. Must be called within a tokio
    /// runtime (the request runs on it).
    pub async fn put_stream(&self, rel: &str, len: u64) -> Result<StreamingPut> {
        let (rel, loc) = self.traced("put", rel)?;
        let (Some(s3), Spec::S3(spec)) = (&self.s3, &self.spec) else {
            return Err(Error::Config {
                spec: self.name.clone(),
                reason: "streaming uploads need an S3 store".into(),
            });
        };
        if len > SINGLE_PUT_MAX {
            return Err(Error::InvalidPath {
                path: rel,
                reason: format!("{len} bytes is more than one request may carry"),
            });
        }
        let credential = s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| self.classify("put", &rel, e))?;
        let mut key_path = String::new();
        for segment in spec
            .prefix
            .split('/')
            .chain(loc.as_ref().split('/'))
            .filter(|s| !s.is_empty())
        {
            key_path.push('/');
            key_path.extend(utf8_percent_encode(segment, SEGMENT));
        }
        let bucket = utf8_percent_encode(&spec.bucket, SEGMENT).to_string();
        let (base, host, path) = match &spec.endpoint {
            Some(ep) => {
                let url = url::Url::parse(ep).map_err(|e| Error::Config {
                    spec: self.name.clone(),
                    reason: format!("endpoint: {e}"),
                })?;
                let host = match (url.host_str(), url.port()) {
                    (Some(h), Some(p)) => format!("{h}:{p}"),
                    (Some(h), None) => h.to_string(),
                    _ => {
                        return Err(Error::Config {
                            spec: self.name.clone(),
                            reason: "endpoint has no host".into(),
                        })
                    }
                };
                let base = ep.trim_end_matches('/').to_string();
                // Path-style, as the store's client is configured; an endpoint with a path
                // of its own keeps it.
                let ep_path = url.path().trim_end_matches('/').to_string();
                (base, host, format!("{ep_path}/{bucket}{key_path}"))
            }
            None => {
                let host = format!("{}.s3.{}.amazonaws.com", spec.bucket, spec.region);
                (format!("https://{host}"), host, key_path.clone())
            }
        };
        let url = match &spec.endpoint {
            Some(_) => format!("{base}/{bucket}{key_path}"),
            None => format!("{base}{key_path}"),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let date = amz_date(now);
        let day = &date[..8];
        let scope = format!("{day}/{}/s3/aws4_request", spec.region);
        // Signed chunks also with `sign_payload=no` (module comment): their SHA-256 costs
        // about 0.5 s of CPU per GB, at most a core's tenth at the 1 Gbit/s a drain runs at.
        let payload_hash = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
        let content_length = chunked_len(len, SIGNED_CHUNK as u64);
        // Canonical headers, sorted by name.
        let mut headers: Vec<(&str, String)> = vec![
            ("content-length", content_length.to_string()),
            ("host", host),
            ("x-amz-content-sha256", payload_hash.to_string()),
            ("x-amz-date", date.clone()),
            ("content-encoding", "aws-chunked".into()),
            ("x-amz-decoded-content-length", len.to_string()),
        ];
        if let Some(token) = &credential.token {
            headers.push(("x-amz-security-token", token.clone()));
        }
        headers.sort_by(|a, b| a.0.cmp(b.0));
        let canonical_headers: String = headers
            .iter()
            .map(|(k, v)| format!("{k}:{}\n", v.trim()))
            .collect();
        let signed_headers = headers
            .iter()
            .map(|(k, _)| *k)
            .collect::<Vec<_>>()
            .join(";");
        let canonical =
            format!("PUT\n{path}\n\n{canonical_headers}\n{signed_headers}\n{payload_hash}");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{date}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let mut key = hmac_sign(
            format!("AWS4{}", credential.secret_key).as_bytes(),
            day.as_bytes(),
        );
        for part in [spec.region.as_str(), "s3", "aws4_request"] {
            key = hmac_sign(&key, part.as_bytes());
        }
        let signature = hex(&hmac_sign(&key, to_sign.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credential.key_id
        );
        let signer = ChunkSigner {
            key,
            date: date.clone(),
            scope: scope.clone(),
            previous: signature,
        };

        let (tx, rx) = mpsc::unbounded();
        let body = reqwest::Body::wrap_stream(body_stream(rx, len, signer));
        // A bound on the whole request (body included, which is sent as fast as it is fed):
        // an upload slower than 1 MiB/s on average, or a store that never answers, is given
        // up (its caller falls back to an ordinary upload) instead of hanging.
        let bound = self.opts.retry_timeout + Duration::from_secs(len >> 20);
        let mut request = self.http_client()?.put(&url).body(body).timeout(bound);
        for (k, v) in &headers {
            if *k != "host" {
                request = request.header(*k, v);
            }
        }
        request = request.header("authorization", authorization);
        let store = self.name.clone();
        let task_rel = rel.clone();
        let task = tokio::spawn(async move {
            let fail = |detail: String| Error::Store {
                store: store.clone(),
                op: "put",
                path: task_rel.clone(),
                detail,
            };
            let response = request
                .send()
                .await
                .map_err(|e| fail(error::one_line(&error::chain_text(&e))))?;
            let status = response.status();
            if status.is_success() {
                return Ok(());
            }
            let text = response.text().await.unwrap_or_default();
            let detail = error::one_line(&format!("{status}: {}", error::short_detail(&text)));
            if status.as_u16() == 403 || status.as_u16() == 401 {
                return Err(Error::Auth { store, detail });
            }
            Err(fail(detail))
        });
        Ok(StreamingPut {
            store: self.name.clone(),
            rel,
            len,
            sent: 0,
            tx: Some(tx),
            task: Some(task),
        })
    }

    fn http_client(&self) -> Result<reqwest::Client> {
        if let Some(c) = self.http.get() {
            return Ok(c.clone());
        }
        let client = reqwest::Client::builder()
            .connect_timeout(self.opts.connect_timeout)
            .build()
            .map_err(|e| Error::Config {
                spec: self.name.clone(),
                reason: format!("HTTP client: {}", error::one_line(&error::chain_text(&e))),
            })?;
        Ok(self.http.get_or_init(|| client).clone())
    }
}

/// The store's S3 client, for signing with its credentials.
pub(super) type S3Client = Arc<object_store::aws::AmazonS3>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates_are_civil_utc() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        // 2024-02-29 12:34:56 UTC (a leap day).
        assert_eq!(amz_date(1_709_210_096), "20240229T123456Z");
        assert_eq!(amz_date(951_782_400), "20000229T000000Z");
    }

    #[test]
    fn chunked_length_counts_every_frame() {
        // AWS's example: 66560 bytes in 64 KiB chunks is 66824 bytes on the wire.
        assert_eq!(chunked_len(66_560, 65_536), 66_824);
        assert_eq!(chunked_len(0, 65_536), 86);
    }
}
