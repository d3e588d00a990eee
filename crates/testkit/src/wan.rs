//! A WAN emulator for FCIP tests and benchmarks (there is no netem on
//! these machines): a TCP relay per circuit that adds a one-way delay,
//! jitter and a rate limit in each direction, and that can be cut.
//!
//! A cut is a black hole, not a reset: nothing is forwarded in either
//! direction, connections stay open, new connections are accepted but not
//! connected onwards, so the endpoints only notice by silence (their
//! keep-alives), exactly as with a dead WAN path. Bytes are held, never
//! dropped (TCP would retransmit them across a real black hole), so a
//! connection that outlives the cut carries on intact.
//!
//! The relay is plain threads and blocking sockets; it listens wherever it
//! is told, so it runs inside one network namespace or, started in the
//! root namespace, between two (see [`Netns`]).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Link characteristics, per direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WanProfile {
    /// One-way delay (half the emulated RTT).
    pub delay: Duration,
    /// Uniform random extra delay in `[0, jitter)` (order is kept).
    pub jitter: Duration,
    /// Bytes per second; 0 = unlimited.
    pub rate: u64,
}

impl WanProfile {
    /// No delay, no limit.
    pub const fn lan() -> WanProfile {
        WanProfile {
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            rate: 0,
        }
    }

    /// A link with round trip time `rtt` and `rate` bytes/s per direction.
    pub fn rtt(rtt: Duration, rate: u64) -> WanProfile {
        WanProfile {
            delay: rtt / 2,
            jitter: Duration::ZERO,
            rate,
        }
    }
}

#[derive(Debug)]
struct Shared {
    profile: Mutex<WanProfile>,
    cut: AtomicBool,
    stop: AtomicBool,
    /// Bytes forwarded, each direction summed.
    forwarded: AtomicU64,
    /// Token-bucket clocks per direction: when the link is next free.
    free_at: [Mutex<Instant>; 2],
}

/// One emulated circuit: listens on `listen`, relays to `upstream`.
#[derive(Debug)]
pub struct WanLink {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

impl WanLink {
    /// Starts a relay listening on `listen` (port 0 picks one) towards
    /// `upstream`.
    pub fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        profile: WanProfile,
    ) -> std::io::Result<WanLink> {
        let l = TcpListener::bind(listen)?;
        let addr = l.local_addr()?;
        let shared = Arc::new(Shared {
            profile: Mutex::new(profile),
            cut: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            forwarded: AtomicU64::new(0),
            free_at: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
        });
        let sh = shared.clone();
        l.set_nonblocking(true)?;
        thread::spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((down, _)) => {
                        let sh = sh.clone();
                        thread::spawn(move || serve(down, upstream, sh));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(WanLink { shared, addr })
    }

    /// Where endpoints connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Black-holes the circuit (`true`) or restores it.
    pub fn set_cut(&self, cut: bool) {
        self.shared.cut.store(cut, Ordering::SeqCst);
    }

    /// Changes delay, jitter and rate for what is forwarded from now on.
    pub fn set_profile(&self, p: WanProfile) {
        if let Ok(mut g) = self.shared.profile.lock() {
            *g = p;
        }
    }

    /// Bytes forwarded so far (both directions).
    pub fn forwarded(&self) -> u64 {
        self.shared.forwarded.load(Ordering::Relaxed)
    }
}

impl Drop for WanLink {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

fn wait_while_cut(sh: &Shared) -> bool {
    while sh.cut.load(Ordering::SeqCst) {
        if sh.stop.load(Ordering::Relaxed) {
            return false;
        }
        thread::sleep(Duration::from_millis(1));
    }
    !sh.stop.load(Ordering::Relaxed)
}

fn serve(down: TcpStream, upstream: SocketAddr, sh: Arc<Shared>) {
    // A SYN into a black hole goes nowhere: connect once the cut is over.
    if !wait_while_cut(&sh) {
        return;
    }
    let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        let _ = down.shutdown(Shutdown::Both);
        return;
    };
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (Ok(d2), Ok(u2)) = (down.try_clone(), up.try_clone()) else {
        return;
    };
    let s1 = sh.clone();
    thread::spawn(move || pipe(down, up, s1, 0));
    pipe(u2, d2, sh, 1);
}

/// Bytes and the instant they are due at the far end.
type Chunk = (Instant, Vec<u8>);

/// Forwards `from` → `to` through a delay line.
fn pipe(mut from: TcpStream, to: TcpStream, sh: Arc<Shared>, dir: usize) {
    // Bounded: a full line stops the reader, so the sender's TCP backs up.
    let (tx, rx): (SyncSender<Chunk>, Receiver<Chunk>) = sync_channel(256);
    let sh2 = sh.clone();
    let writer = thread::spawn(move || deliver(to, rx, sh2, dir));
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_due = Instant::now();
    let mut seed = (dir as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ Instant::now().elapsed().as_nanos() as u64;
    loop {
        if !wait_while_cut(&sh) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let p = sh.profile.lock().map(|g| *g).unwrap_or(WanProfile::lan());
        let mut due = Instant::now() + p.delay;
        if !p.jitter.is_zero() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            due += p.jitter.mul_f64((seed % 1_000_000) as f64 / 1_000_000.0);
        }
        due = due.max(last_due);
        last_due = due;
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}

fn deliver(mut to: TcpStream, rx: Receiver<Chunk>, sh: Arc<Shared>, dir: usize) {
    while let Ok((due, data)) = rx.recv() {
        let now = Instant::now();
        if due > now {
            thread::sleep(due - now);
        }
        let rate = sh.profile.lock().map(|g| g.rate).unwrap_or(0);
        // Serialisation at the link rate, in chunks so a cut stops mid-way.
        for chunk in data.chunks(16 * 1024) {
            if !wait_while_cut(&sh) {
                return;
            }
            if rate > 0 {
                let wait = {
                    let Ok(mut free) = sh.free_at[dir].lock() else {
                        return;
                    };
                    let start = (*free).max(Instant::now());
                    *free = start + Duration::from_secs_f64(chunk.len() as f64 / rate as f64);
                    *free
                };
                let now = Instant::now();
                if wait > now {
                    thread::sleep(wait - now);
                }
            }
            if to.write_all(chunk).is_err() {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
            sh.forwarded
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A network namespace joined to the root namespace by a veth pair
/// (`10.<net>.<idx>.1` in the root, `.2` inside), removed on drop. Needs
/// root (CI runs as root).
#[derive(Debug)]
pub struct Netns {
    /// Name.
    pub name: String,
    /// The address inside.
    pub inside: std::net::Ipv4Addr,
    /// The root side's address.
    pub outside: std::net::Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// Creates namespace `name` with the veth pair on subnet `10.net.idx.0/24`.
    pub fn create(name: &str, net: u8, idx: u8) -> Result<Netns, String> {
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        let outside = std::net::Ipv4Addr::new(10, net, idx, 1);
        let inside = std::net::Ipv4Addr::new(10, net, idx, 2);
        // From here on, a step that fails drops `ns`, which removes the
        // namespace and the veth pair again.
        let ns = Netns {
            name: name.to_string(),
            inside,
            outside,
        };
        let host = format!("{name}-h");
        let peer = format!("{name}-n");
        let _ = ip(&["link", "del", &host]);
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", name])?;
        ip(&["addr", "add", &format!("{outside}/24"), "dev", &host])?;
        ip(&["link", "set", &host, "up"])?;
        ip(&[
            "-n",
            name,
            "addr",
            "add",
            &format!("{inside}/24"),
            "dev",
            &peer,
        ])?;
        ip(&["-n", name, "link", "set", &peer, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        ip(&[
            "-n",
            name,
            "route",
            "add",
            "default",
            "via",
            &outside.to_string(),
        ])?;
        Ok(ns)
    }

    /// A command run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &format!("{}-h", self.name)]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        thread::spawn(move || {
            for s in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let mut w = s;
                    let _ = std::io::copy(&mut r, &mut w);
                });
            }
        });
        a
    }

    #[test]
    fn relays_and_holds_across_a_cut() {
        let up = echo_server();
        let link = WanLink::start("127.0.0.1:0".parse().unwrap(), up, WanProfile::lan()).unwrap();
        let mut c = TcpStream::connect(link.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"hello");
        link.set_cut(true);
        c.write_all(b"world").unwrap();
        // Silence: no reset, no data.
        let e = c.read(&mut b).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        link.set_cut(false);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"world", "held bytes arrive after the cut");
        assert_eq!(link.forwarded(), 20);
    }
}
