//! Where the API server is and how to talk to it: the address (`LACE_APISERVER_ADDRESS`,
//! else the in-cluster `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`), the pod's
//! service-account token (re-read by kube every minute: bound tokens rotate) and CA (re-read
//! too), and what an error means for an operator ([`explain`]).
//!
//! **TLS server name.** The chart bakes the address from the default/kubernetes
//! EndpointSlice, so it is usually an IP. rustls verifies an IP against the certificate's IP
//! SANs; kubeadm puts the advertise address (the EndpointSlice's) and the Service IP there, so
//! that works as is. Some platforms' API server certificates name only the Service IP and the
//! in-cluster DNS names; when the certificate is not valid for the IP, the source verifies it
//! as [`IN_CLUSTER_NAME`] instead, the name every API server certificate carries for
//! in-cluster clients (the CA still has to be the cluster's).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use kube::Client;

use super::address::{parse_address, AddressError};

/// Where the pod's service-account credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name an API server certificate is verified as when it does not name the address' IP.
pub const IN_CLUSTER_NAME: &str = "kubernetes.default.svc";
/// The environment variable the chart passes `node.apiserverAddress` in.
pub const ADDRESS_ENV: &str = "LACE_APISERVER_ADDRESS";

/// Why the API server cannot even be tried.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(
        "{origin}: {value:?} is not an API server address: {reason} (expected host:port, \
         [IPv6]:port, or an https:// URL)"
    )]
    Address {
        origin: String,
        value: String,
        #[source]
        reason: AddressError,
    },
    #[error(
        "no API server address: set {ADDRESS_ENV} (the chart's node.apiserverAddress) or run in \
         a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT); standalone mode needs \
         --manifests DIR"
    )]
    NoAddress,
    #[error(
        "cannot read the API server CA {path}: {source}; the pod's service account must be \
         mounted (automountServiceAccountToken) or --service-account-dir point at it"
    )]
    Ca {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the API server CA {path} holds no PEM certificate")]
    CaEmpty { path: PathBuf },
    #[error(
        "cannot read the service account token {path}: {source}; the pod's service account \
         must be mounted (automountServiceAccountToken) or --service-account-dir point at it"
    )]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the Kubernetes client for {address}: {source}")]
    Client {
        address: String,
        #[source]
        source: kube::Error,
    },
}

/// How clients are made.
#[derive(Clone)]
enum How {
    Config(Box<kube::Config>),
    /// A client made elsewhere (tests and benchmarks: a fake API server).
    Fixed(Client),
}

impl std::fmt::Debug for How {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            How::Config(c) => f.debug_tuple("Config").field(&c.cluster_url).finish(),
            How::Fixed(_) => f.write_str("Fixed"),
        }
    }
}

/// The API server this agent talks to, and how.
#[derive(Clone, Debug)]
pub struct ApiServer {
    how: How,
    /// `https://10.0.0.1:6443 (LACE_APISERVER_ADDRESS)`: for logs and errors.
    description: String,
    /// Whether an API server certificate that does not name the address may be verified as
    /// [`IN_CLUSTER_NAME`] (the address is an IP and no other name was asked for).
    may_verify_in_cluster_name: bool,
    token: PathBuf,
    ca: Option<PathBuf>,
}

impl ApiServer {
    /// The API server at `address` (from `LACE_APISERVER_ADDRESS`), else the in-cluster one;
    /// credentials from `service_account_dir`.
    pub fn new(address: Option<&str>, service_account_dir: &Path) -> Result<Self, ConnectError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
        let port = std::env::var("KUBERNETES_SERVICE_PORT").ok();
        Self::resolve(address, (host, port), service_account_dir)
    }

    /// [`ApiServer::new`] with the in-cluster variables given.
    fn resolve(
        address: Option<&str>,
        in_cluster: (Option<String>, Option<String>),
        service_account_dir: &Path,
    ) -> Result<Self, ConnectError> {
        let (origin, value) = match address.map(str::trim).filter(|a| !a.is_empty()) {
            Some(a) => (
                format!("{ADDRESS_ENV} (node.apiserverAddress)"),
                a.to_string(),
            ),
            None => match in_cluster {
                (Some(h), Some(p)) if !h.is_empty() => {
                    let h = if h.contains(':') && !h.starts_with('[') {
                        format!("[{h}]")
                    } else {
                        h
                    };
                    (
                        "KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT (in-cluster)".to_string(),
                        format!("{h}:{p}"),
                    )
                }
                _ => return Err(ConnectError::NoAddress),
            },
        };
        let uri = parse_address(&value).map_err(|reason| ConnectError::Address {
            origin: origin.clone(),
            value: value.clone(),
            reason,
        })?;
        let host_is_ip = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .is_some_and(|h| h.parse::<IpAddr>().is_ok());
        let ca = service_account_dir.join("ca.crt");
        let token = service_account_dir.join("token");
        let mut config = kube::Config::new(uri.clone());
        let mut ca_file = None;
        if uri.scheme_str() == Some("https") {
            let pem = std::fs::read(&ca).map_err(|source| ConnectError::Ca {
                path: ca.clone(),
                source,
            })?;
            let certs = pem_certificates(&pem);
            if certs.is_empty() {
                return Err(ConnectError::CaEmpty { path: ca });
            }
            config.root_cert = Some(certs);
            // kube re-reads the file (CA rotation).
            config.root_cert_file = Some(ca.clone());
            ca_file = Some(ca);
        }
        config.auth_info.token_file = Some(token.display().to_string());
        // The agent is a client of one API server, not of a kubeconfig's proxies.
        config.proxy_url = None;
        Ok(Self {
            how: How::Config(Box::new(config)),
            description: format!("{} ({origin})", uri.to_string().trim_end_matches('/')),
            may_verify_in_cluster_name: host_is_ip,
            token,
            ca: ca_file,
        })
    }

    /// An API server reached through `client` (a fake one: tests, benchmarks).
    pub fn fixed(client: Client, description: &str) -> Self {
        Self {
            how: How::Fixed(client),
            description: description.to_string(),
            may_verify_in_cluster_name: false,
            token: PathBuf::from(SERVICE_ACCOUNT_DIR).join("token"),
            ca: None,
        }
    }

    /// `https://10.0.0.1:6443 (LACE_APISERVER_ADDRESS (node.apiserverAddress))`.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Whether a certificate that does not name the address may be verified as
    /// `IN_CLUSTER_NAME` (see the module docs).
    pub fn may_verify_in_cluster_name(&self) -> bool {
        self.may_verify_in_cluster_name
    }

    /// A client; with `in_cluster_name`, one that verifies the certificate as
    /// `IN_CLUSTER_NAME`.
    pub fn client(&self, in_cluster_name: bool) -> Result<Client, ConnectError> {
        let config = match &self.how {
            How::Fixed(client) => return Ok(client.clone()),
            How::Config(config) => config,
        };
        // kube reads the token when the client is built; say which file is missing.
        std::fs::metadata(&self.token).map_err(|source| ConnectError::Token {
            path: self.token.clone(),
            source,
        })?;
        let mut config = (**config).clone();
        if in_cluster_name {
            config.tls_server_name = Some(IN_CLUSTER_NAME.to_string());
        }
        Client::try_from(config).map_err(|source| ConnectError::Client {
            address: self.description.clone(),
            source,
        })
    }
}

/// The DER certificates of a PEM bundle.
fn pem_certificates(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|c| c.as_ref().to_vec())
        .collect()
}

/// `err` and everything behind it: its sources, and the errors io errors wrap (which they
/// do not expose as sources; TLS failures come as io errors wrapping io errors wrapping the
/// rustls error).
fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        out.push(e);
        cur = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    out
}

/// The rustls error somewhere in `err`'s chain.
fn tls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    causes(err)
        .into_iter()
        .find_map(|e| e.downcast_ref::<rustls::Error>())
}

/// The innermost io error kind in `err`'s chain.
fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    causes(err)
        .into_iter()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
        .last()
}

/// Whether `err` is a certificate that does not name the host it was verified for.
pub fn is_name_mismatch(err: &kube::Error) -> bool {
    matches!(
        tls_error(err),
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. }
        ))
    )
}

/// `err` and its sources, each once (kube's messages repeat their source's).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.retain(|p| !text.contains(p.as_str()));
            parts.push(text);
        }
        cur = e.source();
    }
    parts.join(": ")
}

/// What `err` (from `what`, e.g. `list networks.lace.io`) means and what to check, naming
/// the API server.
pub fn explain(err: &kube::Error, what: &str, api: &ApiServer) -> String {
    let at = api.describe();
    if let kube::Error::Api(status) = err {
        let message = &status.message;
        return match status.code {
            401 => format!(
                "{what}: the API server at {at} rejected the service account token (401 \
                 Unauthorized: {message}); check that {} is this pod's current token (a token \
                 of a deleted ServiceAccount or of another cluster is rejected)",
                api.token.display()
            ),
            403 => format!(
                "{what}: forbidden (403) by the API server at {at}: {message}; the lace-node \
                 ClusterRole and ClusterRoleBinding of the lace-cni chart must grant it to the \
                 agent's service account"
            ),
            404 if what.contains(".lace.io") => format!(
                "{what}: the API server at {at} does not serve it (404: {message}); are Lace's \
                 CRDs installed (the lace-cni chart installs them)?"
            ),
            code => format!(
                "{what}: the API server at {at} answered {code} {}: {message}",
                status.reason
            ),
        };
    }
    if let Some(tls) = tls_error(err) {
        let hint = match tls {
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature,
            ) => format!(
                "the API server's certificate is not signed by the CA in {}: it must hold the \
                 cluster's CA",
                api.ca.as_deref().unwrap_or(Path::new("ca.crt")).display()
            ),
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            ) => format!(
                "the API server's certificate names neither the address nor {IN_CLUSTER_NAME}; \
                 set node.apiserverAddress to a name or IP the certificate holds"
            ),
            _ => "check node.apiserverAddress and the CA".to_string(),
        };
        return format!(
            "{what}: TLS with the API server at {at} failed: {}; {hint}",
            chain(err)
        );
    }
    let unreachable = matches!(
        io_kind(err),
        Some(
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable
                | std::io::ErrorKind::AddrNotAvailable
        )
    ) || matches!(err, kube::Error::HyperError(_) | kube::Error::Service(_));
    if unreachable {
        return format!(
            "{what}: cannot reach the API server at {at}: {}; check the address (the chart's \
             node.apiserverAddress, baked from the default/kubernetes EndpointSlice when empty), \
             that the API server listens there, and that this node can reach it",
            chain(err)
        );
    }
    format!("{what}: API server at {at}: {}", chain(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_address_or_missing_credentials_name_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let err = ApiServer::new(Some("10.0.0.1:x"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("LACE_APISERVER_ADDRESS") && err.contains("\"10.0.0.1:x\""),
            "{err}"
        );
        let err = ApiServer::new(Some("10.0.0.1:6443"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&dir.path().join("ca.crt").display().to_string()),
            "{err}"
        );
        assert!(err.contains("automountServiceAccountToken"), "{err}");
        std::fs::write(dir.path().join("ca.crt"), "not pem").unwrap();
        let err = ApiServer::new(Some("10.0.0.1:6443"), dir.path()).unwrap_err();
        assert!(matches!(err, ConnectError::CaEmpty { .. }), "{err}");
        // Without an address, the in-cluster variables (an IPv6 Service IP gets brackets).
        let none = (None, None);
        assert!(matches!(
            ApiServer::resolve(None, none, dir.path()),
            Err(ConnectError::NoAddress)
        ));
        let env = (Some("fd00:96::1".to_string()), Some("443".to_string()));
        let err = ApiServer::resolve(None, env, dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("ca.crt"), "{err}");
        // Plain HTTP (a local proxy) needs no CA; the token is still required.
        let api = ApiServer::new(Some("http://127.0.0.1:8001"), dir.path()).unwrap();
        assert_eq!(
            api.describe(),
            "http://127.0.0.1:8001 (LACE_APISERVER_ADDRESS (node.apiserverAddress))"
        );
        let err = api.client(false).err().unwrap().to_string();
        assert!(
            err.contains(&dir.path().join("token").display().to_string()),
            "{err}"
        );
    }
}
