//! Bodies field by field: [`BodyWriter`] for the encoders, `BodyReader` for the decoders.

use super::{check_key, FrameError, BLAKE3_LEN, MAX_ITEMS, MAX_KEY};

/// Builds a body field by field (little-endian).
#[derive(Default)]
pub struct BodyWriter {
    pub buf: Vec<u8>,
}

impl BodyWriter {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// A string as u16 length + UTF-8 (callers keep strings under [`MAX_KEY`]).
    pub fn str(&mut self, s: &str) -> &mut Self {
        let s = &s.as_bytes()[..s.len().min(MAX_KEY)];
        self.u16(s.len() as u16);
        self.bytes(s)
    }
}

/// Reads a body field by field, failing (never panicking) on short input.
pub(super) struct BodyReader<'a> {
    pub(super) buf: &'a [u8],
    what: &'static str,
}

impl<'a> BodyReader<'a> {
    pub(super) fn new(buf: &'a [u8], what: &'static str) -> Self {
        BodyReader { buf, what }
    }
    pub(super) fn malformed<T>(&self, why: impl Into<String>) -> Result<T, FrameError> {
        Err(FrameError::Malformed {
            what: self.what,
            why: why.into(),
        })
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return self.malformed(format!("needs {n} more bytes, {} left", self.buf.len()));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    pub(super) fn digest(&mut self) -> Result<[u8; BLAKE3_LEN], FrameError> {
        let mut a = [0u8; BLAKE3_LEN];
        a.copy_from_slice(self.take(BLAKE3_LEN)?);
        Ok(a)
    }
    pub(super) fn str(&mut self) -> Result<&'a str, FrameError> {
        let n = self.u16()? as usize;
        if n > MAX_KEY {
            return self.malformed(format!("string of {n} bytes exceeds {MAX_KEY}"));
        }
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s),
            Err(_) => self.malformed("string is not UTF-8"),
        }
    }
    pub(super) fn key(&mut self) -> Result<&'a str, FrameError> {
        let k = self.str()?;
        check_key(k)?;
        Ok(k)
    }
    pub(super) fn count(&mut self) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > MAX_ITEMS {
            return self.malformed(format!("{n} items exceed the limit of {MAX_ITEMS}"));
        }
        Ok(n)
    }
    /// A byte that must be 0 (false) or 1 (true); `what` names it in the error.
    pub(super) fn flag(&mut self, what: &str) -> Result<bool, FrameError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            f => self.malformed(format!("{what} {f}")),
        }
    }
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    pub(super) fn end(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            self.malformed(format!("{} trailing bytes", self.buf.len()))
        }
    }
}

/// The body of a message that has none: `value` if `body` is empty.
pub(super) fn empty<T>(body: &[u8], what: &'static str, value: T) -> Result<T, FrameError> {
    BodyReader::new(body, what).end().map(|_| value)
}
