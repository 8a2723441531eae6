//! The checks behind the fuzz targets, shared with `tests/fuzz_corpus.rs` (which includes
//! this file with `#[path]`, so it builds on stable with nothing but `cascade_wire`).
//!
//! Decoding must never panic, and whatever a decoder accepts must be exactly what the
//! matching encoder produces from the decoded values (so the decoders accept no frame the
//! encoders could not have written, except for the bytes the protocol says are ignored:
//! header flags and the digest of an unsealed segment).

use std::io::{self, Read};

use cascade_wire::protocol::{
    check_key, code, decode_request_frame, encode_auth, encode_auth_ok, encode_challenge,
    encode_chunk_descriptors, encode_get_chunks_ok_head, encode_get_manifest,
    encode_get_manifest_ok, encode_hello, encode_lacks_ok, encode_manifest_part, encode_pull,
    encode_pull_ok, encode_push, encode_put_chunks_ok, encode_read, encode_read_ok_head,
    encode_scores, encode_segment_header, encode_watch, encode_watch_ok, kind, read_frame,
    BodyWriter, FrameError, Header, ManifestState, Reply, Request, Stored, WireChunk, BLAKE3_LEN,
    HEADER_LEN, MAX_BODY, MAX_DATA, MAX_FRAME_RAW, MAX_ITEMS, MAX_KEY, TAG_LEN,
};

/// What decoding one input as a frame gave.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// `decode_request_frame` accepted the whole input as a request frame.
    pub request: bool,
    /// The input is a header and a body that `Reply::decode` accepted for the header's kind.
    pub reply: bool,
}

/// Every request and reply kind, and one unknown kind.
const KINDS: [u8; 32] = [
    kind::HELLO,
    kind::WRITE,
    kind::SYNC,
    kind::READ,
    kind::PUSH,
    kind::PULL,
    kind::PING,
    kind::GOODBYE,
    kind::STATUS,
    kind::LACKS,
    kind::PUT_CHUNKS,
    kind::PUT_MANIFEST,
    kind::GET_CHUNKS,
    kind::GET_MANIFEST,
    kind::AUTH,
    kind::HELLO | kind::REPLY,
    kind::WRITE | kind::REPLY,
    kind::SYNC | kind::REPLY,
    kind::READ | kind::REPLY,
    kind::PUSH | kind::REPLY,
    kind::PULL | kind::REPLY,
    kind::PING | kind::REPLY,
    kind::GOODBYE | kind::REPLY,
    kind::STATUS | kind::REPLY,
    kind::LACKS | kind::REPLY,
    kind::PUT_CHUNKS | kind::REPLY,
    kind::PUT_MANIFEST | kind::REPLY,
    kind::GET_CHUNKS | kind::REPLY,
    kind::GET_MANIFEST | kind::REPLY,
    kind::AUTH | kind::REPLY,
    kind::ERROR,
    0x42,
];

/// What a chunk list decoder must have enforced.
fn check_chunks(chunks: &[WireChunk<'_>]) {
    assert!(chunks.len() <= MAX_ITEMS);
    let mut raw = 0u64;
    for c in chunks {
        assert!(c.data.len() <= MAX_DATA && c.raw_len as usize <= MAX_DATA);
        match c.stored {
            Stored::Raw => assert_eq!(c.data.len(), c.raw_len as usize),
            Stored::Zstd => assert!(!c.data.is_empty()),
            Stored::Delta => panic!("the wire protocol has no delta blobs"),
        }
        raw += u64::from(c.raw_len);
    }
    assert!(raw <= MAX_FRAME_RAW);
}

fn chunks_body(head: BodyWriter, chunks: &[WireChunk<'_>]) -> Vec<u8> {
    let mut w = head;
    encode_chunk_descriptors(&mut w, chunks);
    for c in chunks {
        w.bytes(c.data);
    }
    w.buf
}

/// Decodes `data` as a request frame, as a reply frame, and (both `data` and `data` after
/// a header's worth of bytes) as the body of every request and reply kind.
pub fn decode_frame(data: &[u8]) -> Decoded {
    let mut out = Decoded::default();
    match decode_request_frame(data) {
        Ok((header, request)) => {
            out.request = true;
            check_header(header, data);
            check_request(header.kind, &request, &data[HEADER_LEN..]);
        }
        Err(e) => check_error(&e),
    }
    if let Some(h) = data.get(..HEADER_LEN) {
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(h);
        match Header::decode(&raw) {
            Ok(header) => {
                check_header(header, data);
                let body = &data[HEADER_LEN..];
                if body.len() == header.body_len as usize {
                    if let Ok(reply) = Reply::decode(header.kind, body) {
                        out.reply = true;
                        check_reply(header.kind, &reply, body);
                    }
                }
            }
            Err(e) => check_error(&e),
        }
    }
    let after_header = data.get(HEADER_LEN..).unwrap_or(&[]);
    for body in [data, after_header] {
        for k in KINDS {
            match Request::decode(k, body) {
                Ok(r) => check_request(k, &r, body),
                Err(e) => check_error(&e),
            }
            match Reply::decode(k, body) {
                Ok(r) => check_reply(k, &r, body),
                Err(e) => check_error(&e),
            }
        }
    }
    out
}

/// What reading one input as a stream of frames gave.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Frames `read_frame` returned.
    pub frames: usize,
    /// Of those, frames whose body decoded as a request or a reply of the header's kind.
    pub decoded: usize,
    /// The stream ended cleanly (`Ok(None)`) at a frame boundary.
    pub clean_end: bool,
}

/// Reads frames with `read_frame` from `data[1..]` until the end or an error. `data[0]`
/// chooses the reader: bits 0-6 cap the bytes one `read` returns (0 = no cap), bit 7 makes
/// every third `read` fail with `Interrupted` (which the protocol's readers must retry).
/// `body` is the reused receive buffer: it must only grow, never past `MAX_BODY`.
pub fn read_frames(data: &[u8], body: &mut Vec<u8>) -> ReadOutcome {
    let (control, stream) = match data.split_first() {
        Some((&c, rest)) => (c, rest),
        None => (0, data),
    };
    let mut r = Chunked {
        data: stream,
        pos: 0,
        cap: (control & 0x7f) as usize,
        interrupt: control & 0x80 != 0,
        calls: 0,
    };
    let mut out = ReadOutcome::default();
    loop {
        let before = body.len();
        let start = r.pos;
        match read_frame(&mut r, body) {
            Ok(Some(header)) => {
                out.frames += 1;
                assert!(body.len() >= before, "read_frame shrank the buffer");
                assert!(
                    body.len() <= before.max(MAX_BODY),
                    "read_frame grew the buffer to {} bytes",
                    body.len()
                );
                let n = header.body_len as usize;
                assert!(n <= MAX_BODY);
                assert_eq!(r.pos, start + HEADER_LEN + n, "read past the frame");
                let frame = &stream[start..r.pos];
                check_header(header, frame);
                let b = &body[..n];
                assert_eq!(b, &frame[HEADER_LEN..], "body differs from the stream");
                let mut ok = false;
                match Request::decode(header.kind, b) {
                    Ok(req) => {
                        ok = true;
                        check_request(header.kind, &req, b);
                    }
                    Err(e) => check_error(&e),
                }
                match Reply::decode(header.kind, b) {
                    Ok(rep) => {
                        ok = true;
                        check_reply(header.kind, &rep, b);
                    }
                    Err(e) => check_error(&e),
                }
                if ok {
                    out.decoded += 1;
                }
            }
            Ok(None) => {
                assert_eq!(r.pos, stream.len(), "Ok(None) before the end of the stream");
                assert_eq!(r.pos, start, "Ok(None) after part of a header");
                out.clean_end = true;
                break;
            }
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
    out
}

/// A reader over a byte slice that returns short reads and spurious `Interrupted` errors.
struct Chunked<'a> {
    data: &'a [u8],
    pos: usize,
    cap: usize,
    interrupt: bool,
    calls: u64,
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls += 1;
        if self.interrupt && self.calls % 3 == 0 {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let mut n = buf.len().min(self.data.len() - self.pos);
        if self.cap != 0 {
            n = n.min(self.cap);
        }
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn check_error(e: &FrameError) {
    let c = e.code();
    assert!(
        c == code::BAD_FRAME || c == code::VERSION || c == code::BAD_PATH,
        "decode error {e:?} has code {c}"
    );
    let _ = e.to_string();
}

/// A decoded header re-encodes to the frame's first 16 bytes (flags, bytes 6-7, ignored).
fn check_header(header: Header, frame: &[u8]) {
    assert!(header.body_len as usize <= MAX_BODY);
    let mut raw = [0u8; HEADER_LEN];
    raw.copy_from_slice(&frame[..HEADER_LEN]);
    raw[6] = 0;
    raw[7] = 0;
    assert_eq!(header.encode(), raw, "header does not re-encode");
}

fn check_request(k: u8, request: &Request<'_>, body: &[u8]) {
    let again: Vec<u8> = match request {
        Request::Hello(h) => {
            assert_eq!(k, kind::HELLO);
            assert!(h.namespace.is_empty() || check_key(h.namespace).is_ok());
            encode_hello(h.client, h.namespace, &h.nonce)
        }
        Request::Auth { proof } => {
            assert_eq!(k, kind::AUTH);
            encode_auth(proof)
        }
        Request::Write(segments) => {
            assert_eq!(k, kind::WRITE);
            assert!(segments.len() <= MAX_ITEMS);
            let mut w = BodyWriter::default();
            w.u32(segments.len() as u32);
            // Where each unsealed segment's (ignored) digest and tag sit in `body`.
            let mut ignored = Vec::new();
            for s in segments {
                assert!(check_key(s.key).is_ok(), "Write accepted key {:?}", s.key);
                let end = s.offset.checked_add(s.data.len() as u64);
                assert!(end.is_some_and(|e| e <= s.size), "segment past its size");
                encode_segment_header(
                    &mut w,
                    s.key,
                    s.stamp,
                    s.size,
                    s.offset,
                    s.data.len() as u32,
                    s.seal.as_ref(),
                );
                if s.seal.is_none() {
                    ignored.push(w.buf.len() - BLAKE3_LEN - TAG_LEN);
                }
            }
            for s in segments {
                w.bytes(s.data);
            }
            let mut expected = body.to_vec();
            for at in ignored {
                if let Some(d) = expected.get_mut(at..at + BLAKE3_LEN + TAG_LEN) {
                    d.fill(0);
                }
            }
            assert_eq!(w.buf, expected, "Write does not re-encode");
            return;
        }
        Request::Read { key, offset, len } => {
            assert_eq!(k, kind::READ);
            assert!(check_key(key).is_ok());
            assert!(*len as usize <= MAX_DATA);
            encode_read(key, *offset, *len)
        }
        Request::Push {
            checkpoint,
            single_file,
            files,
        } => {
            assert_eq!(k, kind::PUSH);
            assert!(check_key(checkpoint).is_ok());
            assert!(files.len() <= MAX_ITEMS);
            for f in files {
                assert!(check_key(&f.path).is_ok());
            }
            encode_push(checkpoint, *single_file, files)
        }
        Request::Pull(queries) => {
            assert_eq!(k, kind::PULL);
            assert!(queries.len() <= MAX_ITEMS);
            for (_, key) in queries {
                assert!(check_key(key).is_ok());
            }
            encode_pull(queries)
        }
        Request::Sync => {
            assert_eq!(k, kind::SYNC);
            Vec::new()
        }
        Request::Ping => {
            assert_eq!(k, kind::PING);
            Vec::new()
        }
        Request::Goodbye => {
            assert_eq!(k, kind::GOODBYE);
            Vec::new()
        }
        Request::Status => {
            assert_eq!(k, kind::STATUS);
            Vec::new()
        }
        Request::Lacks(scores) => {
            assert_eq!(k, kind::LACKS);
            assert!(scores.len() <= MAX_ITEMS);
            encode_scores(scores)
        }
        Request::GetChunks(scores) => {
            assert_eq!(k, kind::GET_CHUNKS);
            assert!(scores.len() <= MAX_ITEMS);
            encode_scores(scores)
        }
        Request::PutChunks(chunks) => {
            assert_eq!(k, kind::PUT_CHUNKS);
            check_chunks(chunks);
            chunks_body(BodyWriter::default(), chunks)
        }
        Request::PutManifest(part) => {
            assert_eq!(k, kind::PUT_MANIFEST);
            assert!(check_key(part.checkpoint).is_ok());
            assert!(part.files.len() <= MAX_ITEMS && part.scores.len() <= MAX_ITEMS);
            for f in &part.files {
                assert!(check_key(&f.path).is_ok());
            }
            encode_manifest_part(part)
        }
        Request::GetManifest { checkpoint } => {
            assert_eq!(k, kind::GET_MANIFEST);
            assert!(check_key(checkpoint).is_ok());
            encode_get_manifest(checkpoint)
        }
        Request::Watch { after, wait_ms } => {
            assert_eq!(k, kind::WATCH);
            encode_watch(*after, *wait_ms)
        }
    };
    assert_eq!(again, body, "{request:?} does not re-encode");
}

fn check_reply(k: u8, reply: &Reply<'_>, body: &[u8]) {
    let empty = |want: u8| {
        assert_eq!(k, want | kind::REPLY);
        Vec::new()
    };
    let again: Vec<u8> = match reply {
        Reply::Challenge {
            server,
            instance,
            nonce,
        } => {
            assert_eq!(k, kind::HELLO | kind::REPLY);
            encode_challenge(server, *instance, nonce)
        }
        Reply::AuthOk { proof } => {
            assert_eq!(k, kind::AUTH | kind::REPLY);
            encode_auth_ok(proof)
        }
        Reply::ReadOk {
            stamp,
            size,
            blake3,
            tag,
            data,
        } => {
            assert_eq!(k, kind::READ | kind::REPLY);
            let mut b = encode_read_ok_head(*stamp, *size, blake3, tag);
            b.extend_from_slice(data);
            b
        }
        Reply::PullOk(states) => {
            assert_eq!(k, kind::PULL | kind::REPLY);
            assert!(states.len() <= MAX_ITEMS);
            encode_pull_ok(states)
        }
        Reply::StatusOk(json) => {
            assert_eq!(k, kind::STATUS | kind::REPLY);
            json.as_bytes().to_vec()
        }
        Reply::Error { code, message } => {
            assert_eq!(k, kind::ERROR);
            assert!(message.len() <= MAX_KEY);
            // Not encode_error: it cuts messages at 1024 bytes, the decoder takes 4096.
            let mut w = BodyWriter::default();
            w.u16(*code).str(message);
            w.buf
        }
        Reply::LacksOk(flags) => {
            assert_eq!(k, kind::LACKS | kind::REPLY);
            assert!(flags.len() <= MAX_ITEMS);
            encode_lacks_ok(flags)
        }
        Reply::PutChunksOk { stored, present } => {
            assert_eq!(k, kind::PUT_CHUNKS | kind::REPLY);
            encode_put_chunks_ok(*stored, *present)
        }
        Reply::GetChunksOk { considered, chunks } => {
            assert_eq!(k, kind::GET_CHUNKS | kind::REPLY);
            assert!(chunks.len() <= *considered as usize && *considered as usize <= MAX_ITEMS);
            check_chunks(chunks);
            let mut b = encode_get_chunks_ok_head(*considered, chunks);
            for c in chunks {
                b.extend_from_slice(c.data);
            }
            b
        }
        Reply::GetManifestOk { state, json } => {
            assert_eq!(k, kind::GET_MANIFEST | kind::REPLY);
            assert_eq!(*state == ManifestState::Unknown, json.is_empty());
            encode_get_manifest_ok(*state, json)
        }
        Reply::WatchOk { events } => {
            assert_eq!(k, kind::WATCH | kind::REPLY);
            encode_watch_ok(*events)
        }
        Reply::PutManifestOk => empty(kind::PUT_MANIFEST),
        Reply::WriteOk => empty(kind::WRITE),
        Reply::SyncOk => empty(kind::SYNC),
        Reply::PushOk => empty(kind::PUSH),
        Reply::Pong => empty(kind::PING),
        Reply::GoodbyeOk => empty(kind::GOODBYE),
    };
    assert_eq!(again, body, "{reply:?} does not re-encode");
}
