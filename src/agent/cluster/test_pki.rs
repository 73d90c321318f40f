//! Test PKI and a minimal HTTPS responder on loopback: a cluster CA and an API server
//! certificate with the SANs kubeadm gives it (or fewer), and a server that answers each
//! request with what a closure says. For the TLS tests of the Kubernetes source and the
//! real-binary tests (`tests/agent_kube.rs` includes this file with `#[path]`).
#![allow(dead_code)] // each includer uses a part

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA and one server certificate it signed.
pub struct Pki {
    /// The CA certificate (what `ca.crt` holds).
    pub ca_pem: String,
    server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    server_key: rustls::pki_types::PrivateKeyDer<'static>,
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
    pub fn new(names: &[&str]) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "kubernetes");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut server =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let cert = server.signed_by(&key, &issuer).unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            server_chain: vec![cert.der().clone()],
            server_key: rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        }
    }

    /// kubeadm's certificate for an API server advertising `advertise` with Service IP
    /// 10.96.0.1.
    pub fn kubeadm(advertise: IpAddr) -> Pki {
        let ip = advertise.to_string();
        let mut names: Vec<&str> = KUBEADM_NAMES.to_vec();
        names.extend(["10.96.0.1", ip.as_str(), "control-plane-1"]);
        Pki::new(&names)
    }

    /// A service-account directory (`ca.crt`, `token`, `namespace`) trusting this CA.
    pub fn service_account_dir(&self, token: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), &self.ca_pem).unwrap();
        std::fs::write(dir.path().join("token"), token).unwrap();
        std::fs::write(dir.path().join("namespace"), "kube-system").unwrap();
        dir
    }
}

/// What the responder answers: status and JSON body, for a request line (`GET /api/v1/...`).
pub type Answer = Arc<dyn Fn(&str) -> (u16, String) + Send + Sync>;

/// A `Status` body.
pub fn status_body(code: u16, reason: &str, message: &str) -> String {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code})
    .to_string()
}

/// An HTTPS responder on 127.0.0.1 with `pki`'s server certificate; counts requests.
pub struct Responder {
    pub addr: SocketAddr,
    pub requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Responder {
    pub async fn start(pki: &Pki, answer: Answer) -> Responder {
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, answer, count) =
                    (acceptor.clone(), Arc::clone(&answer), Arc::clone(&count));
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return; // the client refused the certificate
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    let text = String::from_utf8_lossy(&head);
                    let line = text.lines().next().unwrap_or_default().to_string();
                    let (code, body) = answer(&line);
                    let response = format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Responder {
            addr,
            requests,
            task,
        }
    }
}
