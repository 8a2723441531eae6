//! `cascade-torture serve`: scripted store operations, one command per line on stdin, one
//! response line per command on stdout. Tests drive several such processes through pipes to
//! sequence cross-process checks (process A writes and answers; only then is B asked to read).
//!
//! Commands (SEED and numbers in decimal or 0x-hex):
//! - `write PATH SEED OFF LEN`: write the pattern of SEED to [OFF, OFF+LEN) through a handle
//!   kept open (created if needed) until `close PATH`; answers `ok N`, or `err ERRNO N TEXT`
//!   after N bytes were written (e.g. ENOSPC).
//! - `check PATH SEED OFF LEN`: read [OFF, OFF+LEN) through a new handle; `ok` if it is
//!   exactly the pattern, `bad TEXT` otherwise.
//! - `zeros PATH OFF LEN`: `ok` if the range reads as zeros.
//! - `size PATH`: `ok SIZE`.
//! - `close PATH`, `sync PATH`, `mkdir PATH`, `mkdirs PATH`, `unlink PATH`, `rmdir PATH`,
//!   `rename FROM TO`, `truncate PATH LEN`: `ok` or `err ERRNO TEXT`.
//! - `pid`: `ok PID`. `exit`: `ok`, then the process exits.

use std::collections::HashMap;
use std::io::{BufRead, Write};

use cascade_store::{Error, File, OpenOptions, Store};

use crate::pattern::{check_exact, fill, pattern};

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("not a number: {s}"))
}

fn err_line(e: &Error) -> String {
    format!("err {} {e}", e.errno())
}

struct Server<'a> {
    store: &'a Store,
    open: HashMap<String, File>,
}

impl Server<'_> {
    fn handle(&mut self, path: &str) -> Result<&File, Error> {
        if !self.open.contains_key(path) {
            let opts = OpenOptions::new().read(true).write(true).create(true);
            let f = self.store.open(path, &opts)?;
            self.open.insert(path.to_string(), f);
        }
        self.open
            .get(path)
            .ok_or_else(|| Error::new(libc::EBADF, path.to_string()))
    }

    fn write(&mut self, path: &str, seed: u64, off: u64, len: u64) -> String {
        let file = match self.handle(path) {
            Ok(f) => f,
            Err(e) => return format!("err {} 0 {e}", e.errno()),
        };
        let mut done = 0u64;
        let mut buf = Vec::new();
        while done < len {
            let piece = (len - done).min(1 << 20) as usize;
            buf.resize(piece, 0);
            fill(seed, off + done, &mut buf);
            let mut at = 0usize;
            while at < piece {
                match file.write_at(&buf[at..], off + done + at as u64) {
                    Ok(0) => return format!("bad write_at returned 0 after {done} bytes"),
                    Ok(n) => at += n,
                    Err(e) => return format!("err {} {} {e}", e.errno(), done + at as u64),
                }
            }
            done += piece as u64;
        }
        format!("ok {done}")
    }

    fn read_range(&self, path: &str, off: u64, len: u64) -> Result<Vec<u8>, String> {
        let file = self
            .store
            .open(path, &OpenOptions::new())
            .map_err(|e| err_line(&e))?;
        let mut buf = vec![0u8; len as usize];
        let mut done = 0usize;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], off + done as u64) {
                Ok(0) => return Err(format!("bad short read: {done} of {len} bytes")),
                Ok(n) => done += n,
                Err(e) => return Err(err_line(&e)),
            }
        }
        Ok(buf)
    }

    fn command(&mut self, words: &[&str]) -> Result<String, String> {
        let arg = |i: usize| -> Result<&str, String> {
            words
                .get(i)
                .copied()
                .ok_or_else(|| "bad missing argument".to_string())
        };
        let num = |i: usize| -> Result<u64, String> {
            arg(i).and_then(|s| parse_u64(s).map_err(|m| format!("bad {m}")))
        };
        let unit = |r: Result<(), Error>| match r {
            Ok(()) => "ok".to_string(),
            Err(e) => err_line(&e),
        };
        Ok(match arg(0)? {
            "write" => self.write(arg(1)?, num(2)?, num(3)?, num(4)?),
            "check" => {
                let (seed, off, len) = (num(2)?, num(3)?, num(4)?);
                let got = self.read_range(arg(1)?, off, len)?;
                match check_exact(off, &got, &pattern(seed, off, len as usize)) {
                    Ok(()) => "ok".to_string(),
                    Err(m) => format!("bad {}: {m}", arg(1)?),
                }
            }
            "zeros" => {
                let (off, len) = (num(2)?, num(3)?);
                let got = self.read_range(arg(1)?, off, len)?;
                match got.iter().position(|&b| b != 0) {
                    None => "ok".to_string(),
                    Some(i) => format!("bad byte at {} is {:#04x}", off + i as u64, got[i]),
                }
            }
            "size" => match self.store.stat(arg(1)?) {
                Ok(m) => format!("ok {}", m.size),
                Err(e) => err_line(&e),
            },
            "close" => {
                self.open.remove(arg(1)?);
                "ok".to_string()
            }
            "sync" => unit(self.handle(arg(1)?).and_then(|f| f.sync())),
            "mkdir" => unit(self.store.mkdir(arg(1)?, 0o755)),
            "mkdirs" => unit(self.store.create_dir_all(arg(1)?, 0o755)),
            "unlink" => unit(self.store.unlink(arg(1)?)),
            "rmdir" => unit(self.store.rmdir(arg(1)?)),
            "rename" => unit(self.store.rename(arg(1)?, arg(2)?)),
            "truncate" => unit(self.store.truncate(arg(1)?, num(2)?)),
            "pid" => format!("ok {}", std::process::id()),
            other => format!("bad unknown command {other}"),
        })
    }
}

/// Serves commands from `input` until `exit` or end of input.
pub fn serve(store: &Store, input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    let mut server = Server {
        store,
        open: HashMap::new(),
    };
    for line in input.lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        if words[0] == "exit" {
            writeln!(output, "ok")?;
            output.flush()?;
            break;
        }
        let reply = server.command(&words).unwrap_or_else(|e| e);
        writeln!(output, "{reply}")?;
        output.flush()?;
    }
    Ok(())
}
