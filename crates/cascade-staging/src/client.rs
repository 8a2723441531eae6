//! A connection to one staging server (the agent's side of docs/staging-protocol.md).
//!
//! Write frames are not answered one by one: the client streams them and a Sync is
//! answered once everything before it is durable on the server, so the network, the
//! server's receive and its SSD all work at once. A Write the server refuses (full, bad
//! path) is answered by an Error frame and a closed connection; the client reports that
//! reason rather than the broken pipe it may see first.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::protocol::{
    self, encode_segment_header, kind, read_frame, write_frame, BodyWriter, Header, NoSigPipe,
    PullKind, PullState, PushFile, Reply, BLAKE3_LEN,
};
use crate::server::ServerStatus;
use crate::{Error, Result};

/// How a client identifies itself.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub secret: String,
    /// For the server's log: host:pid.
    pub client: String,
    /// Every key of the connection lives under this prefix on the server ("" = none).
    pub namespace: String,
    pub connect_timeout: Duration,
    /// A server that stops answering for this long is treated as dead.
    pub io_timeout: Duration,
}

impl ClientOptions {
    pub fn new(secret: &str) -> ClientOptions {
        let host = crate::host_name();
        ClientOptions {
            secret: secret.to_string(),
            client: format!("{host}:{}", std::process::id()),
            namespace: String::new(),
            connect_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(60),
        }
    }
}

/// What a Read returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMeta {
    pub stamp: u64,
    pub size: u64,
    pub blake3: [u8; BLAKE3_LEN],
}

/// One piece of a file version to send: `data` is sent with vectored writes straight from
/// wherever it lives (the node store's mapped chunks), never copied.
pub struct OutSegment<'a> {
    pub key: &'a str,
    pub stamp: u64,
    pub size: u64,
    pub offset: u64,
    pub seal: Option<[u8; BLAKE3_LEN]>,
    pub data: &'a [&'a [u8]],
}

pub struct Connection {
    stream: TcpStream,
    server: String,
    instance: u64,
    next_request: u32,
    reply_buf: Vec<u8>,
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
        let mut c = Connection {
            stream,
            server: server.to_string(),
            instance: 0,
            next_request: 1,
            reply_buf: Vec::new(),
        };
        let body = protocol::encode_hello(&opts.secret, &opts.client, &opts.namespace);
        let id = c.send(kind::HELLO, &[&body])?;
        match recv_reply(&c.stream, &mut c.reply_buf, &c.server, id)? {
            (Reply::HelloOk { instance, .. }, _) => c.instance = instance,
            (other, _) => return Err(unexpected(&c.server, &other)),
        }
        Ok(c)
    }

    pub fn server(&self) -> &str {
        &self.server
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
        match write_frame(&mut NoSigPipe(&self.stream), header, body) {
            Ok(()) => Ok(id),
            Err(e) => Err(self.why_broken(e)),
        }
    }

    /// A send failed: the server may have said why before closing.
    fn why_broken(&mut self, e: io::Error) -> Error {
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(200)));
        if let Ok(Some(h)) = read_frame(&mut &self.stream, &mut self.reply_buf) {
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
        match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id)? {
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
        match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id) {
            Ok((
                Reply::ReadOk {
                    stamp,
                    size,
                    blake3,
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
        match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PushOk, _) => Ok(()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// The level of files and checkpoints on this server.
    pub fn pull(&mut self, queries: &[(PullKind, &str)]) -> Result<Vec<PullState>> {
        let id = self.send(kind::PULL, &[&protocol::encode_pull(queries)])?;
        let n = queries.len();
        match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::PullOk(states), _) if states.len() == n => Ok(states),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    /// Round-trip time.
    pub fn ping(&mut self) -> Result<Duration> {
        let started = Instant::now();
        let id = self.send(kind::PING, &[])?;
        match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::Pong, _) => Ok(started.elapsed()),
            (other, _) => Err(unexpected(&self.server, &other)),
        }
    }

    pub fn status(&mut self) -> Result<ServerStatus> {
        let id = self.send(kind::STATUS, &[])?;
        let json = match recv_reply(&self.stream, &mut self.reply_buf, &self.server, id)? {
            (Reply::StatusOk(json), _) => json.to_string(),
            (other, _) => return Err(unexpected(&self.server, &other)),
        };
        serde_json::from_str(&json).map_err(|e| Error::Protocol {
            server: self.server.clone(),
            why: format!("garbled status: {e}"),
        })
    }

    /// Says goodbye and closes.
    pub fn goodbye(mut self) {
        if let Ok(id) = self.send(kind::GOODBYE, &[]) {
            let _ = recv_reply(&self.stream, &mut self.reply_buf, &self.server, id);
        }
    }

    /// Sends raw bytes (tests of the server's handling of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        io::Write::write_all(&mut NoSigPipe(&self.stream), bytes)
    }
}

/// Reads the reply to request `id` (an Error frame becomes `Error::Refused`).
fn recv_reply<'b>(
    stream: &TcpStream,
    reply_buf: &'b mut Vec<u8>,
    server: &str,
    id: u32,
) -> Result<(Reply<'b>, Header)> {
    let header = match read_frame(&mut &*stream, reply_buf) {
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
