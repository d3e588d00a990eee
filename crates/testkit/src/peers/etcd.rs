//! A one-member etcd (Debian `etcd-server`, 3.4) in a temporary
//! directory on loopback, for the gateway's cluster tests.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::PeerError;
use super::net::free_tcp_ports;
use super::process::{KillOnDrop, find_program, log_tail};

/// How long etcd may take to answer `/health` (it is healthy in about
/// 0.3 s here).
const READY_WITHIN: Duration = Duration::from_secs(15);

/// Starts of etcd tried when its ports were taken before it bound them.
const START_ATTEMPTS: u32 = 5;

/// A running etcd, killed and its data removed on drop.
#[derive(Debug)]
pub struct Etcd {
    child: KillOnDrop,
    client: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd on free loopback ports and waits until it is healthy.
    ///
    /// The two ports are picked with both probe sockets open, so they
    /// differ (two picks in a row can return the same port, and etcd then
    /// collides with itself). Another process can still take a port
    /// between the pick and etcd's bind: a start that fails with
    /// "address already in use" is tried again on new ports, five times
    /// at most.
    pub fn start() -> Result<Etcd, PeerError> {
        let mut attempt = 1;
        loop {
            match Etcd::start_once() {
                Err(PeerError::Exited { log, .. })
                    if attempt < START_ATTEMPTS && log.contains("address already in use") =>
                {
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    fn start_once() -> Result<Etcd, PeerError> {
        let etcd = find_program("etcd", "etcd-server")?;
        let dir = tempfile::tempdir().map_err(|e| PeerError::io("etcd temp dir", e))?;
        let [client, peer] =
            free_tcp_ports::<2>()?.map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p)));
        let log = dir.path().join("etcd.log");
        let child = Command::new(&etcd)
            .arg("--name=t")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls=http://{client}"))
            .arg(format!("--advertise-client-urls=http://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=t=http://{peer}"))
            // `--log-outputs` takes a file only with the zap logger.
            .arg("--logger=zap")
            .arg(format!("--log-outputs={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| PeerError::Spawn {
                program: "etcd".into(),
                source,
            })?;
        let mut e = Etcd {
            child: KillOnDrop(child),
            client,
            log,
            _dir: dir,
        };
        e.wait_healthy()?;
        Ok(e)
    }

    fn wait_healthy(&mut self) -> Result<(), PeerError> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.exited() {
                return Err(PeerError::Exited {
                    program: "etcd".into(),
                    status,
                    log: log_tail(&self.log, 30),
                });
            }
            if health(self.client) {
                return Ok(());
            }
            if start.elapsed() > READY_WITHIN {
                return Err(PeerError::NotReady {
                    program: "etcd".into(),
                    waited: READY_WITHIN,
                    reason: format!("GET http://{}/health", self.client),
                    log: log_tail(&self.log, 30),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        self.client
    }

    /// The process id (to stop it with SIGSTOP, say).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

/// `GET /health` answers `"health":"true"` within a second.
fn health(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]
    use super::*;

    #[test]
    fn starts_healthy_and_is_gone_after_drop() {
        let e = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
        assert!(health(e.addr()));
        let addr = e.addr();
        drop(e);
        assert!(!health(addr), "killed with its handle");
    }
}
