//! AF_PACKET through pnet.
//!
//! The socket is created here so that a classic BPF filter can be
//! attached before pnet binds it: the kernel then queues only FCoE and
//! FIP frames (tagged or not) that the host did not send itself, and
//! everything else on the interface (IP, ARP) costs the socket nothing.
//! A thread blocks in pnet's receiver and hands batches of frames to the
//! driver through a bounded channel (one copy, out of the socket);
//! transmission writes each frame into a reused buffer and sends it.
//! The socket's buffers are sized for eight 1 MiB reads in flight; a frame
//! the kernel still drops (buffer full) is counted from the socket's
//! `PACKET_STATISTICS` and logged as "AF_PACKET receive drops".
//!
//! The kernel removes an 802.1Q tag before an AF_PACKET socket sees the
//! frame (the tag travels beside it, in the packet's auxiliary data,
//! which pnet does not read), so a frame received here is untagged even
//! if it was tagged on the wire; the state machines accept untagged
//! frames as belonging to their VLAN. Transmitted frames keep their
//! software tag.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use pnet_datalink::{Channel, Config, DataLinkSender};
use tokio::sync::mpsc;

use super::{EthLink, EthRx, EthTx, LinkFuture, wire_err};
use crate::wire::{MacAddr, WireError};

/// Frames waiting between the receive thread and the driver.
const QUEUE: usize = 16_384;
/// Frames the receive thread hands over at once at most.
const BATCH: usize = 64;

/// Classic BPF: accept FCoE/FIP frames (one tag or none) not sent by us.
fn filter() -> [libc::sock_filter; 11] {
    const SKF_AD_OFF: u32 = (-0x1000i32) as u32;
    const SKF_AD_PKTTYPE: u32 = 4;
    const PACKET_OUTGOING: u32 = 4;
    let ins = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ld_w_abs = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let ld_h_abs = libc::BPF_LD | libc::BPF_H | libc::BPF_ABS;
    let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
    let ret = libc::BPF_RET | libc::BPF_K;
    [
        ins(ld_w_abs, 0, 0, SKF_AD_OFF + SKF_AD_PKTTYPE), // 0
        ins(jeq, 7, 0, PACKET_OUTGOING),                  // 1 → 9
        ins(ld_h_abs, 0, 0, 12),                          // 2
        ins(jeq, 6, 0, 0x8906),                           // 3 → 10
        ins(jeq, 5, 0, 0x8914),                           // 4 → 10
        ins(jeq, 0, 3, 0x8100),                           // 5 → 6 / 9
        ins(ld_h_abs, 0, 0, 16),                          // 6
        ins(jeq, 2, 0, 0x8906),                           // 7 → 10
        ins(jeq, 1, 0, 0x8914),                           // 8 → 10 / 9
        ins(ret, 0, 0, 0),                                // 9 reject
        ins(ret, 0, 0, 0xffff),                           // 10 accept
    ]
}

fn open_socket() -> io::Result<i32> {
    let proto = (libc::ETH_P_ALL as u16).to_be() as i32;
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let prog = filter();
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    let big: libc::c_int = 8 << 20;
    // SAFETY: setsockopt with correctly sized option values that outlive
    // the calls; the fd is ours.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing the fd we opened.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    // FCoE assumes a lossless link: a frame the socket drops fails its
    // whole exchange. A 1 MiB read is 512 frames, eight in flight 4,096
    // (about 20 MiB of socket memory on veth), so the buffers are sized
    // past that: forced past net.core.{r,w}mem_max where the process may
    // (CAP_NET_ADMIN), else as large as the limits allow.
    let forced: libc::c_int = 64 << 20;
    for (force, opt) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let set = |name: libc::c_int, value: &libc::c_int| {
            // SAFETY: as above; failure only leaves the previous size.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    name,
                    (value as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if set(force, &forced) != 0 {
            set(opt, &big);
        }
    }
    Ok(fd)
}

/// Opens `interface` (promiscuous, FCoE and FIP only).
pub fn open(interface: &str) -> io::Result<EthLink> {
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == interface)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {interface:?}"),
            )
        })?;
    let mac = iface
        .mac
        .map(|m| MacAddr(m.octets()))
        .unwrap_or(MacAddr::ZERO);
    let fd = open_socket()?;
    let cfg = Config {
        read_buffer_size: 65_536,
        write_buffer_size: 65_536,
        read_timeout: Some(Duration::from_millis(200)),
        promiscuous: true,
        socket_fd: Some(fd),
        ..Config::default()
    };
    let (tx, mut rx) = match pnet_datalink::channel(&iface, cfg)? {
        Channel::Ethernet(tx, rx) => (tx, rx),
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "not an Ethernet channel",
            ));
        }
    };
    let (qtx, qrx) = mpsc::channel::<Vec<Bytes>>(QUEUE / BATCH);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let name = format!("af_packet:{interface}");
    std::thread::Builder::new()
        .name(format!("rx-{interface}"))
        .spawn(move || {
            let mut batch = Vec::with_capacity(BATCH);
            let mut drops = Drops::default();
            while !stop2.load(Ordering::Relaxed) {
                match rx.next() {
                    Ok(f) => {
                        drops.frames += 1;
                        if drops.frames >= STATS_EVERY_FRAMES {
                            drops.check(fd);
                        }
                        if super::is_fcoe_or_fip(f) {
                            batch.push(Bytes::copy_from_slice(f));
                        }
                        // Hand over when the batch is full, or at once
                        // when the driver has taken everything before.
                        // (If the driver is busy, more frames may join
                        // the batch, as long as the socket has them now.)
                        if batch.len() >= BATCH
                            || qtx.capacity() == qtx.max_capacity()
                            || !readable_now(fd)
                        {
                            let b = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                            if !b.is_empty() && qtx.blocking_send(b).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        drops.check(fd);
                        if qtx.is_closed() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "AF_PACKET receive failed");
                        return;
                    }
                }
            }
        })?;
    Ok(EthLink {
        rx: Box::new(PacketRx {
            rx: qrx,
            _stop: StopOnDrop(stop),
        }),
        tx: Box::new(PacketTx {
            tx,
            buf: Vec::with_capacity(4096),
        }),
        mac,
        name,
    })
}

/// Frames between two reads of the socket's drop counter under load (it
/// is also read whenever the socket has been quiet for the read timeout).
const STATS_EVERY_FRAMES: u64 = 4096;

/// Frames the kernel dropped because the socket's receive buffer was
/// full: FCoE assumes a lossless link, and FCP class 3 recovers a lost
/// frame only by the command's timeout, so every drop is logged.
#[derive(Default)]
struct Drops {
    /// Frames received since the counter was last read.
    frames: u64,
    /// Drops so far.
    total: u64,
}

impl Drops {
    fn check(&mut self, fd: i32) {
        self.frames = 0;
        let mut st = libc::tpacket_stats {
            tp_packets: 0,
            tp_drops: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: getsockopt into a correctly sized tpacket_stats; the fd is
        // the open socket. The kernel resets its counters on each read.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats).cast(),
                &mut len,
            )
        };
        if rc == 0 && st.tp_drops > 0 {
            self.total += u64::from(st.tp_drops);
            tracing::warn!(
                dropped = st.tp_drops,
                dropped_total = self.total,
                "AF_PACKET receive drops (socket buffer full)"
            );
        }
    }
}

fn readable_now(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, zero timeout.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct PacketRx {
    rx: mpsc::Receiver<Vec<Bytes>>,
    _stop: StopOnDrop,
}

impl EthRx for PacketRx {
    fn recv<'a>(&'a mut self, out: &'a mut Vec<Bytes>) -> LinkFuture<'a> {
        Box::pin(async move {
            let Some(b) = self.rx.recv().await else {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "AF_PACKET receiver stopped",
                ));
            };
            out.extend(b);
            while out.len() < 256 {
                match self.rx.try_recv() {
                    Ok(b) => out.extend(b),
                    Err(_) => break,
                }
            }
            Ok(())
        })
    }
}

struct PacketTx {
    tx: Box<dyn DataLinkSender>,
    buf: Vec<u8>,
}

impl EthTx for PacketTx {
    fn send(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<usize, WireError>,
    ) -> io::Result<()> {
        self.buf.clear();
        self.buf.resize(len, 0);
        let n = fill(&mut self.buf).map_err(wire_err)?;
        match self.tx.send_to(&self.buf[..n.min(len)], None) {
            Some(r) => r,
            None => Err(io::Error::other("AF_PACKET send failed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
