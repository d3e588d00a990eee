//! The testkit's WAN emulator between two loopback sockets: an echo
//! server behind a relay that adds 2 ms of round trip, a client that
//! measures ten round trips through it.
//!
//!     cargo run -p unifab-testkit --example wan_echo
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use unifab_testkit::wan::{WanLink, WanProfile};

fn main() -> std::io::Result<()> {
    let echo = TcpListener::bind("127.0.0.1:0")?;
    let upstream = echo.local_addr()?;
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = echo.accept() {
            let mut b = [0u8; 64];
            while let Ok(n @ 1..) = s.read(&mut b) {
                if s.write_all(&b[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let rtt = Duration::from_millis(2);
    let link = WanLink::start(
        ([127, 0, 0, 1], 0).into(),
        upstream,
        WanProfile::rtt(rtt, 0),
    )?;
    let mut c = TcpStream::connect(link.addr())?;
    c.set_nodelay(true)?;
    let mut rtts = Vec::new();
    for i in 0..10u8 {
        let t = Instant::now();
        c.write_all(&[i; 64])?;
        let mut b = [0u8; 64];
        c.read_exact(&mut b)?;
        assert_eq!(b, [i; 64], "the relay delivers the bytes unchanged");
        rtts.push(t.elapsed());
    }
    rtts.sort();
    println!(
        "emulated RTT {rtt:?}: measured min {:?}, median {:?}, max {:?}; {} bytes forwarded",
        rtts[0],
        rtts[5],
        rtts[9],
        link.forwarded()
    );
    Ok(())
}
