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
    /// Relayed connections not yet closed at both ends.
    live: AtomicU64,
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
            live: AtomicU64::new(0),
            free_at: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
        });
        let sh = shared.clone();
        l.set_nonblocking(true)?;
        thread::spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((down, _)) => {
                        let sh = sh.clone();
                        sh.live.fetch_add(1, Ordering::SeqCst);
                        thread::spawn(move || {
                            serve(down, upstream, &sh);
                            sh.live.fetch_sub(1, Ordering::SeqCst);
                        });
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

    /// Connections accepted and not yet closed by both ends: once it is
    /// 0, nothing more crosses until an endpoint connects again, so a
    /// test can read [`WanLink::forwarded`] as final.
    pub fn connections(&self) -> u64 {
        self.shared.live.load(Ordering::SeqCst)
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

fn serve(down: TcpStream, upstream: SocketAddr, sh: &Arc<Shared>) {
    // A SYN into a black hole goes nowhere: connect once the cut is over.
    if !wait_while_cut(sh) {
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
    let other = thread::spawn(move || pipe(down, up, s1, 0));
    pipe(u2, d2, sh.clone(), 1);
    let _ = other.join();
}

/// Bytes and the instant they are due at the far end.
type Chunk = (Instant, Vec<u8>);

/// The largest piece serialised at once, so a cut stops a burst mid-way.
const PIECE: usize = 16 * 1024;

/// Pieces queued on the emulated link per direction: with 16 KiB pieces,
/// at most 1 MiB waits to be serialised (a router's buffer); beyond it the
/// reader stops and the sender's TCP backs up.
const QUEUE: usize = 64;

/// When a piece of `len` bytes read at `read_at` finishes crossing the
/// link: it starts when both it and the link are ready (`free`, advanced
/// here), then takes `len / rate`.
///
/// The link's clock is logical: a piece that is ready while the link is
/// still busy starts at the instant the link frees up, not at whatever
/// instant the relay's thread wakes after sleeping. Wall-clock starts would
/// lose every sleep's overshoot as idle link time (on a loaded host, tens
/// of µs per 16 KiB, which is 262 µs at 500 Mb/s: a 40 % loss).
fn serialise(free: &mut Instant, read_at: Instant, len: usize, rate: u64) -> Instant {
    if rate == 0 {
        return read_at;
    }
    let start = (*free).max(read_at);
    *free = start + Duration::from_secs_f64(len as f64 / rate as f64);
    *free
}

/// Forwards `from` → `to` through the emulated link: serialisation at the
/// rate, then the one-way delay and jitter.
fn pipe(mut from: TcpStream, to: TcpStream, sh: Arc<Shared>, dir: usize) {
    // Bounded: a full link stops the reader, so the sender's TCP backs up.
    let (tx, rx): (SyncSender<Chunk>, Receiver<Chunk>) = sync_channel(QUEUE);
    let sh2 = sh.clone();
    // Pieces handed to the delivery thread and not yet written.
    let queued = Arc::new(AtomicU64::new(0));
    let q2 = queued.clone();
    let Ok(mut direct) = to.try_clone() else {
        return;
    };
    let writer = thread::spawn(move || deliver(to, rx, sh2, q2));
    precise_timers();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_due = Instant::now();
    let mut seed = (dir as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ Instant::now().elapsed().as_nanos() as u64;
    'read: loop {
        if !wait_while_cut(&sh) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let read_at = Instant::now();
        let p = sh.profile.lock().map(|g| *g).unwrap_or(WanProfile::lan());
        let bare = p.rate == 0 && p.delay.is_zero() && p.jitter.is_zero();
        for piece in buf[..n].chunks(PIECE) {
            let done = match sh.free_at[dir].lock() {
                Ok(mut free) => serialise(&mut free, read_at, piece.len(), p.rate),
                Err(_) => break 'read,
            };
            let mut due = done + p.delay;
            if !p.jitter.is_zero() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                due += p.jitter.mul_f64((seed % 1_000_000) as f64 / 1_000_000.0);
            }
            // Order is kept: jitter never lets a piece overtake another.
            due = due.max(last_due);
            last_due = due;
            // A link with no delay, jitter or rate limit: a piece with
            // nothing ahead of it is written by this thread at once. A
            // hand-off to the delivery thread is a wake-up (a context
            // switch, 10–50 µs here) that a real path does not have. With a
            // delay the hand-off happens within the delay (the due time
            // counts from the read), so it costs nothing there; with a rate
            // or pieces queued, the delivery thread keeps order and pace.
            if bare && queued.load(Ordering::SeqCst) == 0 {
                if !wait_while_cut(&sh) || !forward(&mut direct, piece, &sh) {
                    break 'read;
                }
                continue;
            }
            queued.fetch_add(1, Ordering::SeqCst);
            if tx.send((due, piece.to_vec())).is_err() {
                break 'read;
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}

/// The last stretch before a due instant is waited out by yielding, not
/// sleeping: a sleep wakes late by the timer slack plus the scheduler's
/// wake-up latency (50–150 µs on a loaded VM), which would add itself to
/// every emulated delay.
const SPIN: Duration = Duration::from_micros(60);

/// A thread's sleeps end up to 50 µs late by default (timer slack); the
/// delay line wants them on time.
fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK only changes the calling thread's slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64);
    }
}

/// Writes a piece on and counts it; false when the far end is gone.
fn forward(to: &mut TcpStream, piece: &[u8], sh: &Shared) -> bool {
    if to.write_all(piece).is_err() {
        return false;
    }
    sh.forwarded
        .fetch_add(piece.len() as u64, Ordering::Relaxed);
    true
}

/// Waits until `due` with an error of a few µs rather than a sleep's.
fn wait_until(due: Instant) {
    let now = Instant::now();
    if due <= now {
        return;
    }
    if due - now > SPIN {
        thread::sleep(due - now - SPIN);
    }
    while Instant::now() < due {
        thread::yield_now();
    }
}

/// Writes each piece to `to` once it is due (and the link is not cut).
fn deliver(mut to: TcpStream, rx: Receiver<Chunk>, sh: Arc<Shared>, queued: Arc<AtomicU64>) {
    precise_timers();
    while let Ok((due, data)) = rx.recv() {
        wait_until(due);
        if !wait_while_cut(&sh) {
            return;
        }
        if !forward(&mut to, &data, &sh) {
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        queued.fetch_sub(1, Ordering::SeqCst);
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
    fn serialisation_keeps_the_link_busy_whatever_the_wake_ups() {
        let t0 = Instant::now();
        let rate = 1_000_000; // 1 MB/s: 1,000 bytes take 1 ms
        let mut free = t0;
        // Ready at once, back to back: each starts where the last ended.
        assert_eq!(
            serialise(&mut free, t0, 1000, rate),
            t0 + Duration::from_millis(1)
        );
        // Read late (the relay overslept) but ready while the link was
        // busy: it still starts when the link freed up, losing nothing.
        let late = t0 + Duration::from_micros(500);
        assert_eq!(
            serialise(&mut free, late, 1000, rate),
            t0 + Duration::from_millis(2)
        );
        // Ready after the link went idle: the idle time is really lost.
        let idle = t0 + Duration::from_millis(5);
        assert_eq!(
            serialise(&mut free, idle, 500, rate),
            idle + Duration::from_micros(500)
        );
        assert_eq!(free, idle + Duration::from_micros(500));
        // No limit: due when read.
        let mut f2 = t0;
        assert_eq!(serialise(&mut f2, idle, 1 << 20, 0), idle);
        assert_eq!(f2, t0);
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
        // The relay counts a piece once its write returned, which can be
        // just after the client already read the echo.
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.forwarded() < 20 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(link.forwarded(), 20);
    }
}
