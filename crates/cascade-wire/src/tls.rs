//! TLS on the staging data path (docs/staging-protocol.md, "Transport"): rustls with the
//! `ring` provider, configs built from PEM files, the server name a client verifies, and the
//! channel binding both ends can mix into their authentication.

use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;

pub use rustls;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The label of the keying material exported as the channel binding (RFC 5705 / RFC 8446
/// section 7.5), with no context.
pub const BINDING_LABEL: &[u8] = b"EXPORTER-cascade-staging-auth";

/// The exported keying material of an established connection ([`BINDING_LABEL`], 32 bytes):
/// equal on both ends of one TLS session and on no other, so a proof mixed with it cannot
/// be relayed over another connection.
pub fn channel_binding<D>(conn: &rustls::ConnectionCommon<D>) -> Option<[u8; 32]> {
    if conn.is_handshaking() {
        return None;
    }
    conn.export_keying_material([0u8; 32], BINDING_LABEL, None)
        .ok()
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config from a PEM certificate chain (the server's certificate first) and its
/// PEM private key. Errors are one line naming the file.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, String> {
    let certs = read_certs(cert_file, "TLS certificate file")?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
        format!(
            "TLS key file {}: {}",
            key_file.display(),
            pem_error_text(&e, "PRIVATE KEY")
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "TLS certificate {} and key {}: {e}",
                cert_file.display(),
                key_file.display()
            )
        })?;
    // Nothing resumes sessions: tickets would be bytes sent for nothing.
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A client config trusting the CA certificate(s) in a PEM file.
pub fn client_config(ca_file: &Path) -> Result<Arc<ClientConfig>, String> {
    let certs = read_certs(ca_file, "TLS CA file")?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| format!("TLS CA file {}: {e}", ca_file.display()))?;
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn read_certs(file: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let failed = |why: String| format!("{what} {}: {why}", file.display());
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(|e| failed(pem_error_text(&e, "CERTIFICATE")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(pem_error_text(&e, "CERTIFICATE")))?;
    if certs.is_empty() {
        return Err(failed("no CERTIFICATE block in it".into()));
    }
    Ok(certs)
}

fn pem_error_text(e: &rustls::pki_types::pem::Error, wanted: &str) -> String {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::Io(io) => io_text(io),
        E::NoItemsFound => format!("no {wanted} block in it"),
        other => format!("not a valid PEM file: {other}"),
    }
}

/// An I/O error without Rust's " (os error N)" suffix.
fn io_text(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// The name a client verifies the server's certificate against: the host part of
/// `host:port` (`[v6]:port` too); an IP address is an IP address name, which the
/// certificate must list as such.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("{host:?} is not a host name a TLS certificate can name"))
}

/// One line for a TLS failure, with a hint at the usual cause.
pub fn handshake_failure(e: &io::Error) -> String {
    let hint = match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => " (the server's certificate does not name the host of the server address)",
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (is staging.tls_ca the CA that signed the server's certificate?)"
        }
        Some(rustls::Error::InvalidMessage(_)) => {
            " (the server does not speak TLS: drop staging.tls_ca, or give the server \
             stage_server.tls_cert and stage_server.tls_key)"
        }
        _ if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
        ) =>
        {
            " (the server closed the connection: it may be at its connection limit, or not \
             speak TLS)"
        }
        _ => "",
    };
    format!("TLS handshake failed: {}{hint}", io_text(e))
}

/// A TCP stream as rustls's transport: writes with `MSG_NOSIGNAL` (a peer that went away is
/// EPIPE, not a SIGPIPE in the application the agent may run in), and a socket timeout
/// (WouldBlock on Linux) as TimedOut, which rustls passes on instead of treating it as
/// "try again".
#[derive(Debug)]
pub struct Socket(pub TcpStream);

fn timed_out(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::WouldBlock {
        io::Error::new(io::ErrorKind::TimedOut, "timed out")
    } else {
        e
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(timed_out)
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        crate::protocol::NoSigPipe(&self.0)
            .write(buf)
            .map_err(timed_out)
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        crate::protocol::NoSigPipe(&self.0)
            .write_vectored(bufs)
            .map_err(timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_host_part_of_the_address() {
        let ip = |a: &str| match server_name(a) {
            Ok(ServerName::IpAddress(ip)) => Some(IpAddr::from(ip)),
            _ => None,
        };
        assert_eq!(ip("10.0.0.5:7070"), "10.0.0.5".parse().ok());
        assert_eq!(ip("[::1]:7070"), "::1".parse().ok());
        match server_name("stage1.example.org:7070") {
            Ok(ServerName::DnsName(d)) => assert_eq!(d.as_ref(), "stage1.example.org"),
            other => panic!("{other:?}"),
        }
        assert!(server_name("bad host!:1").is_err());
    }

    #[test]
    fn unreadable_or_empty_pem_files_are_one_line_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("cascade-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem\n").expect("write");
        let missing = dir.join("missing.pem");
        let e = client_config(&missing).expect_err("missing file");
        assert!(
            e.contains("missing.pem") && e.contains("No such file"),
            "{e}"
        );
        assert!(!e.contains("os error"), "{e}");
        let e = client_config(&empty).expect_err("no certificate");
        assert!(e.contains("empty.pem: no CERTIFICATE block"), "{e}");
        let e = server_config(&missing, &empty).expect_err("no certificate");
        assert!(
            e.starts_with("TLS certificate file ") && e.contains("missing.pem"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
