//! A byte relay between TCP connections: the cheapest thing any userspace
//! gateway could do with a host's iSCSI connection. It does not parse a
//! PDU. Each accepted connection gets its own connection to the upstream
//! target, and each direction its own blocking thread:
//!
//! - `copy`: `read` into a 256 KiB buffer and `write` it out, as any
//!   relay that looks at the bytes must (one receive and one send copy);
//! - `splice`: `splice(2)` from the socket into a pipe and from the pipe
//!   to the other socket, so the payload pages are not copied in user space
//!   at all (the kernel still copies on the final receive).
//!
//! `benches/peers/bridge.sh` (with `RELAY=1`) measures both beside the
//! real bridge: the ratio a relay reaches to the target direct is an upper
//! bound for any bridge on the same machine, since a bridge does what the
//! relay does and more (it parses every PDU and runs a SCSI task set).
//!
//!     relay copy|splice LISTEN_ADDR UPSTREAM_ADDR
//!
//! Not a product: a measuring tool. It stops on the first error of a
//! connection and closes both ends.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Copy,
    Splice,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: relay copy|splice LISTEN_ADDR UPSTREAM_ADDR";
    if args.len() != 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let mode = match args[1].as_str() {
        "copy" => Mode::Copy,
        "splice" => Mode::Splice,
        other => {
            eprintln!("unknown mode {other:?}; {usage}");
            std::process::exit(2);
        }
    };
    let addr = |i: usize, what: &str| {
        args[i].parse::<SocketAddr>().unwrap_or_else(|e| {
            eprintln!("{what} {:?} is not host:port ({e}); {usage}", args[i]);
            std::process::exit(2);
        })
    };
    let listen = addr(2, "LISTEN_ADDR");
    let upstream = addr(3, "UPSTREAM_ADDR");
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| {
        eprintln!("cannot listen on {listen}: {e}");
        std::process::exit(1);
    });
    for conn in listener.incoming() {
        let host = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        thread::spawn(move || {
            if let Err(e) = serve(mode, host, upstream) {
                eprintln!("connection ends: {e}");
            }
        });
    }
}

fn serve(mode: Mode, host: TcpStream, upstream: SocketAddr) -> io::Result<()> {
    let target = TcpStream::connect(upstream)?;
    // The peers' own PDUs decide the segments; the relay adds no delay.
    host.set_nodelay(true)?;
    target.set_nodelay(true)?;
    let (h2, t2) = (host.try_clone()?, target.try_clone()?);
    let up = thread::spawn(move || pump(mode, h2, t2));
    let down = pump(mode, target.try_clone()?, host.try_clone()?);
    // One direction ended: end the other.
    let _ = host.shutdown(Shutdown::Both);
    let _ = target.shutdown(Shutdown::Both);
    let up = up
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("thread panicked")));
    down.and(up)
}

fn pump(mode: Mode, from: TcpStream, to: TcpStream) -> io::Result<()> {
    let r = match mode {
        Mode::Copy => pump_copy(&from, &to),
        Mode::Splice => pump_splice(&from, &to),
    };
    let _ = to.shutdown(Shutdown::Write);
    r
}

fn pump_copy(mut from: &TcpStream, mut to: &TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

const PIPE_SIZE: libc::c_int = 1 << 20;

fn pump_splice(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A bigger pipe moves more per call; the default (64 KiB) still works.
    // SAFETY: F_SETPIPE_SZ on a pipe we own.
    unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE) };
    loop {
        let n = splice(from.as_raw_fd(), wr.as_raw_fd(), PIPE_SIZE as usize)?;
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            let m = splice(rd.as_raw_fd(), to.as_raw_fd(), left)?;
            if m == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left -= m;
        }
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: plain descriptors and null offsets (both ends are a
        // socket or a pipe); the kernel checks the descriptors.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// An upstream that answers every byte with its complement, so a relay
    /// that loses, reorders or mixes up the directions shows.
    fn upstream() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 65536];
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                buf[..n].iter_mut().for_each(|b| *b = !*b);
                s.write_all(&buf[..n]).unwrap();
            }
        });
        addr
    }

    fn relays_both_ways(mode: Mode) {
        let up = upstream();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let relay = thread::spawn(move || {
            let (host, _) = l.accept().unwrap();
            serve(mode, host, up)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let sent: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut w = c.try_clone().unwrap();
        let data = sent.clone();
        let writer = thread::spawn(move || {
            w.write_all(&data).unwrap();
            w.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        writer.join().unwrap();
        relay.join().unwrap().unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got.iter().zip(&sent).all(|(g, s)| *g == !*s));
    }

    #[test]
    fn the_copy_relay_moves_every_byte_both_ways_in_order() {
        relays_both_ways(Mode::Copy);
    }

    #[test]
    fn the_splice_relay_moves_every_byte_both_ways_in_order() {
        relays_both_ways(Mode::Splice);
    }
}
