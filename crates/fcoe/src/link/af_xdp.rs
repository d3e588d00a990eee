//! AF_XDP through xsk-rs (feature `af-xdp`).
//!
//! - unifab loads its own XDP program (`bpf/fcoe_filter.c`, compiled by
//!   build.rs): only FCoE and FIP frames, tagged or not, are redirected
//!   to the socket; everything else passes to the kernel, so the
//!   interface keeps working for IP. libxdp's default program (which
//!   takes every frame) is never loaded.
//! - A program left attached by a killed process is removed before ours
//!   is attached, and ours is removed when the link is dropped.
//! - Received frames are handed up as `Bytes` that own their UMEM frame
//!   (no copy); the frame goes back to the fill ring when the last slice
//!   of it is dropped. At most [`Budget::max_lent`] frames are lent:
//!   past that (slices held by slow consumers), frames are copied out
//!   instead, so the kernel always has frames for a burst of
//!   [`Budget::burst`] to receive into (see [`Budget`]). The fill ring is
//!   stocked before the socket joins the XDP program's map.
//! - Transmission writes each frame into a UMEM frame, submits in
//!   batches, and kicks the kernel only when it asks (need_wakeup).
//! - Readiness comes from tokio's `AsyncFd` on the socket.
//! - Frames are 4,096 bytes (an FCoE frame with a baby jumbo fits); one
//!   queue (0) is bound. The bind asks for zero-copy first and falls back
//!   to copy mode (veth, generic XDP); [`EthLink::name`] says which.

use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tracing::{debug, info, warn};
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags,
};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

use super::{EthLink, EthRx, EthTx, LinkFuture, wire_err};
use crate::wire::{MacAddr, WireError};

/// The XDP program, compiled from bpf/fcoe_filter.c at build time.
static FILTER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fcoe_filter.o"));

/// UMEM frame size.
pub const FRAME_SIZE: u32 = 4096;

/// Where the XDP program runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver. Fails on a driver without XDP.
    Native,
    /// In the generic (skb) path: any interface.
    Generic,
    /// Generic on a virtual interface (veth, bridge, tap: no
    /// `/sys/class/net/IF/device`), native on a NIC, and generic after all
    /// when the NIC's driver refuses native XDP. On veth the frames arrive
    /// as skbs (the peer's stack or its copy-mode AF_XDP socket sent
    /// them), which veth's native XDP must first copy into page-pool
    /// pages; the generic path runs the program on the skb as it is.
    /// Through the FCoE hop it carried 1.18× the 1 MiB reads, 1.10× the
    /// 4 KiB reads and 1.05× the writes (medians of three alternated
    /// pairs, docs/fcoe.md).
    Auto,
}

impl XdpMode {
    fn flags(self) -> u32 {
        match self {
            XdpMode::Native | XdpMode::Auto => XdpFlags::XDP_FLAGS_DRV_MODE.bits(),
            XdpMode::Generic => XdpFlags::XDP_FLAGS_SKB_MODE.bits(),
        }
    }

    /// The mode `Auto` starts with for `interface`, given the sysfs
    /// network class directory (`/sys/class/net`): a NIC has a `device`
    /// link there, a virtual interface has none.
    pub fn auto_for(sys_class_net: &std::path::Path, interface: &str) -> XdpMode {
        if sys_class_net.join(interface).join("device").exists() {
            XdpMode::Native
        } else {
            XdpMode::Generic
        }
    }

    /// The mode to attach with first, and whether generic may follow a
    /// refused native attach (`sys_class_net` as for [`XdpMode::auto_for`]).
    fn resolve(self, sys_class_net: &std::path::Path, interface: &str) -> (XdpMode, bool) {
        match self {
            XdpMode::Auto => {
                let first = XdpMode::auto_for(sys_class_net, interface);
                (first, first == XdpMode::Native)
            }
            m => (m, false),
        }
    }

    /// "native" or "generic" (`Auto` before it is resolved: "auto").
    pub fn label(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
            XdpMode::Auto => "auto",
        }
    }
}

/// AF_XDP settings.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// Native, generic, or chosen per interface (`Auto`).
    pub mode: XdpMode,
    /// UMEM frames, shared between receiving and sending as [`Budget`]
    /// says. FCoE assumes a lossless link, so a burst must fit in the
    /// fill and RX rings: a 1 MiB read is 512 data frames and a response,
    /// eight in flight 4,104 frames, which the peer's kernel can put into
    /// our RX ring while we are off the CPU (in copy mode its `sendto`
    /// delivers them). The default 16,384 frames are 64 MiB of locked
    /// memory: root's CAP_IPC_LOCK covers it; an unprivileged process
    /// under an 8 MiB memlock limit needs ≤ 2,048 (and smaller rings).
    pub frames: u32,
    /// Ring sizes (fill, completion, RX, TX): a power of two. The default
    /// 8,192 keeps that burst of eight 1 MiB reads receivable with half
    /// the receive frames lent to the stack ([`Budget::burst`]); `frames`
    /// is raised to at least twice this.
    pub ring: u32,
    /// The interface queue to bind.
    pub queue: u32,
}

/// Receive descriptors taken from the RX ring at once.
pub const RX_BATCH: usize = 64;

/// How a link's UMEM frames are shared out.
///
/// The kernel receives a frame only into a UMEM frame from the fill ring,
/// and drops it (`fill_ring_empty`) when there is none. A peer can send a
/// whole burst while the receive task is off the CPU: in copy mode the
/// sender's own `sendto` delivers into our RX ring. Eight 1 MiB reads in
/// flight are 4,104 frames (8 × 512 data frames and an FCP_RSP), and
/// they did arrive at once: with a 4,096-frame fill ring, 8 were dropped
/// in 6 of 10 hop runs, and so they were with the split before this one
/// (half the receive frames lendable, the kernel left with 4,096) in 6 of
/// 59 (2026-11-24; 0 of 58 runs since with this split or a larger share
/// for the kernel). FCP class 3 recovers a lost frame only by the
/// command's timeout.
///
/// Every receive frame is at any moment in the fill ring, in the RX ring,
/// lent to the stack as `Bytes`, or free: waiting for the receive task to
/// put it back on the fill ring. A free frame is either a lent one the
/// stack has given back (it leaves the lent count as it joins the free
/// ones: the kernel's share does not shrink) or one the receive task
/// copied or skipped in its last batch (at most [`RX_BATCH`]). So with
/// at most `max_lent` lent, the fill and RX rings always hold at least
/// [`Budget::burst`] frames between them, and a burst that long is never
/// lost to an empty fill ring. A longer one can be: a lossless Ethernet
/// would pause the sender (PFC), and veth has no pause.
///
/// There are exactly as many receive frames as the fill ring holds. More
/// (a fill ring that is always full) made the hop 8–9 % slower: a frame
/// waits a whole ring before the kernel reuses it, and arrives cold
/// (2026-11-24, five alternated rounds, 1 MiB reads 1,180 against 1,282
/// MB/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Frames for receiving: one fill ring's worth.
    pub rx: u32,
    /// Frames for sending: the rest.
    pub tx: u32,
    /// Receive frames that may be lent to the stack at once.
    pub max_lent: u32,
}

impl Budget {
    /// The split for `cfg` (`frames` raised to at least twice `ring`).
    pub fn of(cfg: &XdpConfig) -> Budget {
        let frames = cfg.frames.max(2 * cfg.ring);
        let rx = cfg.ring;
        Budget {
            rx,
            tx: frames - rx,
            max_lent: rx.saturating_sub(cfg.ring / 2 + 2 * RX_BATCH as u32),
        }
    }

    /// The longest burst the kernel can always receive with the receive
    /// task off the CPU: half a ring and a batch (4,160 frames at the
    /// defaults).
    pub fn burst(&self) -> u32 {
        (self.rx - self.max_lent).saturating_sub(RX_BATCH as u32)
    }

    /// All the frames.
    pub fn frames(&self) -> u32 {
        self.tx + self.rx
    }
}

impl XdpConfig {
    /// Defaults in `mode`.
    pub fn new(mode: XdpMode) -> XdpConfig {
        XdpConfig {
            mode,
            frames: 16_384,
            ring: 8192,
            queue: 0,
        }
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// The loaded program and its attachment; detached when dropped.
struct Program {
    ifindex: i32,
    flags: u32,
    obj: *mut libxdp_sys::bpf_object,
    map_fd: i32,
}

// SAFETY: the bpf_object is only touched at drop (close), from one thread.
unsafe impl Send for Program {}
// SAFETY: no method takes &self apart from reading plain integers.
unsafe impl Sync for Program {}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: detaching by ifindex and closing the object we loaded.
        unsafe {
            libxdp_sys::bpf_xdp_detach(self.ifindex, self.flags, std::ptr::null());
            libxdp_sys::bpf_object__close(self.obj);
        }
        debug!(ifindex = self.ifindex, "XDP program detached");
    }
}

fn detach_any(ifindex: i32) {
    for f in [
        XdpFlags::XDP_FLAGS_DRV_MODE.bits(),
        XdpFlags::XDP_FLAGS_SKB_MODE.bits(),
    ] {
        // SAFETY: detaching whatever program is attached (none is fine).
        unsafe {
            libxdp_sys::bpf_xdp_detach(ifindex, f, std::ptr::null());
        }
    }
}

fn load_program(ifindex: i32, mode: XdpMode) -> io::Result<Program> {
    // SAFETY: libbpf reads FILTER (a static) and returns an owned object
    // or null; every pointer is checked before use.
    unsafe {
        let obj = libxdp_sys::bpf_object__open_mem(
            FILTER.as_ptr().cast(),
            FILTER.len(),
            std::ptr::null(),
        );
        if obj.is_null() {
            return Err(err("opening the XDP program", io::Error::last_os_error()));
        }
        let rc = libxdp_sys::bpf_object__load(obj);
        if rc != 0 {
            libxdp_sys::bpf_object__close(obj);
            return Err(err(
                "loading the XDP program",
                io::Error::from_raw_os_error(-rc),
            ));
        }
        let name = c"fcoe_filter";
        let prog = libxdp_sys::bpf_object__find_program_by_name(obj, name.as_ptr());
        let map = libxdp_sys::bpf_object__find_map_by_name(obj, c"xsks_map".as_ptr());
        if prog.is_null() || map.is_null() {
            libxdp_sys::bpf_object__close(obj);
            return Err(err("the XDP program", "no fcoe_filter or xsks_map"));
        }
        let prog_fd = libxdp_sys::bpf_program__fd(prog);
        let map_fd = libxdp_sys::bpf_map__fd(map);
        let flags = mode.flags();
        let rc = libxdp_sys::bpf_xdp_attach(ifindex, prog_fd, flags, std::ptr::null());
        if rc != 0 {
            libxdp_sys::bpf_object__close(obj);
            // Keep the kind: a driver without native XDP says Unsupported.
            let os = io::Error::from_raw_os_error(-rc);
            return Err(io::Error::new(
                os.kind(),
                format!("attaching the XDP program ({}): {os}", mode.label()),
            ));
        }
        Ok(Program {
            ifindex,
            flags,
            obj,
            map_fd,
        })
    }
}

/// Receive frames that are free (not in the fill ring, not lent out).
#[derive(Debug, Default)]
struct Pool {
    free: Mutex<Vec<FrameDesc>>,
    /// Frames held by the stack as `Bytes`.
    lent: std::sync::atomic::AtomicUsize,
}

/// A received frame lent to the stack as `Bytes`.
struct UmemFrame {
    umem: Umem,
    desc: FrameDesc,
    pool: Arc<Pool>,
    lent: bool,
}

impl AsRef<[u8]> for UmemFrame {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the descriptor belongs to this UMEM and is neither in
        // the fill ring nor lent twice until this value is dropped.
        unsafe { self.umem.data(&self.desc).contents() }
    }
}

impl Drop for UmemFrame {
    fn drop(&mut self) {
        if self.lent {
            self.pool
                .lent
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.pool
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.desc);
    }
}

struct RawSock(RawFd);

impl AsRawFd for RawSock {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Opens `interface` with AF_XDP (CAP_NET_ADMIN, CAP_BPF; root here).
pub fn open(interface: &str, cfg: &XdpConfig) -> io::Result<EthLink> {
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == interface)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {interface:?}"),
            )
        })?;
    let ifindex = i32::try_from(iface.index).map_err(|e| err("ifindex", e))?;
    let mac = iface
        .mac
        .map(|m| MacAddr(m.octets()))
        .unwrap_or(MacAddr::ZERO);
    detach_any(ifindex);
    let (mut mode, may_fall_back) = cfg
        .mode
        .resolve(std::path::Path::new("/sys/class/net"), interface);
    let program = match load_program(ifindex, mode) {
        Err(e) if may_fall_back && e.kind() == io::ErrorKind::Unsupported => {
            info!(interface, error = %e, "native XDP refused; using generic XDP");
            mode = XdpMode::Generic;
            load_program(ifindex, mode)?
        }
        r => r?,
    };
    let program = Arc::new(program);

    let ring = QueueSize::new(cfg.ring).map_err(|e| err("ring size", e))?;
    let umem_cfg = UmemConfig::builder()
        .frame_size(FrameSize::new(FRAME_SIZE).map_err(|e| err("frame size", e))?)
        .fill_queue_size(ring)
        .comp_queue_size(ring)
        .build()
        .map_err(|e| err("UMEM config", e))?;
    let budget = Budget::of(cfg);
    let frames = NonZeroU32::new(budget.frames()).ok_or_else(|| err("frames", 0))?;
    let (umem, mut descs) = Umem::new(umem_cfg, frames, false).map_err(|e| err("UMEM", e))?;
    let ifname = Interface::new(CString::new(interface).map_err(|e| err("interface", e))?);

    let mut bound = None;
    let mut last = None;
    'modes: for (bind, label) in [
        (BindFlags::XDP_ZEROCOPY, "zero-copy"),
        (BindFlags::XDP_COPY, "copy"),
    ] {
        let sc = SocketConfig::builder()
            .rx_queue_size(ring)
            .tx_queue_size(ring)
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .xdp_flags(XdpFlags::from_bits_truncate(mode.flags()))
            .bind_flags(bind | BindFlags::XDP_USE_NEED_WAKEUP)
            .build();
        // Rebinding right after a close can be refused (EBUSY) for a while.
        for _ in 0..50 {
            // SAFETY: the UMEM is not shared with another socket.
            match unsafe { Socket::new(sc, &umem, &ifname, cfg.queue) } {
                Ok(s) => {
                    bound = Some((s, label));
                    break 'modes;
                }
                Err(e) => {
                    let busy = format!("{e:?}").contains("Device or resource busy");
                    last = Some(format!("{e}"));
                    if !busy {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
    let Some(((tx_q, rx_q, rings), copy_mode)) = bound else {
        return Err(err("binding the AF_XDP socket", last.unwrap_or_default()));
    };
    let Some((mut fq, cq)) = rings else {
        return Err(err("AF_XDP socket", "no fill/completion rings"));
    };
    // The fill ring is stocked before the program can redirect a frame
    // to the socket: a frame arriving in between (an ENode's first FIP
    // solicitation, when both ends start together) would find it empty
    // and be dropped.
    let tx_frames = descs.split_off(budget.rx as usize);
    let fill_now = descs.len().min(cfg.ring as usize);
    let spare = descs.split_off(fill_now);
    // SAFETY: these descriptors are ours and not in any ring.
    let n = unsafe { fq.produce(&descs) };
    let mut spare = spare;
    spare.extend_from_slice(&descs[n..]);
    let pool = Arc::new(Pool {
        free: Mutex::new(spare),
        lent: Default::default(),
    });
    let fd = rx_q.fd().as_raw_fd();
    let key = cfg.queue;
    // SAFETY: a u32 key and value for the XSKMAP we loaded.
    let rc = unsafe {
        libxdp_sys::bpf_map_update_elem(
            program.map_fd,
            (&key as *const u32).cast(),
            (&fd as *const i32).cast(),
            0,
        )
    };
    if rc != 0 {
        return Err(err(
            "registering the socket in the XDP map",
            io::Error::from_raw_os_error(-rc),
        ));
    }
    // SAFETY: the socket fd stays open as long as the RX half (which owns
    // its queue and this registration) exists.
    let afd =
        unsafe { AsyncFd::register_with_interest(RawSock(fd), tokio::io::Interest::READABLE) }
            .map_err(|e| err("registering the socket with tokio", e))?;
    let name = format!("af_xdp:{interface} ({}, {copy_mode})", mode.label());
    info!(
        link = %name,
        frames = frames.get(),
        rx = budget.rx,
        max_lent = budget.max_lent,
        "AF_XDP socket bound"
    );
    Ok(EthLink {
        rx: Box::new(XdpRx {
            afd: Arc::new(afd),
            rx: rx_q,
            fq,
            umem: umem.clone(),
            pool,
            descs: vec![FrameDesc::default(); RX_BATCH],
            max_lent: budget.max_lent as usize,
            copied: 0,
            since_stats: 0,
            stats_at: Instant::now(),
            drops_seen: (0, 0, 0),
            _program: program.clone(),
        }),
        tx: Box::new(XdpTx {
            tx: tx_q,
            cq,
            umem,
            free: tx_frames,
            pending: Vec::with_capacity(64),
            comp: vec![FrameDesc::default(); 64],
            dropped: 0,
            in_ring: 0,
            zero_copy: copy_mode == "zero-copy",
            _program: program,
        }),
        mac,
        name,
    })
}

/// Frames between two reads of the kernel's drop counters under load.
const STATS_EVERY_FRAMES: usize = 4096;
/// The longest a waiting socket goes without reading them.
const STATS_EVERY: Duration = Duration::from_millis(100);

struct XdpRx {
    afd: Arc<AsyncFd<RawSock>>,
    rx: RxQueue,
    fq: FillQueue,
    umem: Umem,
    pool: Arc<Pool>,
    descs: Vec<FrameDesc>,
    /// Frames that may be lent out before copies are made instead.
    max_lent: usize,
    copied: u64,
    /// Frames taken since the kernel's drop counters were last read.
    since_stats: usize,
    /// When they were last read.
    stats_at: Instant,
    /// The kernel's drop counters last seen.
    drops_seen: (u64, u64, u64),
    _program: Arc<Program>,
}

impl XdpRx {
    /// Reports frames the kernel could not deliver to the socket.
    ///
    /// The counters are read with a system call, so not on every wake-up:
    /// every [`STATS_EVERY_FRAMES`] frames under load, and before the socket
    /// waits when [`STATS_EVERY`] has passed. A drop just before the link
    /// falls quiet is reported at the next wake-up (FIP keep-alives bound
    /// that wait).
    fn check_drops(&mut self) {
        self.since_stats = 0;
        self.stats_at = Instant::now();
        let Ok(st) = self.rx.fd().xdp_statistics() else {
            return;
        };
        let now = (
            st.rx_dropped(),
            st.rx_ring_full(),
            st.rx_fill_ring_empty_descs(),
        );
        if now != self.drops_seen {
            warn!(
                rx_dropped = now.0,
                rx_ring_full = now.1,
                fill_ring_empty = now.2,
                lent = self.pool.lent.load(std::sync::atomic::Ordering::Relaxed),
                copied = self.copied,
                "AF_XDP receive drops"
            );
            self.drops_seen = now;
        }
    }

    /// Gives free frames back to the kernel.
    fn refill(&mut self) {
        let free: Vec<FrameDesc> = {
            let mut f = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
            let room = self.fq.nb_free(f.len() as u32) as usize;
            let k = f.len().saturating_sub(room.min(f.len()));
            f.split_off(k)
        };
        if free.is_empty() {
            return;
        }
        // SAFETY: free descriptors are ours and in no ring.
        let n = unsafe { self.fq.produce(&free) };
        if n < free.len() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&free[n..]);
        }
        if self.fq.needs_wakeup() {
            let _ = self.fq.wakeup(self.rx.fd_mut(), 0);
        }
    }

    fn take(&mut self, out: &mut Vec<Bytes>) -> usize {
        // SAFETY: descriptors returned by the RX ring are ours until we
        // hand them back through the fill ring.
        let n = unsafe { self.rx.consume(&mut self.descs) };
        use std::sync::atomic::Ordering;
        self.since_stats += n;
        if self.since_stats >= STATS_EVERY_FRAMES {
            self.check_drops();
        }
        for d in &self.descs[..n] {
            let mut frame = UmemFrame {
                umem: self.umem.clone(),
                desc: *d,
                pool: self.pool.clone(),
                lent: false,
            };
            if !super::is_fcoe_or_fip(frame.as_ref()) {
                continue;
            }
            if self.pool.lent.load(Ordering::Relaxed) < self.max_lent {
                frame.lent = true;
                self.pool.lent.fetch_add(1, Ordering::Relaxed);
                out.push(Bytes::from_owner(frame));
            } else {
                // Too many frames held upstream: copy, recycle at once.
                self.copied += 1;
                out.push(Bytes::copy_from_slice(frame.as_ref()));
            }
        }
        n
    }
}

impl EthRx for XdpRx {
    fn recv<'a>(&'a mut self, out: &'a mut Vec<Bytes>) -> LinkFuture<'a> {
        Box::pin(async move {
            loop {
                self.refill();
                if self.take(out) > 0 && !out.is_empty() {
                    // More may be there already: one more pass, no waiting.
                    self.refill();
                    self.take(out);
                    return Ok(());
                }
                if self.stats_at.elapsed() >= STATS_EVERY {
                    self.check_drops();
                }
                let afd = self.afd.clone();
                let mut guard = afd.readable().await?;
                self.refill();
                if self.take(out) > 0 && !out.is_empty() {
                    return Ok(());
                }
                guard.clear_ready();
            }
        })
    }
}

struct XdpTx {
    tx: TxQueue,
    cq: CompQueue,
    umem: Umem,
    free: Vec<FrameDesc>,
    pending: Vec<FrameDesc>,
    comp: Vec<FrameDesc>,
    dropped: u64,
    /// Frames on the TX ring not yet completed.
    in_ring: usize,
    zero_copy: bool,
    _program: Arc<Program>,
}

impl XdpTx {
    fn reclaim(&mut self) {
        loop {
            // SAFETY: completed descriptors are ours again.
            let n = unsafe { self.cq.consume(&mut self.comp) };
            self.free.extend_from_slice(&self.comp[..n]);
            self.in_ring -= n.min(self.in_ring);
            if n < self.comp.len() {
                break;
            }
        }
    }

    /// Puts pending frames on the TX ring and kicks the kernel until the
    /// ring has drained (copy mode transmits during the kick, at most a
    /// small batch per call) or it stops making progress.
    fn submit(&mut self) -> io::Result<()> {
        let mut idle = 0;
        while (!self.pending.is_empty() || self.in_ring > 0) && idle < 64 {
            if !self.pending.is_empty() {
                // SAFETY: pending descriptors hold written frames of this UMEM.
                let n = unsafe { self.tx.produce(&self.pending) };
                self.pending.drain(..n);
                self.in_ring += n;
            }
            if self.zero_copy && !self.tx.needs_wakeup() {
                // The device sends on its own; completions come later.
                self.reclaim();
                return Ok(());
            }
            if let Err(e) = self.tx.wakeup() {
                let transient = matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS)
                );
                if !transient {
                    return Err(e);
                }
            }
            let before = self.in_ring;
            self.reclaim();
            if self.in_ring == before {
                idle += 1;
            } else {
                idle = 0;
            }
        }
        if !self.pending.is_empty() {
            // The ring did not take them: give the frames up (class 3 drop).
            self.dropped += self.pending.len() as u64;
            warn!(
                frames = self.pending.len(),
                dropped = self.dropped,
                "AF_XDP TX ring stuck: frames dropped"
            );
            let p: Vec<FrameDesc> = self.pending.drain(..).collect();
            self.free.extend(p);
        }
        Ok(())
    }
}

impl EthTx for XdpTx {
    fn send(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> Result<usize, WireError>,
    ) -> io::Result<()> {
        if len > FRAME_SIZE as usize - 256 {
            return Err(wire_err(WireError::TooLong(len)));
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        if self.free.is_empty() {
            self.submit()?;
        }
        let Some(mut d) = self.free.pop() else {
            self.dropped += 1;
            warn!(
                dropped = self.dropped,
                "AF_XDP: no free TX frame: frame dropped"
            );
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "AF_XDP: no free TX frame",
            ));
        };
        // SAFETY: a free TX descriptor of this UMEM, in no ring.
        let mut data = unsafe { self.umem.data_mut(&mut d) };
        data.cursor().set_pos(len);
        let written = fill(data.contents_mut());
        match written {
            Ok(n) => {
                data.cursor().set_pos(n.min(len));
                self.pending.push(d);
                if self.pending.len() >= 64 {
                    self.submit()?;
                }
                Ok(())
            }
            Err(e) => {
                self.free.push(d);
                Err(wire_err(e))
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.submit()
    }
}

#[cfg(test)]
mod tests {
    use super::{Budget, RX_BATCH, XdpConfig, XdpMode};

    #[test]
    fn the_default_budget_leaves_the_kernel_eight_1mib_reads() {
        let cfg = XdpConfig::new(XdpMode::Auto);
        let b = Budget::of(&cfg);
        // 64 MiB of UMEM, as before the split changed.
        assert_eq!(b.frames(), 16_384);
        // Eight 1 MiB reads in flight: 8 × (512 data frames + FCP_RSP).
        assert!(b.burst() >= 8 * 513, "{b:?}");
        // What the kernel can receive into with the stack holding all it
        // may, and the receive task's last batch not yet returned.
        assert_eq!(b.rx - b.max_lent - RX_BATCH as u32, b.burst());
        // The fill ring can hold every receive frame.
        assert!(b.rx <= cfg.ring);
    }

    #[test]
    fn a_small_umem_lends_nothing_rather_than_starve_the_kernel() {
        let cfg = XdpConfig {
            frames: 0,
            ring: 128,
            ..XdpConfig::new(XdpMode::Generic)
        };
        let b = Budget::of(&cfg);
        assert_eq!((b.rx, b.tx, b.max_lent, b.burst()), (128, 128, 0, 64));
    }

    #[test]
    fn auto_picks_generic_for_a_virtual_interface_and_native_for_a_nic() {
        let sys = tempfile::tempdir().unwrap();
        // A NIC: /sys/class/net/IF/device links to its bus device.
        std::fs::create_dir_all(sys.path().join("eth0/device")).unwrap();
        // veth, bridges, taps: no device link.
        std::fs::create_dir_all(sys.path().join("veth0")).unwrap();
        assert_eq!(XdpMode::auto_for(sys.path(), "eth0"), XdpMode::Native);
        assert_eq!(XdpMode::auto_for(sys.path(), "veth0"), XdpMode::Generic);
        assert_eq!(XdpMode::auto_for(sys.path(), "gone"), XdpMode::Generic);
    }

    #[test]
    fn only_auto_falls_back_and_only_from_native() {
        let sys = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(sys.path().join("eth0/device")).unwrap();
        std::fs::create_dir_all(sys.path().join("veth0")).unwrap();
        let s = sys.path();
        assert_eq!(XdpMode::Auto.resolve(s, "eth0"), (XdpMode::Native, true));
        assert_eq!(XdpMode::Auto.resolve(s, "veth0"), (XdpMode::Generic, false));
        for iface in ["eth0", "veth0"] {
            assert_eq!(XdpMode::Native.resolve(s, iface), (XdpMode::Native, false));
            assert_eq!(
                XdpMode::Generic.resolve(s, iface),
                (XdpMode::Generic, false)
            );
        }
    }
}
