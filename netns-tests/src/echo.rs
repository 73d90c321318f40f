//! A TCP server that tells each client the address it came from, and its client: a check
//! that a connection carried data both ways, and of the source address the server saw (after
//! any NAT on the way). [`UdpEcho`] and [`ask_udp`] do the same with one datagram each way;
//! [`PeerEcho::start_sctp`] and [`ask_sctp`] over an SCTP association (a one-to-one socket, which
//! listens, accepts, reads and writes as a TCP one does).

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::Netns;

/// What a client sends before the server answers.
const REQUEST: &[u8] = b"ping\n";

/// Listens on one address in one namespace; answers each connection that sends [`REQUEST`]
/// with the client's address. Stops when dropped.
#[derive(Debug)]
pub struct PeerEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeerEcho {
    /// Starts listening on `bind` in `ns`; a client gets `patience` to send its request.
    pub fn start(ns: &Netns, bind: SocketAddr, patience: Duration) -> PeerEcho {
        let listener = ns
            .enter(|| TcpListener::bind(bind))
            .unwrap()
            .unwrap_or_else(|e| panic!("bind {bind} in {}: {e}", ns.name()));
        PeerEcho::serve(listener, bind, patience)
    }

    /// As [`PeerEcho::start`], over SCTP.
    pub fn start_sctp(ns: &Netns, bind: SocketAddr, patience: Duration) -> PeerEcho {
        let listener = ns
            .enter(|| {
                let socket = sctp_socket(bind)?;
                socket.set_reuse_address(true)?;
                socket.bind(&bind.into())?;
                socket.listen(64)?;
                Ok::<_, std::io::Error>(TcpListener::from(socket))
            })
            .unwrap()
            .unwrap_or_else(|e| panic!("bind SCTP {bind} in {}: {e}", ns.name()));
        PeerEcho::serve(listener, bind, patience)
    }

    fn serve(listener: TcpListener, bind: SocketAddr, patience: Duration) -> PeerEcho {
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    // One thread per connection: a client that never sends must not stall
                    // the others.
                    Ok((conn, peer)) => {
                        std::thread::spawn(move || {
                            let _ = answer(conn, peer, patience);
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => panic!("accept on {bind}: {e}"),
                }
            }
        });
        PeerEcho {
            stop,
            thread: Some(thread),
        }
    }
}

fn answer(conn: TcpStream, peer: SocketAddr, patience: Duration) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(patience))?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line)?;
    if line.as_bytes() == REQUEST {
        (&conn).write_all(format!("{}\n", peer.ip()).as_bytes())?;
    }
    Ok(())
}

impl Drop for PeerEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from `ns` to a [`PeerEcho`] at `server`, sends the request and reads the answer,
/// waiting up to `timeout` for each: the address the server saw, or what failed.
pub fn ask(ns: &Netns, server: SocketAddr, timeout: Duration) -> Result<IpAddr, String> {
    let client = ns
        .enter(|| TcpStream::connect_timeout(&server, timeout))
        .unwrap()
        .map_err(|e| format!("connect: {e}"))?;
    converse(client, timeout)
}

/// As [`ask`], over SCTP (the sctp module loads on the first SCTP socket of the kernel).
pub fn ask_sctp(ns: &Netns, server: SocketAddr, timeout: Duration) -> Result<IpAddr, String> {
    let client = ns
        .enter(|| sctp_socket(server))
        .unwrap()
        .map_err(|e| format!("SCTP socket (is the kernel's sctp module there?): {e}"))?;
    client
        .connect_timeout(&server.into(), timeout)
        .map_err(|e| format!("connect: {e}"))?;
    converse(TcpStream::from(client), timeout)
}

/// A one-to-one SCTP socket of `addr`'s family.
fn sctp_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    Socket::new(
        Domain::for_address(addr),
        Type::STREAM,
        Some(Protocol::from(nix::libc::IPPROTO_SCTP)),
    )
}

fn converse(client: TcpStream, timeout: Duration) -> Result<IpAddr, String> {
    client.set_read_timeout(Some(timeout)).unwrap();
    (&client)
        .write_all(REQUEST)
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    BufReader::new(&client)
        .read_line(&mut answer)
        .map_err(|e| format!("receive: {e}"))?;
    answer
        .trim()
        .parse()
        .map_err(|e| format!("answer {answer:?}: {e}"))
}

/// Answers each datagram [`REQUEST`] sent to one address in one namespace with the sender's
/// address. Stops when dropped.
#[derive(Debug)]
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    /// Starts answering on `bind` in `ns`.
    pub fn start(ns: &Netns, bind: SocketAddr) -> UdpEcho {
        let socket = ns
            .enter(|| UdpSocket::bind(bind))
            .unwrap()
            .unwrap_or_else(|e| panic!("bind UDP {bind} in {}: {e}", ns.name()));
        // Wakes up now and then to see whether it is to stop.
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stopped.load(Ordering::Relaxed) {
                match socket.recv_from(&mut buf) {
                    Ok((n, peer)) if &buf[..n] == REQUEST => {
                        let _ = socket.send_to(format!("{}\n", peer.ip()).as_bytes(), peer);
                    }
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => panic!("recv on UDP {bind}: {e}"),
                }
            }
        });
        UdpEcho {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends [`REQUEST`] from `ns` to a [`UdpEcho`] at `server` and waits up to `timeout` for the
/// answer: the address the server saw, or what failed.
pub fn ask_udp(ns: &Netns, server: SocketAddr, timeout: Duration) -> Result<IpAddr, String> {
    let any: IpAddr = if server.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        Ipv6Addr::UNSPECIFIED.into()
    };
    let socket = ns
        .enter(|| UdpSocket::bind((any, 0)))
        .unwrap()
        .map_err(|e| format!("bind: {e}"))?;
    socket
        .connect(server)
        .map_err(|e| format!("connect: {e}"))?;
    socket.set_read_timeout(Some(timeout)).unwrap();
    socket.send(REQUEST).map_err(|e| format!("send: {e}"))?;
    let mut buf = [0u8; 64];
    let n = socket.recv(&mut buf).map_err(|e| format!("receive: {e}"))?;
    let answer = String::from_utf8_lossy(&buf[..n]);
    answer
        .trim()
        .parse()
        .map_err(|e| format!("answer {answer:?}: {e}"))
}
