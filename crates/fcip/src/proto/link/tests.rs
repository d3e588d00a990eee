use super::*;
use unifab_fc::wire::Eof;

/// A switch of domain `domain` with nothing else known and no zoning.
fn switch(domain: u8) -> LocalSwitch {
    let name = Wwn(0x1000_0000_0000_0000 | u64::from(domain));
    LocalSwitch {
        domain,
        switch_name: name,
        port_name: Wwn(name.0 | 0x8001),
        domains: vec![(domain, name)],
        zoning: ZoneDb { active: None },
        r_a_tov: 10_000,
        e_d_tov: 2_000,
    }
}

/// A driver that records what the link does: circuits take writes while
/// `room` says so, each write noted as (circuit, frames) and its frames
/// encoded as a connection would carry them (`wire`, for a back-to-back
/// peer to receive).
#[derive(Default)]
struct Record {
    domain: u8,
    room: bool,
    writes: Vec<(usize, usize)>,
    wire: Vec<(usize, Bytes)>,
    dropped: u64,
    fabric: Vec<Frame>,
    events: Vec<Event>,
}

impl LinkIo for Record {
    fn has_room(&self, _slot: usize, _writes: usize) -> bool {
        self.room
    }
    fn write(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool {
        if !self.room {
            return false;
        }
        self.writes.push((slot, frames.len()));
        for (f, _) in frames {
            let b = crate::wire::frame::FcipFrameRepr::new(f)
                .to_bytes()
                .unwrap();
            self.wire.push((slot, Bytes::from(b)));
        }
        true
    }
    fn dropped(&mut self, n: u64) {
        self.dropped += n;
    }
    fn to_fabric(&mut self, f: Frame) {
        self.fabric.push(f);
    }
    fn to_controller(&mut self, _f: Frame) {}
    fn fspf(&mut self, _r: SwIlsRepr) {}
    fn apply_zoning(&mut self, _z: ZoneDb) {}
    fn local_switch(&self) -> LocalSwitch {
        switch(self.domain.max(1))
    }
    fn event(&mut self, e: Event) {
        self.events.push(e);
    }
}

fn config(enhanced: bool, circuits: usize) -> LinkConfig {
    LinkConfig {
        name: "to-b".into(),
        enhanced,
        weights: vec![1; circuits],
        compression: compress::Mode::None,
        fastwrite: false,
        tape_pipelining: false,
        originates: true,
        window_bytes: 64 << 10,
        keepalive: Duration::from_secs(1),
        dead_after: Duration::from_secs(3),
        k_a_tov: 5_000,
        port_no: 1,
    }
}

fn class_f() -> Frame {
    Frame {
        sof: Sof::F,
        header: FcHeaderRepr {
            fc_type: FcType::SW_ILS,
            ..FcHeaderRepr::default()
        },
        payload: Bytes::from(vec![0u8; 2048]),
        eof: Eof::T,
    }
}

/// Delivers what each end wrote to the other until both are quiet.
fn settle(a: &mut Link, ea: &mut Record, b: &mut Link, eb: &mut Record, now: Instant) {
    for _ in 0..100 {
        if ea.wire.is_empty() && eb.wire.is_empty() {
            return;
        }
        for (s, f) in std::mem::take(&mut ea.wire) {
            b.from_circuit(s, Item::Frame(f), now, eb);
        }
        for (s, f) in std::mem::take(&mut eb.wire) {
            a.from_circuit(s, Item::Frame(f), now, ea);
        }
    }
    panic!("the two links never went quiet");
}

/// Two links back to back, in both modes: the E_Port exchange brings
/// both VE_Ports up (each sees the other's domain), and class 3 frames
/// from A's fabric reach B's, all of them and in order, over two
/// circuits (enhanced: in numbered batches; RFC: by exchange).
#[test]
fn two_links_come_up_and_carry_frames_in_order() {
    for enhanced in [false, true] {
        let now = Instant::now();
        let mut cb = config(enhanced, 2);
        cb.originates = false;
        let (mut a, mut b) = (Link::new(config(enhanced, 2), now), Link::new(cb, now));
        let wired = |domain| Record {
            domain,
            room: true,
            ..Record::default()
        };
        let (mut ea, mut eb) = (wired(1), wired(2));
        let caps = enhanced.then_some(Capabilities(Capabilities::ENHANCED));
        let slots: &[usize] = if enhanced { &[1, 2] } else { &[0, 1, 2] };
        for &s in slots {
            b.circuit_up(s, caps, now, &mut eb);
            a.circuit_up(s, caps, now, &mut ea);
        }
        settle(&mut a, &mut ea, &mut b, &mut eb, now);
        let up = |e: &Record| {
            e.events.iter().find_map(|e| match e {
                Event::Up { domain, .. } => Some(*domain),
                _ => None,
            })
        };
        assert_eq!(
            (up(&ea), up(&eb)),
            (Some(2), Some(1)),
            "enhanced {enhanced}"
        );
        assert!(a.is_up() && b.is_up() && a.enhanced() == enhanced);
        let frames: Vec<Frame> = (0..200u16)
            .map(|ox| Frame {
                sof: Sof::I3,
                header: FcHeaderRepr {
                    fc_type: FcType::FCP,
                    r_ctl: unifab_fc::wire::RCtl::FCP_DATA,
                    s_id: FcId::new(0x01_0001),
                    d_id: FcId::new(0x02_0001),
                    ox_id: OxId(ox % 7),
                    parameter: u32::from(ox),
                    ..FcHeaderRepr::default()
                },
                payload: Bytes::from(vec![ox as u8; 1024]),
                eof: Eof::T,
            })
            .collect();
        for chunk in frames.chunks(50) {
            a.from_fabric(chunk.to_vec(), &mut ea);
            settle(&mut a, &mut ea, &mut b, &mut eb, now);
        }
        assert_eq!((ea.dropped, eb.dropped), (0, 0), "frames dropped");
        let got: Vec<(u16, u32)> = eb
            .fabric
            .iter()
            .map(|f| (f.header.ox_id.0, f.header.parameter))
            .collect();
        if enhanced {
            let want: Vec<(u16, u32)> = (0..200u16).map(|ox| (ox % 7, u32::from(ox))).collect();
            assert_eq!(got, want);
        } else {
            // RFC mode keeps order within an exchange.
            assert_eq!(got.len(), 200);
            for ox in 0..7 {
                let one: Vec<u32> = got.iter().filter(|g| g.0 == ox).map(|g| g.1).collect();
                assert!(one.windows(2).all(|w| w[0] < w[1]), "{one:?}");
            }
        }
    }
}

/// Enhanced mode: class F is not held back by the window, but a peer
/// that acknowledges nothing cannot make it pile up without bound.
/// Up to `peer_bound` unacknowledged bytes it is kept (to be sent once
/// a circuit has room); past it, each class F frame is dropped and
/// counted; an acknowledgement makes room again.
#[test]
fn class_f_past_the_peer_bound_is_dropped_and_counted() {
    let cfg = config(true, 1);
    let bound = cfg.peer_bound();
    let mut a = Link::new(cfg, Instant::now());
    let mut io = Record::default();
    // Enhanced mode negotiated, and no circuit takes anything: the
    // peer acknowledges nothing.
    a.enhanced = true;
    let mut kept = 0;
    while a.send.in_flight() <= bound {
        a.class_f(class_f(), &mut io);
        kept += 1;
        assert_eq!(io.dropped, 0, "dropped within the bound");
    }
    // Past the window (64 KiB) by far: class F is not held by it.
    assert!(kept > 1000, "{kept} frames kept");
    assert!(a.has_unsent());
    let held = a.send.in_flight();
    assert!(held <= bound + 2 * 1024 + 64, "{held} > {bound}");
    for n in 1..=100 {
        a.class_f(class_f(), &mut io);
        assert_eq!(io.dropped, n);
    }
    assert_eq!(a.send.in_flight(), held, "nothing more kept");
    // The peer acknowledges everything: class F is kept again.
    let all = a.send.acked() + a.send.outstanding() as u64;
    assert_eq!(a.send.on_ack(all), held);
    a.class_f(class_f(), &mut io);
    assert_eq!(io.dropped, 100);
    assert!(a.send.in_flight() > 0);
}

/// RFC mode: the link starts when the class F connection is up, and
/// losing it takes the link down and closes the data circuits with it;
/// frames from the fabric while the link is not up are dropped and
/// counted.
#[test]
fn rfc_class_f_loss_closes_the_data_circuits() {
    let now = Instant::now();
    let mut a = Link::new(config(false, 2), now);
    let mut io = Record {
        room: true,
        ..Record::default()
    };
    a.circuit_up(1, None, now, &mut io);
    assert!(io.events.is_empty(), "no link without class F");
    a.circuit_up(2, None, now, &mut io);
    a.circuit_up(0, None, now, &mut io);
    assert_eq!(io.events, vec![Event::Negotiating { fastwrite: false }]);
    // The E_Port's first request (ELP) went out on class F.
    assert_eq!(io.writes, vec![(0, 1)]);
    a.from_fabric(vec![class_f()], &mut io);
    assert_eq!(io.dropped, 1, "not up: dropped");
    io.events.clear();
    a.circuit_down(0, "closed by the peer", &mut io);
    assert_eq!(
        io.events,
        vec![
            Event::Down {
                why: "closed by the peer".into(),
                was_up: false,
                isolated: false,
            },
            Event::Close {
                slot: 1,
                why: "class F connection lost".into(),
            },
            Event::Down {
                why: "class F connection lost".into(),
                was_up: false,
                isolated: false,
            },
            Event::Close {
                slot: 2,
                why: "class F connection lost".into(),
            },
            Event::Down {
                why: "class F connection lost".into(),
                was_up: false,
                isolated: false,
            },
        ]
    );
    assert!(a.paths.is_empty());
}

/// Enhanced mode: a circuit silent past the dead interval while another
/// is heard is closed, and its unacknowledged batches go out again on
/// the survivor; when every circuit falls silent together none is
/// closed before K_A_TOV.
#[test]
fn a_silent_circuit_is_closed_and_its_batches_resent() {
    let t0 = Instant::now();
    let mut a = Link::new(config(true, 2), t0);
    let mut io = Record {
        room: true,
        ..Record::default()
    };
    let caps = Some(Capabilities(Capabilities::ENHANCED));
    a.circuit_up(1, caps, t0, &mut io);
    a.circuit_up(2, caps, t0, &mut io);
    assert!(a.enhanced());
    // Batches in flight on both circuits.
    a.up = Some(2);
    let data = || Frame {
        sof: Sof::I3,
        ..class_f()
    };
    for _ in 0..4 {
        a.from_fabric(vec![data()], &mut io);
    }
    let on = |io: &Record, s| io.writes.iter().filter(|w| w.0 == s).count();
    assert!(on(&io, 1) > 0 && on(&io, 2) > 0);
    // Every circuit silent, but within K_A_TOV: none closed.
    let t1 = t0 + Duration::from_secs(4);
    a.tick(t1, &mut io);
    let closed = |io: &Record| io.events.iter().any(|e| matches!(e, Event::Close { .. }));
    assert!(!closed(&io));
    // Circuit 2 is heard again: circuit 1 gets a whole dead interval
    // from now to be heard too.
    let hear = |a: &mut Link, s: usize, t: Instant| {
        if let Some(p) = a.paths.get_mut(&s) {
            p.last_rx = t;
        }
    };
    hear(&mut a, 2, t1 + Duration::from_secs(3));
    a.tick(t1 + Duration::from_secs(4), &mut io);
    assert!(!closed(&io));
    // It is not; circuit 2 is: circuit 1 is closed and its batches go
    // out again on circuit 2.
    hear(&mut a, 2, t1 + Duration::from_secs(8));
    io.writes.clear();
    a.tick(t1 + Duration::from_secs(8), &mut io);
    assert!(
        io.events.contains(&Event::Close {
            slot: 1,
            why: "keep-alive timeout (nothing received)".into(),
        }),
        "{:?}",
        io.events
    );
    let resent = io.events.iter().find_map(|e| match e {
        Event::Retransmits { slot: 1, n } => Some(*n),
        _ => None,
    });
    assert!(resent.is_some_and(|n| n > 0), "{:?}", io.events);
    assert!(io.writes.iter().all(|w| w.0 == 2), "{:?}", io.writes);
    assert!(a.paths.len() == 1 && a.paths.contains_key(&2));
}

/// The delayed ack: a data batch makes an ack due after `ACK_DELAY`;
/// a batch toward the peer carries it instead; `ACK_EVERY` batches
/// send it at once.
#[test]
fn acks_are_delayed_carried_or_sent_every_n_batches() {
    let t0 = Instant::now();
    let mut a = Link::new(config(true, 1), t0);
    let mut io = Record {
        room: true,
        ..Record::default()
    };
    a.circuit_up(1, Some(Capabilities(Capabilities::ENHANCED)), t0, &mut io);
    a.up = Some(2);
    let batch = |seq: u64| {
        let mut body = BytesMut::new();
        put_record(
            &mut body,
            &Frame {
                sof: Sof::I3,
                ..class_f()
            },
            0,
        );
        let body = body.freeze();
        let h = BatchHeader {
            kind: BatchKind::DATA.0,
            codec: Codec::NONE,
            seq,
            raw_len: body.len() as u32,
            wire_len: body.len() as u32,
            ..BatchHeader::default()
        };
        enhanced::fragments(&h, &body)
    };
    let deliver = |a: &mut Link, io: &mut Record, seq: u64, now: Instant| {
        for f in batch(seq) {
            let b = crate::wire::frame::FcipFrameRepr::new(f)
                .to_bytes()
                .unwrap();
            a.from_circuit(1, Item::Frame(Bytes::from(b)), now, io);
        }
    };
    deliver(&mut a, &mut io, 1, t0);
    assert_eq!(io.fabric.len(), 1, "the frame reached the fabric");
    assert_eq!(a.ack_at, Some(t0 + ACK_DELAY));
    // A batch toward the peer carries the ack.
    a.from_fabric(
        vec![Frame {
            sof: Sof::I3,
            ..class_f()
        }],
        &mut io,
    );
    assert_eq!(a.ack_at, None);
    deliver(&mut a, &mut io, 2, t0);
    a.on_ack_timer(&mut io);
    assert_eq!(
        io.events
            .iter()
            .filter(|e| **e == Event::StandaloneAck)
            .count(),
        1
    );
    for seq in 3..3 + u64::from(ACK_EVERY) {
        deliver(&mut a, &mut io, seq, t0);
    }
    assert_eq!(
        io.events
            .iter()
            .filter(|e| **e == Event::StandaloneAck)
            .count(),
        2,
        "the sixteenth batch is acked at once"
    );
    assert_eq!(a.ack_at, None);
}
