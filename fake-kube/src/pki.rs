//! A test PKI: a cluster CA and an API server certificate with the names kubeadm gives it
//! (or fewer, or others), the service-account directory a pod of that cluster has, and the
//! TLS configuration the fake serves HTTPS with ([`crate::FakeApi::serve_tls`]).

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a test PKI could not be made or served.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating the test certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing its files or binding its server: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server certificate does not suit TLS: {0}")]
    Tls(#[from] rustls::Error),
}

/// A CA and one server certificate it signed.
#[derive(Debug)]
pub struct Pki {
    /// The CA certificate (what `ca.crt` holds).
    pub ca_pem: String,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
}

/// The DNS names kubeadm puts into the API server certificate.
pub const KUBEADM_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

impl Pki {
    /// A cluster CA and an API server certificate for `names` (DNS names and IPs).
    pub fn new(names: &[&str]) -> Result<Pki, PkiError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kubernetes");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut server = CertificateParams::new(names)?;
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = server.signed_by(&key, &issuer)?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            server_chain: vec![cert.der().clone()],
            server_key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        })
    }

    /// kubeadm's certificate for an API server advertising `advertise` with Service IP
    /// 10.96.0.1.
    pub fn kubeadm(advertise: IpAddr) -> Result<Pki, PkiError> {
        let ip = advertise.to_string();
        let mut names: Vec<&str> = KUBEADM_NAMES.to_vec();
        names.extend(["10.96.0.1", ip.as_str(), "control-plane-1"]);
        Pki::new(&names)
    }

    /// A service-account directory (`ca.crt`, `token`, `namespace`) trusting this CA.
    pub fn service_account_dir(&self, token: &str) -> Result<tempfile::TempDir, PkiError> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("ca.crt"), &self.ca_pem)?;
        std::fs::write(dir.path().join("token"), token)?;
        std::fs::write(dir.path().join("namespace"), "kube-system")?;
        Ok(dir)
    }

    /// The TLS configuration of a server presenting this certificate.
    pub(crate) fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, PkiError> {
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(self.server_chain.clone(), self.server_key.clone_key())?;
        Ok(Arc::new(config))
    }
}
