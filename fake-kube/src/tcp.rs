//! The fake over TCP on loopback, plain HTTP or HTTPS: for the real binaries and for
//! benchmarks that keep the fake in another process (so its objects do not count in the
//! memory they measure). Such a process also takes objects on `POST /fake/put`, the one
//! path that is not the API server's.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::pki::{Pki, PkiError};
use crate::serve::control_put;
use crate::FakeApi;

/// How long a TLS handshake may take: connections are taken one at a time, and a client
/// that stalls must not stop the next.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// A fake being served; serving stops when this is dropped.
#[derive(Debug)]
pub struct Served {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts TCP connections and completes their TLS handshake; connections whose handshake
/// fails (a client that refuses the certificate) are dropped.
struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                // Out of file descriptors, say: give the system a moment.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, self.acceptor.accept(tcp)).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

impl FakeApi {
    /// The app: every client over TCP is one client of the fake.
    fn router(&self) -> Router {
        let service = self.service();
        let id = service.id();
        let api = self.clone();
        let control = self.clone();
        Router::new()
            .route(
                "/fake/put",
                post(move |body: axum::body::Bytes| async move {
                    control_put(&control, &body).map(Body::new)
                }),
            )
            .fallback(move |request: Request| async move {
                let response: Response = api.handle(id, request).await.map(Body::new);
                response
            })
    }

    /// Serves plain HTTP on a free port of 127.0.0.1.
    pub async fn serve(&self) -> std::io::Result<Served> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = self.router();
        let task = tokio::spawn(async move {
            // Serving only ends with an error of the listener, which `Served` cannot report.
            let _ = axum::serve(listener, router).await;
        });
        Ok(Served { addr, task })
    }

    /// Serves HTTPS with `pki`'s server certificate on a free port of 127.0.0.1.
    pub async fn serve_tls(&self, pki: &Pki) -> Result<Served, PkiError> {
        let tcp = TcpListener::bind("127.0.0.1:0").await?;
        let addr = tcp.local_addr()?;
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(pki.server_config()?),
        };
        let router = self.router();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Served { addr, task })
    }
}
