//! A connection to one staging server (the agent's side of docs/staging-protocol.md).
//!
//! Write frames are not answered one by one: the client streams them and a Sync is
//! answered once everything before it is durable on the server, so the network, the
//! server's receive and its SSD all work at once. A Write the server refuses (full, bad
//! path) is answered by an Error frame and a closed connection; the client reports that
//! reason rather than the broken pipe it may see first.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cascade_dedup::repo::{FileRecipe, Manifest};
use cascade_dedup::{Compression, Score};

use crate::auth::{self, proofs_match, Credential, Transcript};
use crate::protocol::{
    self, encode_segment_header, kind, read_frame, write_frame, BlobKind, BodyWriter, DeltaBase,
    Header, ManifestPart, ManifestState, NoSigPipe, PullKind, PullState, PushFile, RecipeEntry,
    Reply, Seal, Stored, WireChunk, BLAKE3_LEN, CHUNK_FIXED, MAX_BODY, MAX_FRAME_RAW, MAX_ITEMS,
};
use crate::status::ServerStatus;
use crate::tls::{self, rustls, Socket};
use crate::{Error, Result};
use cascade_secret::Secret;

/// How a client identifies itself.
#[derive(Clone)]
pub struct ClientOptions {
    /// The cluster secret or the job's credential (Debug shows neither).
    pub credential: Credential,
    /// For the server's log: host:pid.
    pub client: String,
    /// Every key of the connection lives under this prefix on the server ("" = none).
    pub namespace: String,
    pub connect_timeout: Duration,
    /// A server that stops answering for this long is treated as dead.
    pub io_timeout: Duration,
    /// Speak TLS, verifying the server's certificate with this config (`staging.tls_ca`);
    /// None: plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Shows whether TLS is on, not the config's insides.
impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("credential", &self.credential)
            .field("client", &self.client)
            .field("namespace", &self.namespace)
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ClientOptions {
    /// The key this client proves itself with, and tags the versions it writes with.
    pub fn job_key(&self) -> auth::JobKey {
        self.credential.key_for(&self.namespace)
    }

    /// Options of a client that holds the cluster secret.
    pub fn new(secret: &str) -> ClientOptions {
        ClientOptions::with(Credential::ClusterSecret(Secret::new(secret)))
    }

    pub fn with(credential: Credential) -> ClientOptions {
        let host = crate::host_name();
        ClientOptions {
            credential,
            client: format!("{host}:{}", std::process::id()),
            namespace: String::new(),
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// What a Read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMeta {
    pub stamp: u64,
    pub size: u64,
    pub blake3: [u8; BLAKE3_LEN],
    /// The writer's tag ([`crate::auth::JobKey::version_tag`]; zeros: none).
    pub tag: [u8; 32],
}

/// One piece of a file version to send: `data` is sent with vectored writes straight from
/// wherever it lives (the node store's mapped chunks), never copied.
pub struct OutSegment<'a> {
    pub key: &'a str,
    pub stamp: u64,
    pub size: u64,
    pub offset: u64,
    pub seal: Option<Seal>,
    pub data: &'a [&'a [u8]],
}

/// The server that owns `score` among `servers` (its index), by rendezvous (highest random
/// weight) hashing: each server's weight for a score is the first 8 bytes (little-endian) of
/// BLAKE3(server name || score), and the heaviest wins (the first on a tie). Agents and
/// tests must pass the same names in any order-independent sense: the owner depends on the
/// names, not on their positions, so adding a server moves only the scores the new one wins
/// (about 1/(M+1) of them) and removing one moves only its own. With no server, 0.
pub fn owner_of(score: &[u8; 32], servers: &[&str]) -> usize {
    let mut best = (0usize, 0u64);
    for (i, name) in servers.iter().enumerate() {
        let mut h = blake3::Hasher::new();
        h.update(name.as_bytes());
        h.update(score);
        let mut weight = [0u8; 8];
        weight.copy_from_slice(&h.finalize().as_bytes()[..8]);
        let weight = u64::from_le_bytes(weight);
        if i == 0 || weight > best.1 {
            best = (i, weight);
        }
    }
    best.0
}

/// What [`Connection::put_chunks`] did with the chunks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutChunksReport {
    /// Chunks the server stored (durable on its SSD).
    pub stored: u64,
    /// Chunks it or the durable repository already had.
    pub present: u64,
}

/// A chunk a server returned ([`Connection::get_chunks`]), in its stored form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedChunk {
    pub score: Score,
    pub kind: BlobKind,
    pub stored: Stored,
    pub raw_len: u32,
    pub data: Vec<u8>,
}

impl FetchedChunk {
    /// A delta chunk's base and zstd frame ([`cascade_dedup::repo::undo_delta`] rebuilds the
    /// chunk from them and the base's bytes); None for a chunk stored whole.
    pub fn delta(&self) -> Option<(DeltaBase, &[u8])> {
        match self.stored {
            Stored::Delta => protocol::split_delta(&self.data),
            _ => None,
        }
    }

    /// The chunk's raw bytes, decompressed and checked against its score (EINVAL-like
    /// `InvalidData` when they do not match: read it from the durable store instead).
    pub fn verified_raw(&self) -> io::Result<Vec<u8>> {
        let raw = match self.stored {
            Stored::Raw => self.data.clone(),
            Stored::Zstd => Compression::decompress(&self.data, self.raw_len as usize)?,
            // Its base is in the durable repository: see `delta`.
            Stored::Delta => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "chunk {} came as a delta blob: rebuild it with its base",
                        crate::hex(&self.score)
                    ),
                ))
            }
        };
        if cascade_dedup::score(&raw) != self.score || raw.len() != self.raw_len as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("chunk {} does not match its score", crate::hex(&self.score)),
            ));
        }
        Ok(raw)
    }
}

/// Frames sent ahead of their replies by the batched dedup calls (replies are small, so the
/// server never blocks writing them while the client is still sending).
const PIPELINE: usize = 4;
/// A PutManifest part carries file entries up to about this many bytes.
const MANIFEST_PART_BYTES: usize = 8 << 20;

/// The byte stream under the frames: plain TCP, or TLS over it.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Socket>>),
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(t) => &t.sock.0,
        }
    }

    /// The TLS session's exported keying material (see [`tls::channel_binding`]); None on
    /// plain TCP.
    pub fn channel_binding(&self) -> Option<[u8; 32]> {
        match self {
            Transport::Plain(_) => None,
            Transport::Tls(t) => tls::channel_binding(&t.conn),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => NoSigPipe(s).write(buf),
            Transport::Tls(t) => t.write(buf),
        }
    }
    /// Plain TCP keeps zero-copy vectored writes; TLS copies into records anyway.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => NoSigPipe(s).write_vectored(bufs),
            Transport::Tls(t) => t.write_vectored(bufs),
        }
    }
    /// TLS buffers records: a frame is sent only once flushed.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(_) => Ok(()),
            Transport::Tls(t) => t.flush(),
        }
    }
}

pub struct Connection {
    stream: Transport,
    server: String,
    /// The namespace's key the connection proved it holds; it tags what it seals.
    job_key: auth::JobKey,
    instance: u64,
    next_request: u32,
    reply_buf: Vec<u8>,
    /// The socket's read timeout: a Watch asks for less than this.
    io_timeout: Duration,
}

impl Connection {
    /// Connects and says Hello; a wrong secret is `Error::Refused` with code AUTH.
    pub fn connect(server: &str, opts: &ClientOptions) -> Result<Connection> {
        let addrs: Vec<_> = server
            .to_socket_addrs()
            .map_err(|e| Error::io(format!("staging server {server}"), e))?
            .collect();
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, opts.connect_timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream
            .ok_or_else(|| Error::io(format!("cannot connect to staging server {server}"), last))?;
        let _ = stream.set_nodelay(true);
        stream
            .set_read_timeout(Some(opts.io_timeout))
            .and_then(|_| stream.set_write_timeout(Some(opts.io_timeout)))
            .map_err(|e| Error::io("socket timeouts", e))?;
        let stream = match &opts.tls {
            None => Transport::Plain(stream),
            Some(config) => Transport::tls(server, config, stream)?,
        };
        let mut c = Connection {
            stream,
            server: server.to_string(),
            job_key: opts.job_key(),
            instance: 0,
            next_request: 1,
            reply_buf: Vec::new(),
            io_timeout: opts.io_timeout,
        };
        c.authenticate(opts)?;
        Ok(c)
    }

    /// Hello, the server's challenge, the client's proof, the server's proof back
    /// (docs/staging-protocol.md, "Hello and Auth"). A wrong credential is `Error::Refused`
    /// with code AUTH; a server that cannot prove it holds the cluster secret is refused here.
    fn authenticate(&mut self, opts: &ClientOptions) -> Result<()> {
        let client_nonce = auth::nonce().map_err(|e| Error::io("random nonce", e))?;
        let body = protocol::encode_hello(&opts.client, &opts.namespace, &client_nonce);
        let id = self.send(kind::HELLO, &[&body])?;
        self.refuse_tls_answer()?;
        let server_nonce =
            match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
                (
                    Reply::Challenge {
                        instance, nonce, ..
                    },
                    _,
                ) => {
                    self.instance = instance;
                    nonce
                }
                (other, _) => return Err(unexpected(&self.server, &other)),
            };
        let key = self.job_key.clone();
        // Over TLS both proofs cover the session's keying material: a handshake relayed
        // into another TLS session does not verify there.
        let transcript = Transcript {
            namespace: &opts.namespace,
            client_nonce,
            server_nonce,
            binding: self.stream.channel_binding(),
        };
        let id = self.send(
            kind::AUTH,
            &[&protocol::encode_auth(&key.client_proof(&transcript))],
        )?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::AuthOk { proof }, _)
                if proofs_match(&proof, &key.server_proof(&transcript)) =>
            {
                Ok(())
            }
            (Reply::AuthOk { .. }, _) => Err(Error::Protocol {
                server: self.server.clone(),
                why: "it accepted the credential but could not prove it holds the cluster \
                      secret itself: it is not a staging server of this cluster"
                    .into(),
            }),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// The seal of version (`key`, `stamp`) of `size` bytes whose BLAKE3 is `blake3`, tagged
    /// with the connection's key: a server refuses a seal whose tag does not verify, and
    /// readers trust a staged copy only with a tag they can check.
    pub fn seal(&self, key: &str, stamp: u64, size: u64, blake3: [u8; 32]) -> Seal {
        Seal {
            blake3,
            tag: self.job_key.version_tag(key, stamp, size, &blake3),
        }
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    /// The byte stream under the frames (for its [`Transport::channel_binding`]).
    pub fn transport(&self) -> &Transport {
        &self.stream
    }

    /// A plain-TCP client talking to a TLS server gets a TLS alert record instead of a
    /// frame: say so rather than report a garbled header.
    fn refuse_tls_answer(&self) -> Result<()> {
        let Transport::Plain(s) = &self.stream else {
            return Ok(());
        };
        let mut first = [0u8; 2];
        // A TLS record starts with its content type (alert 21, handshake 22), then major
        // version 3; a frame starts with the magic "CSTG".
        if let Ok(2) = s.peek(&mut first) {
            if matches!(first, [21 | 22, 3]) {
                return Err(Error::Protocol {
                    server: self.server.clone(),
                    why: "the server requires TLS: set staging.tls_ca to the CA that signed its \
                          certificate"
                        .into(),
                });
            }
        }
        Ok(())
    }

    /// Whether the server closed this connection (or sent something nobody asked for) since
    /// its last reply: a connection idle while its server restarted is found dead here, one
    /// non-blocking peek, instead of failing the next request.
    /// Plain TCP only: over TLS the server may send records of its own (session tickets),
    /// so a TLS connection is never judged here.
    pub fn peer_closed(&self) -> bool {
        let Transport::Plain(socket) = &self.stream else {
            return false;
        };
        let mut byte = [0u8; 1];
        let peeked = socket
            .set_nonblocking(true)
            .and_then(|()| socket.peek(&mut byte));
        if socket.set_nonblocking(false).is_err() {
            // Left non-blocking, it would fail its next request: make it anew.
            return true;
        }
        match peeked {
            // 0: the server closed it; more: bytes no request is waiting for.
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ),
        }
    }

    /// Changes when the server restarts.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    fn send(&mut self, k: u8, body: &[&[u8]]) -> Result<u32> {
        let id = self.next_request;
        self.next_request = self.next_request.wrapping_add(1);
        let len: usize = body.iter().map(|b| b.len()).sum();
        let header = Header {
            kind: k,
            body_len: len as u32,
            request: id,
        };
        match write_frame(&mut self.stream, header, body).and_then(|()| self.stream.flush()) {
            Ok(()) => Ok(id),
            Err(e) => Err(self.why_broken(e)),
        }
    }

    /// A send failed: the server may have said why before closing.
    fn why_broken(&mut self, e: io::Error) -> Error {
        let _ = self
            .stream
            .tcp()
            .set_read_timeout(Some(Duration::from_millis(200)));
        if let Ok(Some(h)) = read_frame(&mut self.stream, &mut self.reply_buf) {
            if h.kind == kind::ERROR {
                if let Ok(Reply::Error { code, message }) =
                    Reply::decode(h.kind, &self.reply_buf[..h.body_len as usize])
                {
                    return Error::Refused {
                        server: self.server.clone(),
                        code,
                        message: message.to_string(),
                    };
                }
            }
        }
        Error::io(format!("staging server {}", self.server), e)
    }

    /// Sends one Write frame holding `segments` (no reply; see [`Connection::sync`]).
    pub fn write(&mut self, segments: &[OutSegment]) -> Result<()> {
        let mut head = BodyWriter::default();
        head.u32(segments.len() as u32);
        let mut data_len = 0usize;
        for s in segments {
            let len: usize = s.data.iter().map(|d| d.len()).sum();
            data_len += len;
            encode_segment_header(
                &mut head,
                s.key,
                s.stamp,
                s.size,
                s.offset,
                len as u32,
                s.seal.as_ref(),
            );
        }
        let mut body: Vec<&[u8]> = Vec::with_capacity(1 + segments.len() * 2);
        body.push(&head.buf);
        for s in segments {
            body.extend(s.data.iter().copied());
        }
        debug_assert_eq!(
            body.iter().map(|b| b.len()).sum::<usize>(),
            head.buf.len() + data_len
        );
        self.send(kind::WRITE, &body).map(|_| ())
    }

    /// Waits until every Write sent so far is durable on the server's SSD.
    pub fn sync(&mut self) -> Result<()> {
        let id = self.send(kind::SYNC, &[])?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::SyncOk, _) => Ok(()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Reads `len` bytes at `offset` of the newest version of `key` the server holds into
    /// `out` (replacing its contents). None if the server does not have the key.
    pub fn read(
        &mut self,
        key: &str,
        offset: u64,
        len: u32,
        out: &mut Vec<u8>,
    ) -> Result<Option<ReadMeta>> {
        let id = self.send(kind::READ, &[&protocol::encode_read(key, offset, len)])?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id) {
            Ok((
                Reply::ReadOk {
                    stamp,
                    size,
                    blake3,
                    tag,
                    data,
                },
                _,
            )) => {
                out.clear();
                out.extend_from_slice(data);
                Ok(Some(ReadMeta {
                    stamp,
                    size,
                    blake3,
                    tag,
                }))
            }
            Ok((other, _)) => Err(unexpected(&self.server, &other)),
            Err(Error::Refused { code, .. }) if code == protocol::code::NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Records a checkpoint's file list; the server writes its marker once every file is in
    /// the durable tier.
    pub fn push(&mut self, checkpoint: &str, single_file: bool, files: &[PushFile]) -> Result<()> {
        let body = protocol::encode_push(checkpoint, single_file, files);
        let id = self.send(kind::PUSH, &[&body])?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PushOk, _) => Ok(()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// The level of files and checkpoints on this server.
    pub fn pull(&mut self, queries: &[(PullKind, &str)]) -> Result<Vec<PullState>> {
        let id = self.send(kind::PULL, &[&protocol::encode_pull(queries)])?;
        let n = queries.len();
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PullOk(states), _) if states.len() == n => Ok(states),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Round-trip time.
    pub fn ping(&mut self) -> Result<Duration> {
        let started = Instant::now();
        let id = self.send(kind::PING, &[])?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::Pong, _) => Ok(started.elapsed()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Waits until the server's event counter is above `after` (a file drained, a marker, a
    /// push round or a dedup manifest written) or `wait` passes (at most half the socket's
    /// read timeout), and returns the counter. Use a connection of its own: the server
    /// answers nothing else on it meanwhile. A server older than Watch refuses it
    /// (`Error::Refused`, code BAD_FRAME) and closes the connection.
    pub fn watch(&mut self, after: u64, wait: Duration) -> Result<u64> {
        let wait = wait.min(self.io_timeout / 2);
        let wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let id = self.send(kind::WATCH, &[&protocol::encode_watch(after, wait_ms)])?;
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::WatchOk { events }, _) => Ok(events),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    pub fn status(&mut self) -> Result<ServerStatus> {
        let id = self.send(kind::STATUS, &[])?;
        let json = match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::StatusOk(json), _) => json.to_string(),
            (other, _) => return Err(unexpected(&self.server, &other)),
        };
        serde_json::from_str(&json).map_err(|e| Error::Protocol {
            server: self.server.clone(),
            why: format!("garbled status: {e}"),
        })
    }

    /// For each score, whether the server lacks it: it holds it neither in its chunk store
    /// nor in the durable repository's index (as it last loaded it). Any number of scores:
    /// sent in frames of up to 65,536, pipelined.
    pub fn lacks(&mut self, scores: &[Score]) -> Result<Vec<bool>> {
        let mut out = Vec::with_capacity(scores.len());
        let mut sent: VecDeque<(u32, usize)> = VecDeque::new();
        for batch in scores.chunks(MAX_ITEMS) {
            if sent.len() == PIPELINE {
                self.recv_lacks(&mut sent, &mut out)?;
            }
            let id = self.send(kind::LACKS, &[&protocol::encode_scores(batch)])?;
            sent.push_back((id, batch.len()));
        }
        while !sent.is_empty() {
            self.recv_lacks(&mut sent, &mut out)?;
        }
        Ok(out)
    }

    fn recv_lacks(&mut self, sent: &mut VecDeque<(u32, usize)>, out: &mut Vec<bool>) -> Result<()> {
        let Some((id, n)) = sent.pop_front() else {
            return Ok(());
        };
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::LacksOk(flags), _) if flags.len() == n => {
                out.extend(flags);
                Ok(())
            }
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Sends chunks in their stored form (any number: split into frames within the
    /// protocol's limits, pipelined) and returns once the server has made every one durable
    /// on its SSD, or found it already there or in the durable repository. A chunk whose
    /// bytes do not match its score is `Error::Refused` with code `BAD_CHUNK` (nothing of its
    /// frame is stored; the server closes the connection).
    pub fn put_chunks(&mut self, chunks: &[WireChunk]) -> Result<PutChunksReport> {
        let mut report = PutChunksReport::default();
        let mut sent: VecDeque<u32> = VecDeque::new();
        let mut start = 0;
        while start < chunks.len() {
            let (mut end, mut len, mut raw) = (start, 4usize, 0u64);
            while end < chunks.len() && end - start < MAX_ITEMS {
                let c = &chunks[end];
                let more = CHUNK_FIXED + c.data.len();
                if end > start
                    && (len + more > MAX_BODY || raw + u64::from(c.raw_len) > MAX_FRAME_RAW)
                {
                    break;
                }
                len += more;
                raw += u64::from(c.raw_len);
                end += 1;
            }
            let frame = &chunks[start..end];
            let mut head = BodyWriter::default();
            protocol::encode_chunk_descriptors(&mut head, frame);
            let mut body: Vec<&[u8]> = Vec::with_capacity(frame.len() + 1);
            body.push(&head.buf);
            body.extend(frame.iter().map(|c| c.data));
            if sent.len() == PIPELINE {
                self.recv_put_chunks(&mut sent, &mut report)?;
            }
            sent.push_back(self.send(kind::PUT_CHUNKS, &body)?);
            start = end;
        }
        while !sent.is_empty() {
            self.recv_put_chunks(&mut sent, &mut report)?;
        }
        Ok(report)
    }

    fn recv_put_chunks(
        &mut self,
        sent: &mut VecDeque<u32>,
        report: &mut PutChunksReport,
    ) -> Result<()> {
        let Some(id) = sent.pop_front() else {
            return Ok(());
        };
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PutChunksOk { stored, present }, _) => {
                report.stored += u64::from(stored);
                report.present += u64::from(present);
                Ok(())
            }
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Records a checkpoint's dedup manifest on the server: its files' recipes and every blob
    /// score the checkpoint references (data chunks and recipe blocks, on any server). Sent
    /// in as many parts as needed; returns once the manifest is durable on the server, which
    /// writes it into the durable repository once all those blobs are indexed there.
    pub fn put_manifest(
        &mut self,
        checkpoint: &str,
        single_file: bool,
        chunking: &str,
        compression: &str,
        files: &[FileRecipe],
        scores: &[Score],
    ) -> Result<()> {
        let mut entries = Vec::with_capacity(files.len());
        for f in files {
            let digest = |what: &str, text: &str| {
                crate::unhex(text).ok_or_else(|| {
                    Error::Invalid(format!(
                        "{checkpoint}/{}: its {what} {text:?} is not 64 hex digits",
                        f.path
                    ))
                })
            };
            entries.push(RecipeEntry {
                path: f.path.clone(),
                size: f.size,
                blake3: digest("BLAKE3", &f.blake3)?,
                root: digest("root", &f.root)?,
            });
        }
        let mut sent: VecDeque<u32> = VecDeque::new();
        let (mut next_file, mut next_score, mut part) = (0usize, 0usize, 0u32);
        loop {
            let first = next_file;
            let mut bytes = 0usize;
            while next_file < entries.len()
                && next_file - first < MAX_ITEMS
                && (next_file == first
                    || bytes + entries[next_file].path.len() + 74 <= MANIFEST_PART_BYTES)
            {
                bytes += entries[next_file].path.len() + 74;
                next_file += 1;
            }
            let take = (scores.len() - next_score).min(MAX_ITEMS);
            let last = next_file == entries.len() && next_score + take == scores.len();
            let body = protocol::encode_manifest_part(&ManifestPart {
                checkpoint,
                single_file,
                chunking,
                compression,
                part,
                last,
                files: entries[first..next_file].to_vec(),
                scores: scores[next_score..next_score + take].to_vec(),
            });
            next_score += take;
            if sent.len() == PIPELINE {
                self.recv_empty(&mut sent, kind::PUT_MANIFEST)?;
            }
            sent.push_back(self.send(kind::PUT_MANIFEST, &[&body])?);
            part = part.wrapping_add(1);
            if last {
                break;
            }
        }
        while !sent.is_empty() {
            self.recv_empty(&mut sent, kind::PUT_MANIFEST)?;
        }
        Ok(())
    }

    fn recv_empty(&mut self, sent: &mut VecDeque<u32>, k: u8) -> Result<()> {
        let Some(id) = sent.pop_front() else {
            return Ok(());
        };
        match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PutManifestOk, h) if h.kind == k | kind::REPLY => Ok(()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// The chunks the server holds among `scores` (any number), in request order, in their
    /// stored form; the ones it does not hold (never sent to it, or pushed and reclaimed:
    /// read them from the durable repository) are left out. Check them with
    /// [`FetchedChunk::verified_raw`].
    pub fn get_chunks(&mut self, scores: &[Score]) -> Result<Vec<FetchedChunk>> {
        let mut out = Vec::new();
        let mut next = 0;
        while next < scores.len() {
            let batch = &scores[next..(next + MAX_ITEMS).min(scores.len())];
            let id = self.send(kind::GET_CHUNKS, &[&protocol::encode_scores(batch)])?;
            match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
                (Reply::GetChunksOk { considered, chunks }, _)
                    if considered as usize <= batch.len()
                        && (considered > 0 || batch.is_empty()) =>
                {
                    out.extend(chunks.iter().map(|c| FetchedChunk {
                        score: c.score,
                        kind: c.kind,
                        stored: c.stored,
                        raw_len: c.raw_len,
                        data: c.data.to_vec(),
                    }));
                    next += considered as usize;
                }
                (other, _) => return Err(unexpected(&self.server, &other)),
            }
        }
        Ok(out)
    }

    /// The dedup manifest of `checkpoint` if the server has it pending (not yet in the
    /// durable repository) or finds it written there; None otherwise.
    pub fn get_manifest(&mut self, checkpoint: &str) -> Result<Option<(ManifestState, Manifest)>> {
        let id = self.send(
            kind::GET_MANIFEST,
            &[&protocol::encode_get_manifest(checkpoint)],
        )?;
        let (state, json) =
            match recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id)? {
                (Reply::GetManifestOk { state, json }, _) => (state, json.to_string()),
                (other, _) => return Err(unexpected(&self.server, &other)),
            };
        if state == ManifestState::Unknown {
            return Ok(None);
        }
        let manifest = serde_json::from_str(&json).map_err(|e| Error::Protocol {
            server: self.server.clone(),
            why: format!("garbled manifest of {checkpoint}: {e}"),
        })?;
        Ok(Some((state, manifest)))
    }

    /// Says goodbye and closes.
    pub fn goodbye(mut self) {
        if let Ok(id) = self.send(kind::GOODBYE, &[]) {
            let _ = recv_reply(&mut self.stream, &mut self.reply_buf, &self.server, id);
        }
        if let Transport::Tls(t) = &mut self.stream {
            // A clean TLS end, so the server does not see a truncated stream.
            t.conn.send_close_notify();
            let _ = t.flush();
        }
    }

    /// Sends raw bytes (tests of the server's handling of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }
}

impl Transport {
    /// TLS over `tcp` to `server` (`host:port`, whose host the certificate must name), the
    /// handshake finished within the socket's timeouts, so that a refused certificate is
    /// reported as such rather than as a failed first request.
    pub fn tls(
        server: &str,
        config: &Arc<rustls::ClientConfig>,
        tcp: TcpStream,
    ) -> Result<Transport> {
        let failed = |why: String| Error::Protocol {
            server: server.to_string(),
            why,
        };
        let name = tls::server_name(server).map_err(failed)?;
        let conn = rustls::ClientConnection::new(config.clone(), name)
            .map_err(|e| failed(format!("TLS: {e}")))?;
        let mut stream = rustls::StreamOwned::new(conn, Socket(tcp));
        while stream.conn.is_handshaking() {
            stream
                .conn
                .complete_io(&mut stream.sock)
                .map_err(|e| failed(tls::handshake_failure(&e)))?;
        }
        Ok(Transport::Tls(Box::new(stream)))
    }
}

/// Reads the reply to request `id` (an Error frame becomes `Error::Refused`).
fn recv_reply<'b>(
    stream: &mut Transport,
    reply_buf: &'b mut Vec<u8>,
    server: &str,
    id: u32,
) -> Result<(Reply<'b>, Header)> {
    let header = match read_frame(stream, reply_buf) {
        Ok(Some(h)) => h,
        Ok(None) => {
            return Err(Error::Protocol {
                server: server.to_string(),
                why: "closed the connection".into(),
            })
        }
        Err(protocol::RecvError::Io(e)) => {
            return Err(Error::io(format!("staging server {server}"), e))
        }
        Err(protocol::RecvError::Frame(e)) => {
            return Err(Error::Protocol {
                server: server.to_string(),
                why: e.to_string(),
            })
        }
    };
    let body = &reply_buf[..header.body_len as usize];
    let reply = Reply::decode(header.kind, body).map_err(|e| Error::Protocol {
        server: server.to_string(),
        why: e.to_string(),
    })?;
    if let Reply::Error { code, message } = reply {
        return Err(Error::Refused {
            server: server.to_string(),
            code,
            message: message.to_string(),
        });
    }
    if header.request != id && header.request != 0 {
        return Err(Error::Protocol {
            server: server.to_string(),
            why: format!("answered request {} when {id} was expected", header.request),
        });
    }
    Ok((reply, header))
}

fn unexpected(server: &str, reply: &Reply) -> Error {
    Error::Protocol {
        server: server.to_string(),
        why: format!("unexpected reply {reply:?}"),
    }
}
