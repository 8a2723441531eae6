//! Test certificates for TLS on the staging data path, made with rcgen (ring).

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// PEM files in a directory: `ca.pem` (the CA), `server.pem` and `server.key` (a
/// certificate it signed for IP 127.0.0.1 and DNS localhost; the key mode 0600), and
/// `other-ca.pem` (a CA that signed nothing here: a client trusting it must refuse the
/// server).
#[derive(Debug, Clone)]
pub struct TestPki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().expect("CA key");
    CertifiedIssuer::self_signed(params, key).expect("self-signed CA")
}

impl TestPki {
    /// Makes the certificates and writes them into `dir` (which must exist).
    pub fn generate(dir: &Path) -> TestPki {
        let issuer = ca("cascade test CA");
        let other = ca("cascade other CA");
        let mut params =
            CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(DnType::CommonName, "cascade test staging server");
        let key = KeyPair::generate().expect("server key");
        let cert = params.signed_by(&key, &issuer).expect("server certificate");
        let pki = TestPki {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            other_ca: dir.join("other-ca.pem"),
        };
        let write = |path: &Path, text: String| std::fs::write(path, text).expect("write PEM");
        write(&pki.ca, issuer.pem());
        write(&pki.other_ca, other.pem());
        write(&pki.cert, cert.pem());
        write(&pki.key, key.serialize_pem());
        std::fs::set_permissions(&pki.key, std::fs::Permissions::from_mode(0o600))
            .expect("chmod the key");
        pki
    }
}
