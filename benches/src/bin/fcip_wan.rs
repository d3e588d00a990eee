//! FCIP over an emulated WAN: latency against distance (FastWrite off and
//! on), throughput and compression on three data sets, and circuit
//! failover under load. Run through `benches/peers/fcip_wan.sh` (release
//! build). Not a test: it prints figures.
//!
//! The stack is the real one, in one process: site A's switch with an FCP
//! initiator (a scsi-core `RemoteLu`, the same object an iSCSI front end
//! hands its tasks to), an FCIP tunnel of two circuits, each through its
//! own testkit WAN relay (delay, rate limit, black-hole cut), and site B's
//! switch with an FCP target over a 1 GiB memory LU.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use unifab_benches::pages::Pages;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::{FcNode, FcpInitiatorFactory, Switch};
use unifab_fc::nport::NPortConfig;
use unifab_fc::wire::Wwn;
use unifab_fcip::io::{CircuitConfig, InterSwitch, LinkMode, Listener, Tunnel, TunnelConfig};
use unifab_fcip::proto::compress;
use unifab_scsi_core::backend::MemoryBackend;
use unifab_scsi_core::remote::Identity;
use unifab_scsi_core::tape::{TapeLu, TapeLuConfig};
use unifab_scsi_core::{
    Cdb, EmulatedLu, EmulatedLuConfig, ItNexus, LogicalUnit, Lun, RemoteLu, RemoteLuConfig,
    ScsiTarget, Status, Task,
};
use unifab_testkit::wan::{WanLink, WanProfile};

const SW_A: Wwn = Wwn(0x1000_0000_0000_00a1);
const SW_B: Wwn = Wwn(0x1000_0000_0000_00b1);
const TARGET: Wwn = Wwn(0x2100_0000_0000_0b0a);
const INITIATOR: Wwn = Wwn(0x2100_0000_0000_0a0b);

fn nexus() -> ItNexus {
    ItNexus::iscsi(
        "iqn.2026-11.io.unifab:bench",
        [0x40, 0, 0, 0, 0, 1],
        "iqn.2026-11.io.unifab:gw,t,0x1",
    )
}

fn task(tag: u64, cdb: Vec<u8>, data: Option<Bytes>, data_in: u32) -> Task {
    let t = Task::new(nexus(), Lun(0), tag, Cdb::new(Bytes::from(cdb))).with_data_in(data_in);
    match data {
        Some(d) => t.with_data(d),
        None => t,
    }
}

fn cdb(write: bool, lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![if write { 0x2a } else { 0x28 }, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

struct Setup {
    remote: Arc<RemoteLu>,
    tunnel: Option<Tunnel>,
    /// Site B's tunnel and listener.
    far: Option<(Tunnel, Listener)>,
    links: Vec<WanLink>,
    _keep: Vec<FcNode>,
}

impl Setup {
    /// Stops both sites' tunnels and the listener, so that nothing of this
    /// setup runs during the next measurement.
    async fn stop(self) {
        if let Some(t) = &self.tunnel {
            t.stop().await;
        }
        if let Some((t, l)) = &self.far {
            t.stop().await;
            l.stop();
        }
    }
}

/// Site B's FCP target: a 1 GiB memory disk, or (`tape`) a tape drive
/// over a 4 GiB memory cartridge.
fn target(switch: &Switch, name: &str, tape: bool) -> FcNode {
    let node = FcNode::spawn(switch, name);
    let scsi = ScsiTarget::new();
    if tape {
        let lu = TapeLu::new(
            TapeLuConfig::default(),
            Arc::new(MemoryBackend::new(4 << 30)),
        )
        .unwrap();
        scsi.insert(Lun(0), Arc::new(lu));
    } else {
        let lu = EmulatedLu::new(
            EmulatedLuConfig::default(),
            Arc::new(MemoryBackend::new(1 << 30)),
        )
        .unwrap();
        scsi.insert(Lun(0), Arc::new(lu));
    }
    let mut t = NPortConfig::new(TARGET, Wwn(0x2000_0000_0000_0b0a));
    t.target = true;
    node.add_port("fc1/1", t, Some(scsi)).unwrap();
    node
}

async fn initiator(switch: &Switch) -> (Arc<RemoteLu>, FcNode) {
    let node = FcNode::spawn(switch, "site-a");
    let mut i = NPortConfig::new(INITIATOR, Wwn(0x2000_0000_0000_0a0b));
    i.initiator = true;
    i.discover = true;
    node.add_port("fc1/2", i, None).unwrap();
    assert!(
        node.wait_for_peer(INITIATOR, TARGET, Duration::from_secs(20))
            .await
    );
    let factory = Arc::new(FcpInitiatorFactory::new(
        node.clone(),
        INITIATOR,
        TARGET,
        false,
    ));
    let remote = Arc::new(RemoteLu::new(
        RemoteLuConfig {
            name: "bench".into(),
            backend: format!("fc://{TARGET}/0"),
            remote_lun: Lun(0),
            identity: Identity::Passthrough,
            task_set_depth: 256,
            read_only: false,
        },
        factory,
    ));
    let _ = remote.execute(task(1, vec![0; 6], None, 0)).await;
    (remote, node)
}

/// Initiator and target on one switch: the path without FCIP.
async fn local() -> Setup {
    local_with(false).await
}

/// [`local`], with a tape drive for the target's LU if `tape`.
async fn local_with(tape: bool) -> Setup {
    let a = Switch::new(FabricConfig {
        domain: 1,
        switch_name: SW_A,
        ..FabricConfig::default()
    });
    let t = target(&a, "site-b", tape);
    let (remote, n) = initiator(&a).await;
    Setup {
        remote,
        tunnel: None,
        far: None,
        links: Vec::new(),
        _keep: vec![t, n],
    }
}

async fn sites(
    mode: LinkMode,
    fastwrite: bool,
    comp: compress::Mode,
    wan: Option<WanProfile>,
) -> Setup {
    sites_with(mode, fastwrite, None, comp, wan).await
}

/// [`sites`]; with `tape` = `Some(pipelining)`, site B's LU is a tape
/// drive and both tunnels want tape pipelining or not.
async fn sites_with(
    mode: LinkMode,
    fastwrite: bool,
    tape: Option<bool>,
    comp: compress::Mode,
    wan: Option<WanProfile>,
) -> Setup {
    let a = Switch::new(FabricConfig {
        domain: 1,
        switch_name: SW_A,
        ..FabricConfig::default()
    });
    let b = Switch::new(FabricConfig {
        domain: 2,
        switch_name: SW_B,
        ..FabricConfig::default()
    });
    let ca = InterSwitch::start(a.clone());
    let cb = InterSwitch::start(b.clone());
    let acc = CircuitConfig {
        peer: None,
        local: None,
        weight: 1,
    };
    let mut tb = TunnelConfig::new("fcip0", 0, SW_A, vec![acc.clone(), acc]);
    tb.mode = mode;
    tb.fastwrite = fastwrite;
    tb.tape_pipelining = tape == Some(true);
    tb.compression = comp;
    let (tunnel_b, l, tnode) = site_b(tb, cb, &b, tape.is_some()).await;
    let links: Vec<WanLink> = match wan {
        Some(p) => (0..2)
            .map(|_| WanLink::start("127.0.0.1:0".parse().unwrap(), l.local_addr(), p).unwrap())
            .collect(),
        None => Vec::new(),
    };
    let peer = |i: usize| CircuitConfig {
        peer: Some(links.get(i).map_or(l.local_addr(), |x| x.addr())),
        local: None,
        weight: 1,
    };
    let mut ta = TunnelConfig::new("fcip0", 0, SW_B, vec![peer(0), peer(1)]);
    ta.mode = mode;
    ta.fastwrite = fastwrite;
    ta.tape_pipelining = tape == Some(true);
    ta.compression = comp;
    let tunnel = Tunnel::start(ta, ca);
    let (remote, n) = initiator(&a).await;
    Setup {
        remote,
        tunnel: Some(tunnel),
        far: Some((tunnel_b, l)),
        links,
        _keep: vec![tnode, n],
    }
}

/// Site B: its tunnel (accepting), the listener, and the target node.
async fn site_b(
    tb: TunnelConfig,
    cb: InterSwitch,
    b: &Switch,
    tape: bool,
) -> (Tunnel, Listener, FcNode) {
    let tunnel = Tunnel::start(tb, cb);
    let l = Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        SW_B,
        vec![tunnel.clone()],
        None,
    )
    .await
    .unwrap();
    (tunnel, l, target(b, "site-b", tape))
}

/// 4 KiB writes at QD1: median and 99th percentile in µs.
async fn qd1(s: &Setup, n: usize) -> (f64, f64) {
    let data = Bytes::from(vec![0xa5u8; 4096]);
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 50 {
        let t = Instant::now();
        let r = s
            .remote
            .execute(task(
                10 + i as u64,
                cdb(true, (i as u32 % 10_000) * 8, 8),
                Some(data.clone()),
                0,
            ))
            .await;
        assert_eq!(r.status, Status::GOOD);
        if i >= 50 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    median_p99(lat)
}

/// The tunnel's overhead at 0 ms: the path without FCIP, the RFC tunnel,
/// the enhanced tunnel with FastWrite, and the enhanced tunnel without it
/// (all straight on loopback, no relay), built once and measured in turn,
/// round after round, so that the machine's slow and fast spells fall on
/// all alike. Prints each round's medians and the median of the rounds.
async fn overhead() {
    let rounds = 7;
    let n = 2000;
    println!(
        "## Tunnel overhead at 0 ms: 4 KiB writes, QD1, {rounds} interleaved rounds of {n} (median µs)\n"
    );
    let local = local().await;
    let rfc = sites(LinkMode::Rfc, false, compress::Mode::None, None).await;
    let fw = sites(LinkMode::Enhanced, true, compress::Mode::None, None).await;
    let enh = sites(LinkMode::Enhanced, false, compress::Mode::None, None).await;
    if let Ok(only) = std::env::var("FCIP_WAN_PROFILE") {
        // For a profiler: one path only, for a while, nothing printed
        // per round.
        let s = match only.as_str() {
            "local" => &local,
            "rfc" => &rfc,
            "fastwrite" => &fw,
            "enhanced" => &enh,
            other => panic!("FCIP_WAN_PROFILE: {other}: local, rfc, fastwrite or enhanced"),
        };
        let (m, _) = qd1(s, 50_000).await;
        println!("{only}: {m:.1} µs median over 50,000 writes");
        return;
    }
    println!(
        "| round | without FCIP | RFC | FastWrite | enhanced | RFC − without | FastWrite − without | enhanced − without |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let (mut d_rfc, mut d_fw, mut d_enh) = (Vec::new(), Vec::new(), Vec::new());
    let (mut m_local, mut m_rfc, mut m_fw, mut m_enh) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 1..=rounds {
        let (l, _) = qd1(&local, n).await;
        let (a, _) = qd1(&rfc, n).await;
        let (f, _) = qd1(&fw, n).await;
        let (e, _) = qd1(&enh, n).await;
        println!(
            "| {r} | {l:.1} | {a:.1} | {f:.1} | {e:.1} | +{:.1} | +{:.1} | +{:.1} |",
            a - l,
            f - l,
            e - l
        );
        d_rfc.push(a - l);
        d_fw.push(f - l);
        d_enh.push(e - l);
        m_local.push(l);
        m_rfc.push(a);
        m_fw.push(f);
        m_enh.push(e);
    }
    let med = |v: Vec<f64>| median_p99(v).0;
    println!(
        "| median | {:.1} | {:.1} | {:.1} | {:.1} | **+{:.1}** | **+{:.1}** | **+{:.1}** |\n",
        med(m_local),
        med(m_rfc),
        med(m_fw),
        med(m_enh),
        med(d_rfc),
        med(d_fw),
        med(d_enh)
    );
}

/// Median and 99th percentile of latencies.
fn median_p99(mut lat: Vec<f64>) -> (f64, f64) {
    lat.sort_by(f64::total_cmp);
    (lat[lat.len() / 2], lat[lat.len() * 99 / 100])
}

/// The round trip of the path under the tunnel, measured the same way:
/// plain TCP, 4 KiB there and 64 bytes back, QD1, through a relay with
/// `profile` (or straight on loopback); median µs of `n`. Every TCP hop
/// costs a wake-up of the receiving thread, which on this VM is most of a
/// loopback round trip; this is the floor under each FCIP round trip.
fn tcp_rtt(profile: Option<WanProfile>, n: usize) -> f64 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            s.set_nodelay(true).unwrap();
            let mut buf = vec![0u8; 4096];
            while s.read_exact(&mut buf).is_ok() {
                if s.write_all(&[0u8; 64]).is_err() {
                    break;
                }
            }
        }
    });
    let link = profile.map(|p| WanLink::start("127.0.0.1:0".parse().unwrap(), addr, p).unwrap());
    let mut c = std::net::TcpStream::connect(link.as_ref().map_or(addr, |l| l.addr())).unwrap();
    c.set_nodelay(true).unwrap();
    let out = vec![0xa5u8; 4096];
    let mut back = [0u8; 64];
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 50 {
        let t = Instant::now();
        c.write_all(&out).unwrap();
        c.read_exact(&mut back).unwrap();
        if i >= 50 {
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    median_p99(lat).0
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
        t(r.ru_utime) + t(r.ru_stime)
    }
}

/// 1 MiB sequential writes at QD 8 for `secs`: MB/s, raw/wire ratio, CPU s/GB.
async fn stream(s: &Setup, data: &[Bytes], secs: f64) -> (f64, f64, f64) {
    let st0 = s.tunnel.as_ref().map(|t| t.stats());
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let mut next = 0u32;
    let mut inflight = Vec::new();
    let remote = s.remote.clone();
    let mut tag = 1_000_000u64;
    while t0.elapsed().as_secs_f64() < secs {
        while inflight.len() < 8 {
            let d = data[next as usize % data.len()].clone();
            let lba = (next % 1000) * 2048;
            next += 1;
            tag += 1;
            let r = remote.clone();
            inflight.push(tokio::spawn(async move {
                r.execute(task(tag, cdb(true, lba, 2048), Some(d), 0)).await
            }));
        }
        let h = inflight.remove(0);
        let r = h.await.unwrap();
        assert_eq!(r.status, Status::GOOD);
        bytes += 1 << 20;
    }
    for h in inflight {
        let _ = h.await;
        bytes += 1 << 20;
    }
    let dt = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    tokio::time::sleep(Duration::from_millis(1100)).await; // stats publish
    let ratio = match (st0, s.tunnel.as_ref().map(|t| t.stats())) {
        (Some(a), Some(b)) if b.wire_bytes > a.wire_bytes => {
            (b.raw_bytes - a.raw_bytes) as f64 / (b.wire_bytes - a.wire_bytes) as f64
        }
        _ => 1.0,
    };
    (bytes as f64 / dt / 1e6, ratio, cpu / (bytes as f64 / 1e9))
}

/// A tape host's backup stream: READ the drive's INQUIRY (so the tunnel
/// knows it for a tape), then WRITE(6) of 64 KiB variable blocks one at a
/// time, as a tape host issues them, for `secs`; then its restore: REWIND
/// and every block read back with READ(6), one at a time. MB/s of each.
async fn tape_stream(s: &Setup, secs: f64) -> (f64, f64) {
    let inq = s
        .remote
        .execute(task(2, vec![0x12, 0, 0, 0, 36, 0], None, 36))
        .await;
    assert_eq!(inq.status, Status::GOOD);
    let block = Bytes::from(vec![0x5au8; 64 * 1024]);
    let write6 = vec![0x0a, 0, 0x01, 0x00, 0x00, 0];
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let mut tag = 2_000_000u64;
    while t0.elapsed().as_secs_f64() < secs {
        tag += 1;
        let r = s
            .remote
            .execute(task(tag, write6.clone(), Some(block.clone()), 0))
            .await;
        assert_eq!(r.status, Status::GOOD, "{:02x?}", r.sense);
        bytes += 64 * 1024;
    }
    // The stream ends with a filemark (a sync point: every block is on
    // the far tape when it returns), counted in the time.
    let r = s
        .remote
        .execute(task(tag + 1, vec![0x10, 0, 0, 0, 1, 0], None, 0))
        .await;
    assert_eq!(r.status, Status::GOOD, "{:02x?}", r.sense);
    let wrote = bytes as f64 / t0.elapsed().as_secs_f64() / 1e6;
    let r = s
        .remote
        .execute(task(tag + 2, vec![0x01, 0, 0, 0, 0, 0], None, 0))
        .await;
    assert_eq!(r.status, Status::GOOD, "REWIND: {:02x?}", r.sense);
    let read6 = vec![0x08, 0, 0x01, 0x00, 0x00, 0];
    let t1 = Instant::now();
    let mut tag = tag + 3;
    for _ in 0..bytes / (64 * 1024) {
        tag += 1;
        let r = s
            .remote
            .execute(task(tag, read6.clone(), None, 64 * 1024))
            .await;
        assert_eq!(r.status, Status::GOOD, "READ(6): {:02x?}", r.sense);
        let got: usize = r.data_in.iter().map(|d| d.len()).sum();
        assert_eq!(got, 64 * 1024);
    }
    let read = bytes as f64 / t1.elapsed().as_secs_f64() / 1e6;
    (wrote, read)
}

/// What the emulated link itself carries: one plain TCP stream per circuit
/// through the same relays (same profile), writing as fast as it can for
/// `secs`; MB/s received at the far end, both circuits together. The
/// baseline the tunnel's uncompressed throughput is held against.
fn link_capacity(profile: WanProfile, circuits: usize, secs: f64) -> f64 {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let sink = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sink_addr = sink.local_addr().unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let r2 = received.clone();
    std::thread::spawn(move || {
        for s in sink.incoming().take(circuits).flatten() {
            let r = r2.clone();
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = vec![0u8; 256 * 1024];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    r.fetch_add(n as u64, Ordering::Relaxed);
                }
            });
        }
    });
    let links: Vec<WanLink> = (0..circuits)
        .map(|_| WanLink::start("127.0.0.1:0".parse().unwrap(), sink_addr, profile).unwrap())
        .collect();
    let writers: Vec<_> = links
        .iter()
        .map(|l| {
            let addr = l.addr();
            std::thread::spawn(move || {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_nodelay(true).unwrap();
                let chunk = vec![0x5au8; 64 * 1024];
                let end = Instant::now() + Duration::from_secs_f64(secs + 1.0);
                while Instant::now() < end {
                    if c.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    // Measure after half a second (the relays' queues filling up).
    std::thread::sleep(Duration::from_millis(500));
    let b0 = received.load(Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let got = received.load(Ordering::Relaxed) - b0;
    let dt = t0.elapsed().as_secs_f64();
    for w in writers {
        let _ = w.join();
    }
    drop(links);
    got as f64 / dt / 1e6
}

fn dataset(kind: &str) -> Vec<Bytes> {
    (0..16)
        .map(|i| {
            let mut v = vec![0u8; 1 << 20];
            match kind {
                "zeros" => {}
                "pages" => {
                    let mut p = Pages::new();
                    for _ in 0..i {
                        p.fill(&mut [0u8; 8192]);
                    }
                    p.fill(&mut v);
                }
                _ => {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                    for b in v.iter_mut() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *b = x as u8;
                    }
                }
            }
            Bytes::from(v)
        })
        .collect()
}

async fn failover(keepalive_ms: u64) {
    let s = {
        // Enhanced, FastWrite off, no compression, LAN relays.
        let mut st = sites(
            LinkMode::Enhanced,
            false,
            compress::Mode::None,
            Some(WanProfile::lan()),
        )
        .await;
        if keepalive_ms != 20 {
            // Rebuild with other keep-alive settings.
            st.stop().await;
            st = sites_ka(keepalive_ms).await;
        }
        st
    };
    let remote = s.remote.clone();
    let t0 = Instant::now();
    let completions = Arc::new(std::sync::Mutex::new(Vec::<(f64, u32, bool)>::new()));
    let mut handles = Vec::new();
    for w in 0..8u32 {
        let r = remote.clone();
        let c = completions.clone();
        handles.push(tokio::spawn(async move {
            let mut k = 0u32;
            while t0.elapsed() < Duration::from_millis(4000) {
                let lba = (w * 100_000) + (k % 10_000) * 16;
                let data = Bytes::from(vec![(lba % 251) as u8; 8192]);
                let res = r
                    .execute(task(
                        u64::from(w) << 32 | u64::from(k),
                        cdb(true, lba, 16),
                        Some(data),
                        0,
                    ))
                    .await;
                if res.status != Status::GOOD {
                    let key = res.sense.as_ref().and_then(|s| s.get(2)).map(|k| k & 0x0f);
                    let asc = res
                        .sense
                        .as_ref()
                        .and_then(|s| s.get(12..14))
                        .map(<[u8]>::to_vec);
                    eprintln!(
                        "failover: write at {:.3} s: {:?}, sense key {key:?}, ASC/ASCQ {asc:?}",
                        t0.elapsed().as_secs_f64(),
                        res.status
                    );
                }
                c.lock().unwrap().push((
                    t0.elapsed().as_secs_f64(),
                    lba,
                    res.status == Status::GOOD,
                ));
                k += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let cut_at = t0.elapsed().as_secs_f64();
    s.links[1].set_cut(true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.links[1].set_cut(false);
    let restored_at = t0.elapsed().as_secs_f64();
    for h in handles {
        h.await.unwrap();
    }
    let mut c = completions.lock().unwrap().clone();
    c.sort_by(|a, b| a.0.total_cmp(&b.0));
    let errors = c.iter().filter(|x| !x.2).count();
    let gap = |from: f64, to: f64| {
        let mut g = 0f64;
        let mut last = from;
        for (t, _, _) in c.iter().filter(|x| x.0 >= from && x.0 <= to) {
            g = g.max(t - last);
            last = *t;
        }
        g
    };
    let pause_cut = gap(cut_at, cut_at + 1.0);
    let pause_restore = gap(restored_at, restored_at + 1.0);
    let before = gap(0.2, cut_at);
    // Verify every written block.
    let mut bad = 0;
    let mut bad_status = 0;
    let mut seen = std::collections::BTreeMap::new();
    for (_, lba, ok) in &c {
        if *ok {
            seen.insert(*lba, ());
        }
    }
    for (i, lba) in seen.keys().enumerate() {
        let r = remote
            .execute(task(9_000_000 + i as u64, cdb(false, *lba, 16), None, 8192))
            .await;
        let got: Vec<u8> = r.data_in.iter().flat_map(|x| x.iter().copied()).collect();
        if r.status != Status::GOOD {
            bad_status += 1;
        } else if got.len() != 8192 || got.iter().any(|b| *b != (lba % 251) as u8) {
            bad += 1;
        }
    }
    let st = s.tunnel.as_ref().unwrap().stats();
    let failures: Vec<(usize, u64)> = st.circuits.iter().map(|c| (c.slot, c.failures)).collect();
    eprintln!(
        "failover: circuit failures (slot, count): {failures:?}; tunnel {}",
        st.state
    );
    let retrans: u64 = st.circuits.iter().map(|c| c.retransmits).sum();
    let up = st.circuits.iter().filter(|c| c.state == "up").count();
    println!(
        "| keepalive {keepalive_ms} ms, dead {} ms | {} | {:.0} ms | {:.0} ms | {:.1} ms | {errors} | {bad} of {} ({bad_status} verify reads failed) | {retrans} | {up}/2 up, dropped {} |",
        keepalive_ms * 4,
        c.len(),
        pause_cut * 1e3,
        pause_restore * 1e3,
        before * 1e3,
        seen.len(),
        st.dropped,
    );
}

async fn sites_ka(ka: u64) -> Setup {
    // Same as `sites`, with keep-alive `ka` ms and dead after 4 × ka.
    let a = Switch::new(FabricConfig {
        domain: 1,
        switch_name: SW_A,
        ..FabricConfig::default()
    });
    let b = Switch::new(FabricConfig {
        domain: 2,
        switch_name: SW_B,
        ..FabricConfig::default()
    });
    let ca = InterSwitch::start(a.clone());
    let cb = InterSwitch::start(b.clone());
    let acc = CircuitConfig {
        peer: None,
        local: None,
        weight: 1,
    };
    let mut tb = TunnelConfig::new("fcip0", 0, SW_A, vec![acc.clone(), acc]);
    tb.mode = LinkMode::Enhanced;
    tb.keepalive = Duration::from_millis(ka);
    tb.dead_after = Duration::from_millis(4 * ka);
    let (tunnel_b, l, tnode) = site_b(tb, cb, &b, false).await;
    let links: Vec<WanLink> = (0..2)
        .map(|_| {
            WanLink::start(
                "127.0.0.1:0".parse().unwrap(),
                l.local_addr(),
                WanProfile::lan(),
            )
            .unwrap()
        })
        .collect();
    let peer = |i: usize| CircuitConfig {
        peer: Some(links[i].addr()),
        local: None,
        weight: 1,
    };
    let mut ta = TunnelConfig::new("fcip0", 0, SW_B, vec![peer(0), peer(1)]);
    ta.mode = LinkMode::Enhanced;
    ta.keepalive = Duration::from_millis(ka);
    ta.dead_after = Duration::from_millis(4 * ka);
    let tunnel = Tunnel::start(ta, ca);
    let (remote, n) = initiator(&a).await;
    Setup {
        remote,
        tunnel: Some(tunnel),
        far: Some((tunnel_b, l)),
        links,
        _keep: vec![tnode, n],
    }
}

/// The number in environment variable `name`, if set; exits saying it
/// must be `what` when it is anything else or below `min`.
fn env_number(name: &str, what: &str, min: u32) -> Option<u32> {
    let v = std::env::var(name).ok()?;
    match v.parse::<u32>() {
        Ok(n) if n >= min => Some(n),
        _ => {
            eprintln!("{name} must be {what}, not {v:?}");
            std::process::exit(2);
        }
    }
}

/// Both sites share one runtime: `FCIP_WAN_WORKERS` worker threads
/// (default 2, the machine's cores). With one, every hop between the
/// sites' tasks stays on one thread, so the latency part shows what the
/// code costs without the wake-ups of a second, idle thread (see
/// docs/fcip.md).
///
/// `FCIP_WAN_CPU_LATENCY_US=N` holds a CPU wake-up latency request of N µs
/// for the whole run, as a gateway does with `[tuning] cpu_latency_us`
/// (system-wide: the paths without FCIP run under it too). Unset: none.
///
/// `FCIP_WAN_SPIN=N` spawns N tasks that do nothing but yield, so that
/// (with N ≥ workers) no worker thread ever parks: a stand-in for a
/// busy-polling data plane, where a socket's readiness is found by the
/// next `epoll_wait(0)` instead of a wake-up. It slows every path,
/// the one without FCIP included (see docs/fcip.md). Unset: none.
fn main() {
    let workers = env_number("FCIP_WAN_WORKERS", "a positive number", 1).map_or(2, |n| n as usize);
    let spinners = env_number("FCIP_WAN_SPIN", "a number of tasks", 0).unwrap_or(0) as usize;
    let held = env_number("FCIP_WAN_CPU_LATENCY_US", "a number of µs", 0).map(|us| {
        unifab_benches::CpuLatencyRequest::hold(us).unwrap_or_else(|e| {
            eprintln!("FCIP_WAN_CPU_LATENCY_US = {us}: /dev/cpu_dma_latency: {e}");
            std::process::exit(2);
        })
    });
    match &held {
        Some(h) => println!(
            "(CPU wake-up latency request: {} µs, system-wide, for the whole run)",
            h.requested_us()
        ),
        None => println!("(no CPU wake-up latency request)"),
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run(workers, spinners));
}

async fn run(workers: usize, spinners: usize) {
    for _ in 0..spinners {
        tokio::spawn(async {
            loop {
                tokio::task::yield_now().await;
            }
        });
    }
    println!(
        "(both sites on one runtime of {workers} worker threads; {spinners} spinning tasks)\n"
    );
    let what: Vec<String> = std::env::args().skip(1).collect();
    let all = what.is_empty();
    let want = |w: &str| all || what.iter().any(|x| x == w);
    if want("latency") {
        let n = 2000;
        println!("## Latency: 4 KiB writes, QD1 ({n} each; median / p99 µs)\n");
        let l = local().await;
        let (m, p) = qd1(&l, n).await;
        println!("path without FCIP (initiator and target on one switch): {m:.0} / {p:.0} µs");
        l.stop().await;
        let lo = tokio::task::spawn_blocking(move || tcp_rtt(None, n))
            .await
            .unwrap();
        println!(
            "plain TCP round trip on loopback (4 KiB there, 64 B back; the floor under each FCIP round trip): {lo:.0} µs"
        );
        let d = sites(LinkMode::Rfc, false, compress::Mode::None, None).await;
        let (m, p) = qd1(&d, n).await;
        println!("FCIP RFC mode, direct loopback (no relay): {m:.0} / {p:.0} µs");
        d.stop().await;
        let d = sites(LinkMode::Enhanced, false, compress::Mode::None, None).await;
        let (m, p) = qd1(&d, n).await;
        println!("FCIP enhanced mode, direct loopback (no relay): {m:.0} / {p:.0} µs");
        d.stop().await;
        let d = sites(LinkMode::Enhanced, true, compress::Mode::None, None).await;
        let (m, p) = qd1(&d, n).await;
        println!(
            "FCIP enhanced mode with FastWrite, direct loopback (no relay): {m:.0} / {p:.0} µs\n"
        );
        d.stop().await;
        println!(
            "| emulated RTT | link round trip (plain TCP through the relay) | FastWrite off | FastWrite on | off − 2·RTT | on − 1·RTT | off − 2·link | on − 1·link |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for rtt_us in [0u64, 250, 500, 1000] {
            let rtt = Duration::from_micros(rtt_us);
            let p = WanProfile::rtt(rtt, 0);
            let link = tokio::task::spawn_blocking(move || tcp_rtt(Some(p), n))
                .await
                .unwrap();
            let off = sites(
                LinkMode::Enhanced,
                false,
                compress::Mode::None,
                Some(WanProfile::rtt(rtt, 0)),
            )
            .await;
            let (m_off, p_off) = qd1(&off, n).await;
            off.stop().await;
            let on = sites(
                LinkMode::Enhanced,
                true,
                compress::Mode::None,
                Some(WanProfile::rtt(rtt, 0)),
            )
            .await;
            let (m_on, p_on) = qd1(&on, n).await;
            on.stop().await;
            let r = rtt_us as f64;
            println!(
                "| {:.2} ms | {link:.0} µs | {m_off:.0} µs (p99 {p_off:.0}) | {m_on:.0} µs (p99 {p_on:.0}) | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs |",
                r / 1000.0,
                m_off - 2.0 * r,
                m_on - r,
                m_off - 2.0 * link,
                m_on - link
            );
        }
        println!();
    }
    if what.iter().any(|x| x == "overhead") {
        overhead().await;
    }
    if want("throughput") {
        let rate: u64 = 125_000_000 / 2; // 1 Gb/s shared by the two circuits
        println!(
            "## Throughput and compression: 1 MiB writes, QD 8, two circuits of 500 Mb/s each (1 Gb/s link)\n"
        );
        let profile = WanProfile::rtt(Duration::from_micros(500), rate);
        let link = tokio::task::spawn_blocking(move || link_capacity(profile, 2, 4.0))
            .await
            .unwrap();
        println!(
            "The emulated link itself (one plain TCP stream per circuit through the same relays, same run): {link:.1} MB/s\n"
        );
        println!(
            "FastWrite on (the tunnel as deployed); the last row is `none` with FastWrite off.\n"
        );
        println!("| data | mode | MB/s | of the link | ratio | CPU s/GB (whole process) |");
        println!("|---|---|---|---|---|---|");
        for kind in ["zeros", "pages", "random"] {
            let data = dataset(kind);
            for (name, m) in [
                ("none", compress::Mode::None),
                ("lz4", compress::Mode::Lz4),
                ("zstd", compress::Mode::Zstd),
                ("auto", compress::Mode::Auto),
            ] {
                let s = sites(LinkMode::Enhanced, true, m, Some(profile)).await;
                let (mbs, ratio, cpu) = stream(&s, &data, 4.0).await;
                let share = mbs / link * 100.0;
                println!("| {kind} | {name} | {mbs:.1} | {share:.0} % | {ratio:.2} | {cpu:.2} |");
                s.stop().await;
            }
        }
        let s = sites(
            LinkMode::Enhanced,
            false,
            compress::Mode::None,
            Some(profile),
        )
        .await;
        let (mbs, ratio, cpu) = stream(&s, &dataset("random"), 4.0).await;
        s.stop().await;
        let share = mbs / link * 100.0;
        println!(
            "| random | none, FastWrite off | {mbs:.1} | {share:.0} % | {ratio:.2} | {cpu:.2} |"
        );
        println!();
    }
    if want("tape") {
        let rate: u64 = std::env::var("TAPE_RATE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(125_000_000 / 2); // 1 Gb/s shared by the two circuits
        println!(
            "## Tape across the WAN: 64 KiB WRITE(6) one at a time, a filemark at the end, then REWIND and READ(6) of every block one at a time; two circuits of 500 Mb/s each (1 Gb/s link)\n"
        );
        let l = local_with(true).await;
        let (drive, drive_r) = tape_stream(&l, 4.0).await;
        l.stop().await;
        let mut rows = Vec::new();
        for rtt_ms in [0u64, 1, 5] {
            let profile = WanProfile::rtt(Duration::from_millis(rtt_ms), rate);
            let link = tokio::task::spawn_blocking(move || link_capacity(profile, 2, 3.0))
                .await
                .unwrap();
            let off = sites_with(
                LinkMode::Enhanced,
                true,
                Some(false),
                compress::Mode::None,
                Some(profile),
            )
            .await;
            let (m_off, r_off) = tape_stream(&off, 4.0).await;
            off.stop().await;
            let on = sites_with(
                LinkMode::Enhanced,
                true,
                Some(true),
                compress::Mode::None,
                Some(profile),
            )
            .await;
            let (m_on, r_on) = tape_stream(&on, 4.0).await;
            let st = on.tunnel.as_ref().map(|t| t.stats());
            on.stop().await;
            let ceiling = if rtt_ms == 0 {
                "-".to_string()
            } else {
                format!("{:.1} MB/s", 65_536.0 / (rtt_ms as f64 / 1000.0) / 1e6)
            };
            rows.push(format!(
                "| {rtt_ms} ms | {link:.1} MB/s | {ceiling} | {m_off:.1} MB/s ({:.0} %) | {m_on:.1} MB/s ({:.0} %) | {:.0} % | {r_off:.1} MB/s ({:.0} %) | {r_on:.1} MB/s ({:.0} %) | {:.0} % |",
                m_off / link * 100.0,
                m_on / link * 100.0,
                m_on / link.min(drive) * 100.0,
                r_off / link * 100.0,
                r_on / link * 100.0,
                r_on / link.min(drive_r) * 100.0
            ));
            if let Some(st) = st {
                eprintln!("tape pipelining at {rtt_ms} ms: {:?}", st.tape);
            }
        }
        println!(
            "The drive without FCIP (initiator and target on one switch, same blocks one at a time, same run): writes {drive:.1} MB/s, reads {drive_r:.1} MB/s\n"
        );
        println!(
            "| emulated RTT | the link itself (same run) | one block per round trip | writes, pipelining off (of the link) | writes, on (of the link) | of min(link, drive) | reads, off (of the link) | reads, on: read-ahead (of the link) | of min(link, drive) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!("{r}");
        }
        println!();
    }
    if want("failover") {
        println!("## Failover: 8 writers of 8 KiB, circuit 2 black-holed at 1 s for 1.5 s\n");
        println!(
            "| settings | I/Os | longest pause after the cut | after the restore | longest gap before | I/O errors | bad blocks | batches resent | circuits at the end |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        failover(20).await;
        failover(10).await;
        println!();
    }
}
