//! A TCP relay that tests put between an initiator and a target to inject
//! faults: cut every connection (a TCP drop), freeze forwarding (a peer that
//! stops answering, as after SIGSTOP, with the sockets still open), refuse
//! new connections (a dead process), and move to another upstream (a target
//! restarted on another port).
//!
//! Plain threads and blocking sockets, so synchronous and async tests alike
//! can use it.
//!
//! ```no_run
//! use unifab_testkit::relay::TcpRelay;
//! let upstream: std::net::SocketAddr = "127.0.0.1:3260".parse()?;
//! let relay = TcpRelay::start(upstream)?;
//! println!("connect to {}", relay.addr());
//! relay.cut(); // every connection through it drops now
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

#[derive(Debug)]
struct Inner {
    upstream: Mutex<SocketAddr>,
    active: Mutex<Vec<TcpStream>>,
    frozen: AtomicBool,
    refusing: AtomicBool,
    stopped: AtomicBool,
    accepted: AtomicU64,
}

impl Inner {
    fn cut_all(&self) {
        let mut a = self.active.lock().unwrap_or_else(|p| p.into_inner());
        for s in a.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// A running relay; stops (and cuts everything) when dropped.
#[derive(Debug)]
pub struct TcpRelay {
    addr: SocketAddr,
    inner: Arc<Inner>,
}

impl TcpRelay {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<TcpRelay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            upstream: Mutex::new(upstream),
            active: Mutex::new(Vec::new()),
            frozen: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
        });
        let i = inner.clone();
        thread::spawn(move || accept_loop(listener, i));
        Ok(TcpRelay { addr, inner })
    }

    /// Where initiators connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::Relaxed)
    }

    /// Forward new connections to `upstream` from now on.
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *self
            .inner
            .upstream
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = upstream;
    }

    /// Drops every connection through the relay (both sides see the close).
    pub fn cut(&self) {
        self.inner.cut_all();
    }

    /// Stops forwarding in both directions, keeping the connections open;
    /// new connections are accepted and held the same way.
    pub fn freeze(&self) {
        self.inner.frozen.store(true, Ordering::SeqCst);
    }

    /// Forwards again what was held.
    pub fn thaw(&self) {
        self.inner.frozen.store(false, Ordering::SeqCst);
    }

    /// While set, new connections are closed at once (as if nothing
    /// listened); existing ones are not touched.
    pub fn refuse(&self, refuse: bool) {
        self.inner.refusing.store(refuse, Ordering::SeqCst);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        self.inner.frozen.store(false, Ordering::SeqCst);
        // Unblock accept().
        let _ = TcpStream::connect(self.addr);
        self.inner.cut_all();
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        if inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = conn else {
            continue;
        };
        inner.accepted.fetch_add(1, Ordering::Relaxed);
        if inner.refusing.load(Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let i = inner.clone();
        thread::spawn(move || serve(client, i));
    }
}

fn serve(client: TcpStream, inner: Arc<Inner>) {
    let _ = client.set_nodelay(true);
    // A frozen peer accepts but does not answer: hold the client.
    while inner.frozen.load(Ordering::SeqCst) && !inner.stopped.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(10));
    }
    let up = *inner.upstream.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(server) = TcpStream::connect(up) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = server.set_nodelay(true);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut a = inner.active.lock().unwrap_or_else(|p| p.into_inner());
        if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
            a.push(c3);
            a.push(s3);
        }
    }
    let i2 = inner.clone();
    let t = thread::spawn(move || pump(c2, s2, i2));
    pump(server, client, inner);
    let _ = t.join();
}

/// Copies `from` → `to` until either side closes; holds data while frozen.
fn pump(mut from: TcpStream, mut to: TcpStream, inner: Arc<Inner>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while inner.frozen.load(Ordering::SeqCst) && !inner.stopped.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                thread::spawn(move || {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = c.read(&mut b) {
                        if n == 0 || c.write_all(&b[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        a
    }

    #[test]
    fn forwards_cuts_and_refuses() {
        let relay = TcpRelay::start(echo_server()).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        relay.cut();
        let mut rest = Vec::new();
        // The cut connection ends: EOF or reset.
        let r = c.read_to_end(&mut rest);
        assert!(r.is_err() || rest.is_empty());
        relay.refuse(true);
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
        relay.refuse(false);
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.write_all(b"x").unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        assert_eq!(relay.accepted(), 3);
    }

    #[test]
    fn freeze_holds_data_until_thaw() {
        let relay = TcpRelay::start(echo_server()).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.write_all(b"a").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        relay.freeze();
        c.write_all(b"b").unwrap();
        c.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        assert!(c.read(&mut b).is_err(), "nothing comes back while frozen");
        relay.thaw();
        c.set_read_timeout(None).unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"b");
    }
}
