//! Peers that misbehave are refused and the other tunnels are untouched:
//! a special frame for another switch, a replayed nonce, a special frame
//! from a switch no tunnel is for, garbage after the handshake, and TLS
//! with the wrong pre-shared key; and a flood of connections that never
//! send a special frame.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::Switch;
use unifab_fc::wire::Wwn;
use unifab_fcip::io::tls::TlsSettings;
use unifab_fcip::io::{CircuitConfig, InterSwitch, Listener, Tunnel, TunnelConfig};
use unifab_fcip::wire::fsf::{EntityId, SpecialFrameRepr, UsageFlags};

const SW_A: Wwn = Wwn(0x1000_0000_0000_00a1);
const SW_B: Wwn = Wwn(0x1000_0000_0000_00b1);
const SW_X: Wwn = Wwn(0x1000_0000_0000_00c1);

fn switch(domain: u8, name: Wwn) -> Switch {
    Switch::new(FabricConfig {
        domain,
        switch_name: name,
        ..FabricConfig::default()
    })
}

fn acc(n: usize) -> Vec<CircuitConfig> {
    (0..n)
        .map(|_| CircuitConfig {
            peer: None,
            local: None,
            weight: 1,
        })
        .collect()
}

/// B listens with tunnels for A (up, through a real tunnel) and for X
/// (the misbehaving peer plays X). Returns B's listener, A's tunnel and
/// B's tunnel to X.
async fn setup(
    tls_b: Option<Arc<TlsSettings>>,
    tls_a: Option<Arc<TlsSettings>>,
) -> (Listener, Tunnel, Tunnel) {
    let b = switch(2, SW_B);
    let cb = InterSwitch::start(b.clone());
    let tb_a = Tunnel::start(TunnelConfig::new("to-a", 0, SW_A, acc(1)), cb.clone());
    let tb_x = Tunnel::start(TunnelConfig::new("to-x", 1, SW_X, acc(1)), cb);
    let l = Listener::start(
        "127.0.0.1:0".parse().unwrap(),
        SW_B,
        vec![tb_a, tb_x.clone()],
        tls_b,
    )
    .await
    .unwrap();
    let a = switch(1, SW_A);
    let ca = InterSwitch::start(a);
    let mut cfg = TunnelConfig::new(
        "to-b",
        0,
        SW_B,
        vec![CircuitConfig {
            peer: Some(l.local_addr()),
            local: None,
            weight: 1,
        }],
    );
    cfg.tls = tls_a;
    let ta = Tunnel::start(cfg, ca);
    (l, ta, tb_x)
}

async fn wait_up(t: &Tunnel) -> bool {
    for _ in 0..200 {
        if t.stats().state.starts_with("up") {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn fsf(nonce: u64, dest: Wwn, usage_code: u16) -> [u8; 76] {
    SpecialFrameRepr {
        changed: false,
        source_wwn: SW_X,
        entity_id: EntityId(1),
        nonce,
        usage_flags: UsageFlags::class_f(),
        usage_code,
        destination_wwn: dest,
        k_a_tov: 10_000,
        ..SpecialFrameRepr::default()
    }
    .to_bytes()
}

/// Sends `first` and reads until the peer closes; returns what came back.
async fn exchange(addr: std::net::SocketAddr, first: &[u8], then: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(first).await.unwrap();
    let _ = s.write_all(then).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_peers_are_refused_and_other_tunnels_are_untouched() {
    let (l, ta, tb_x) = setup(None, None).await;
    assert!(wait_up(&ta).await, "{:?}", ta.stats());
    let addr = l.local_addr();
    // The listener closes a refused connection, then records why: wait
    // for the record.
    let refusal = |n: u64| {
        let l = &l;
        async move {
            for _ in 0..200 {
                let st = l.stats();
                if st.refused >= n {
                    return st.last_refusal;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("refusal {n} never recorded: {:?}", l.stats());
        }
    };
    // 1. An FSF for another switch: closed without an echo.
    let got = exchange(addr, &fsf(1, Wwn(0x1234), 0), &[]).await;
    assert!(got.is_empty());
    let why = refusal(1).await;
    assert!(why.contains("is for switch"), "{why}");
    // 2. A valid FSF is echoed; the same nonce again is refused.
    let good = fsf(2, SW_B, 0);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&good).await.unwrap();
    let mut echo = [0u8; 76];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(echo, good, "unchanged echo");
    // 3. Garbage after the handshake: the connection is dropped.
    s.write_all(&vec![0x5a; 20_000]).await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "garbage did not close the connection");
    let got = exchange(addr, &good, &[]).await;
    assert!(got.is_empty(), "a replayed nonce was echoed");
    let why = refusal(2).await;
    assert!(why.contains("replayed"), "{why}");
    // 4. A switch no tunnel is for.
    let mut unknown = SpecialFrameRepr::parse(
        &unifab_fcip::wire::fsf::SpecialFrame::new_checked(&fsf(3, SW_B, 0)[..]).unwrap(),
    );
    unknown.source_wwn = Wwn(0x1000_0000_0000_00dd);
    let got = exchange(addr, &unknown.to_bytes(), &[]).await;
    assert!(got.is_empty());
    let why = refusal(3).await;
    assert!(why.contains("no tunnel"), "{why}");
    // 5. Not even a special frame.
    let got = exchange(addr, &[0u8; 76], &[]).await;
    assert!(got.is_empty());
    refusal(4).await;
    // The good tunnel never noticed.
    let st = ta.stats();
    assert!(st.state.starts_with("up"), "{st:?}");
    assert!(st.circuits.iter().all(|c| c.failures == 0), "{st:?}");
    assert!(!tb_x.stats().state.starts_with("up"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_pre_shared_key_and_a_wrong_key_refused() {
    let right = Arc::new(TlsSettings::pre_shared_key(b"sixteen-byte-key-for-the-test").unwrap());
    let wrong = Arc::new(TlsSettings::pre_shared_key(b"another-sixteen-byte-key!!").unwrap());
    let (l, ta, _) = setup(Some(right.clone()), Some(right)).await;
    assert!(
        wait_up(&ta).await,
        "PSK TLS tunnel comes up: {:?}",
        ta.stats()
    );
    // A peer with the wrong key.
    let a = switch(3, SW_X);
    let ca = InterSwitch::start(a);
    let mut cfg = TunnelConfig::new(
        "to-b",
        1,
        SW_B,
        vec![CircuitConfig {
            peer: Some(l.local_addr()),
            local: None,
            weight: 1,
        }],
    );
    cfg.tls = Some(wrong);
    let tx = Tunnel::start(cfg, ca);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!tx.stats().state.starts_with("up"), "{:?}", tx.stats());
    assert!(
        l.stats().last_refusal.contains("key") || l.stats().last_refusal.contains("TLS"),
        "{:?}",
        l.stats()
    );
    // Plain TCP to a TLS listener is refused too.
    let got = exchange(l.local_addr(), &fsf(9, SW_B, 0), &[]).await;
    assert!(got.is_empty() || got[0] == 0x15, "no FCIP echo without TLS");
    let st = ta.stats();
    assert!(
        st.state.starts_with("up") && st.circuits.iter().all(|c| c.failures == 0),
        "{st:?}"
    );
}

struct Pki {
    ca: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&key).unwrap();
        Pki { ca, key }
    }

    /// TLS settings for a site named `me` that expects `peer`.
    fn site(&self, me: &str, peer: &str) -> Arc<TlsSettings> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![me.to_string()])
            .unwrap()
            .signed_by(&key, &self.ca, &self.key)
            .unwrap();
        Arc::new(
            TlsSettings::mutual(
                cert.pem().as_bytes(),
                key.serialize_pem().as_bytes(),
                self.ca.pem().as_bytes(),
                peer,
            )
            .unwrap(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_mutual_certificates_and_a_foreign_certificate_refused() {
    let pki = Pki::new();
    let (l, ta, _) = setup(
        Some(pki.site("site-b", "site-a")),
        Some(pki.site("site-a", "site-b")),
    )
    .await;
    assert!(
        wait_up(&ta).await,
        "mutual-certificate tunnel comes up: {:?}",
        ta.stats()
    );
    // A certificate from another CA.
    let other = Pki::new();
    let x = switch(3, SW_X);
    let cx = InterSwitch::start(x);
    let mut cfg = TunnelConfig::new(
        "to-b",
        1,
        SW_B,
        vec![CircuitConfig {
            peer: Some(l.local_addr()),
            local: None,
            weight: 1,
        }],
    );
    cfg.tls = Some(other.site("site-x", "site-b"));
    let tx = Tunnel::start(cfg, cx);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!tx.stats().state.starts_with("up"), "{:?}", tx.stats());
    assert!(l.stats().last_refusal.contains("TLS"), "{:?}", l.stats());
    let st = ta.stats();
    assert!(
        st.state.starts_with("up") && st.circuits.iter().all(|c| c.failures == 0),
        "{st:?}"
    );
}

/// Connections that connect and say nothing may hold at most
/// `MAX_HANDSHAKES` exchanges open; the next is closed at once and
/// counted. The tunnel that was up stays up, and once the idle ones go a
/// new connection is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_silent_connections_is_bounded() {
    use unifab_fcip::io::listener::MAX_HANDSHAKES;
    let (l, ta, _tb_x) = setup(None, None).await;
    assert!(wait_up(&ta).await, "{:?}", ta.stats());
    let refused = l.stats().refused;
    let mut idle = Vec::new();
    for _ in 0..MAX_HANDSHAKES {
        idle.push(TcpStream::connect(l.local_addr()).await.unwrap());
    }
    // The listener takes them in the order they came: wait until one more
    // is refused at once (closed without a byte).
    let mut extra = TcpStream::connect(l.local_addr()).await.unwrap();
    let mut got = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), extra.read_to_end(&mut got))
        .await
        .expect("the connection beyond the limit was not closed");
    assert!(n.is_ok() || got.is_empty(), "{n:?}");
    assert!(got.is_empty());
    let st = l.stats();
    assert_eq!(st.refused, refused + 1, "{st:?}");
    assert!(st.last_refusal.contains("in progress"), "{st:?}");
    assert!(ta.stats().state.starts_with("up"), "{:?}", ta.stats());
    // The idle ones go; the listener serves again (a special frame
    // without a destination is answered with ours, then closed).
    drop(idle);
    let mut served = false;
    for i in 0..100 {
        let got = exchange(l.local_addr(), &fsf(1000 + i, Wwn(0), 0), &[]).await;
        if !got.is_empty() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "{:?}", l.stats());
}
