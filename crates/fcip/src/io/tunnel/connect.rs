//! Bringing a circuit up: the FCIP special frame exchange on a new TCP
//! connection (RFC 3821 §7), the connection's socket options, and the loop
//! that reconnects a circuit this end originates.

use super::*;

/// The connection slots a tunnel uses.
pub(super) fn slots(cfg: &TunnelConfig) -> Vec<usize> {
    let n = cfg.circuits.len();
    match cfg.mode {
        LinkMode::Rfc => (0..=n).collect(),
        LinkMode::Enhanced => (1..=n).collect(),
    }
}

pub(super) fn capabilities(cfg: &TunnelConfig) -> Capabilities {
    let mut c = Capabilities::ENHANCED | Capabilities::LZ4 | Capabilities::ZSTD;
    if cfg.fastwrite {
        c |= Capabilities::FASTWRITE;
        if cfg.tape_pipelining {
            c |= Capabilities::TAPE | Capabilities::READ_AHEAD;
        }
    }
    Capabilities(c)
}

/// The entity identifier this side announces.
pub fn entity_id(cfg: &TunnelConfig) -> EntityId {
    match cfg.mode {
        LinkMode::Rfc => EntityId(u64::from(cfg.number)),
        LinkMode::Enhanced => EntityId::unifab(capabilities(cfg), cfg.number),
    }
}

pub(super) fn hello(cfg: &TunnelConfig) -> Hello {
    Hello {
        capabilities: capabilities(cfg).0,
        fastwrite: cfg.fastwrite,
        fastwrite_table: DEFAULT_TABLE as u16,
        fastwrite_max_bytes: DEFAULT_MAX_BYTES,
    }
}

/// The encoded frames of a hello batch.
pub fn hello_bytes(cfg: &TunnelConfig) -> Vec<u8> {
    let body = Bytes::copy_from_slice(&hello(cfg).to_bytes());
    let h = BatchHeader {
        kind: BatchKind::HELLO.0,
        raw_len: body.len() as u32,
        wire_len: body.len() as u32,
        ..BatchHeader::default()
    };
    let mut out = Vec::new();
    for f in enhanced::fragments(&h, &body) {
        if let Ok(b) = FcipFrameRepr::new(f).to_bytes() {
            out.extend(b);
        }
    }
    out
}

/// A duplicate of the socket's descriptor, for writes that bypass the
/// writer task (the socket stays non-blocking: the flag is shared).
pub fn direct_handle(s: &TcpStream) -> Option<socket2::Socket> {
    use std::os::fd::AsFd;
    s.as_fd()
        .try_clone_to_owned()
        .ok()
        .map(socket2::Socket::from)
}

/// Sets TCP_NODELAY and returns the raw fd.
pub fn prepare(s: &TcpStream) -> i32 {
    let _ = s.set_nodelay(true);
    use std::os::fd::AsRawFd;
    s.as_raw_fd()
}

pub(super) async fn read_exact_timeout(
    s: &mut (impl AsyncRead + Unpin),
    buf: &mut [u8],
    t: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(t, s.read_exact(buf)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Err(_) => Err("timed out".into()),
    }
}

/// Connects slot `slot` once: TCP (and TLS), special frame, echo, and in
/// enhanced mode the peer's hello.
pub(super) async fn connect_once(
    cfg: &TunnelConfig,
    c: &CircuitConfig,
    slot: usize,
    local_wwn: Wwn,
) -> Result<Conn, String> {
    let peer = c.peer.ok_or("circuit has no peer address")?;
    let sock = if peer.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| e.to_string())?;
    if let Some(l) = c.local {
        sock.bind(l).map_err(|e| format!("bind {l}: {e}"))?;
    }
    let tcp = tokio::time::timeout(Duration::from_secs(5), sock.connect(peer))
        .await
        .map_err(|_| format!("connect {peer}: timed out"))?
        .map_err(|e| format!("connect {peer}: {e}"))?;
    let fd = prepare(&tcp);
    let direct = if cfg.tls.is_none() {
        direct_handle(&tcp)
    } else {
        None
    };
    let mut stream: Box<dyn Stream> = match &cfg.tls {
        Some(t) => t.connect(tcp).await?,
        None => Box::new(tcp),
    };
    let usage = match (cfg.mode, slot) {
        (LinkMode::Rfc, 0) => UsageFlags::class_f(),
        (LinkMode::Rfc, _) => UsageFlags::class_3(),
        (LinkMode::Enhanced, _) => UsageFlags(UsageFlags::CLASS_F | UsageFlags::CLASS_3),
    };
    let fsf = SpecialFrameRepr {
        changed: false,
        source_wwn: local_wwn,
        entity_id: entity_id(cfg),
        nonce: rand::random(),
        usage_flags: usage,
        usage_code: slot as u16,
        destination_wwn: cfg.peer_wwn,
        k_a_tov: cfg.k_a_tov,
        flags: EncapFlags(0),
        timestamp_seconds: 0,
        timestamp_fraction: 0,
    };
    let sent = fsf.to_bytes();
    stream.write_all(&sent).await.map_err(|e| e.to_string())?;
    let mut echo = [0u8; 76];
    read_exact_timeout(&mut stream, &mut echo, Duration::from_secs(10)).await?;
    check_echo(&sent, &echo).map_err(|e| e.to_string())?;
    let mut leftover = Bytes::new();
    let mut peer_caps = None;
    if cfg.mode == LinkMode::Enhanced {
        // The acceptor's hello must follow at once.
        let mut dec = Decoder::new(DecoderConfig::default());
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut buf = vec![0u8; 4096];
        let got = loop {
            match dec.decode() {
                Ok(Some(Item::Frame(b))) => break Some(b),
                Ok(Some(Item::Special(_))) | Err(_) => break None,
                Ok(None) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => dec.extend(&buf[..n]),
                _ => break None,
            }
        };
        let hello = got
            .as_ref()
            .and_then(|b| FcipFrame::new_checked(b.clone()).ok())
            .and_then(|f| f.to_fc_frame().ok())
            .filter(|f| enhanced::is_fragment(&f.header))
            .and_then(|f| {
                let h = BatchHeader::parse(&f.payload).ok()?;
                let body = f.payload.get(enhanced::BATCH_HEADER_LEN..)?;
                (h.kind == BatchKind::HELLO.0).then(|| Hello::parse(body).ok())?
            });
        if let Some(h) = hello {
            let mut caps = h.capabilities;
            if !h.fastwrite {
                caps &= !Capabilities::FASTWRITE;
            }
            peer_caps = Some(Capabilities(caps));
        } else {
            return Err(format!(
                "{peer} did not answer with unifab enhanced mode (an RFC 3821 peer?): configure mode = \"rfc\" for this tunnel"
            ));
        }
        // Anything after the hello belongs to the stream.
        let mut rest = BytesMut::new();
        if let Some(h) = got {
            rest.extend_from_slice(&h);
        }
        rest.extend_from_slice(&dec.buffer_mut().split());
        leftover = rest.freeze();
    }
    Ok(Conn {
        stream,
        peer,
        fd,
        fsf,
        leftover,
        peer_caps,
        direct,
    })
}

/// Keeps one circuit connected: connects, hands the connection to the
/// tunnel, waits for it to close, and connects again (with backoff after a
/// failure), until the tunnel stops or the circuit is removed (`stop`).
pub(super) async fn connect_loop(
    cfg: Arc<TunnelConfig>,
    circuit: CircuitConfig,
    slot: usize,
    local_wwn: Wwn,
    ev: mpsc::Sender<Ev>,
    stats: Arc<Mutex<TunnelStats>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    // A peer that stays unreachable is logged when it first fails and
    // then once a minute, with the count; its coming back, once.
    let mut failing: Option<(Instant, u64)> = None;
    loop {
        // A stopped tunnel (or one whose task has ended: the sender is
        // gone) makes no more connections.
        let attempt = tokio::select! {
            r = connect_once(&cfg, &circuit, slot, local_wwn) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match attempt {
            Ok(conn) => {
                backoff = Duration::from_millis(100);
                if let Some((_, n)) = failing.take() {
                    info!(tunnel = %cfg.name, slot, failed_attempts = n, "circuit connects again");
                }
                let (done_tx, done_rx) = oneshot::channel();
                if ev.send(Ev::Up(slot, conn, Some(done_tx))).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = done_rx => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
            Err(e) => {
                let n = failing.map_or(0, |(_, n)| n) + 1;
                match failing {
                    Some((since, _)) if since.elapsed() < Duration::from_secs(60) => {
                        debug!(tunnel = %cfg.name, slot, error = %e, "circuit connect failed");
                        failing = Some((since, n));
                    }
                    _ => {
                        warn!(tunnel = %cfg.name, slot, error = %e, failed_attempts = n, "circuit cannot connect; retrying");
                        failing = Some((Instant::now(), n));
                    }
                }
                let _ = ev.try_send(Ev::ConnectFailed(slot, e.clone()));
                if e.contains("configure mode") {
                    warn!(tunnel = %cfg.name, slot, error = %e, "tunnel refused");
                    if let Ok(mut s) = stats.lock() {
                        s.state = format!("down: {e}");
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        if ev.is_closed() {
            return;
        }
    }
}
