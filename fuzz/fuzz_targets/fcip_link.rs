//! Two FCIP links (`proto::link::Link`) joined back to back, driven by the
//! input: the E_Port exchange runs for real between them, and the input
//! decides what the "network" does with each frame (deliver, drop,
//! duplicate, corrupt a byte), when circuits come up and go, what the
//! fabrics send, when writers are full, and how time passes; it may also
//! inject frames of its own on either side.
//!
//! Checked, beside "no panic":
//! - a link writes only to circuits its driver has up, and asks to close
//!   only those;
//! - frames it hands to its fabric or controller, and frames it writes,
//!   encode for a connection (or are refused as too long, which the
//!   driver counts);
//! - while both ends deliver everything intact and no circuit goes, an
//!   enhanced link (without FastWrite, which makes frames of its own)
//!   hands the far fabric the class 3 frames of this fabric in the order
//!   they were sent, none twice.
#![no_main]

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FcHeaderRepr, FcType};
use unifab_fc::wire::{Eof, FcId, OxId, RCtl, Sof, Wwn};
use unifab_fcip::codec::Item;
use unifab_fcip::proto::compress::Mode;
use unifab_fcip::proto::eport::{LocalSwitch, ZoneDb};
use unifab_fcip::proto::link::{Event, Link, LinkConfig, LinkIo};
use unifab_fcip::wire::framing::encode;
use unifab_fcip::wire::fsf::Capabilities;
use unifab_fcip::wire::sw_ils::SwIlsRepr;

/// One end's driver: the circuits it has up, what its link wrote (per
/// circuit, in order), and what reached its fabric.
struct End {
    domain: u8,
    up: BTreeSet<usize>,
    room: bool,
    wire: VecDeque<(usize, Bytes)>,
    fabric: Vec<Frame>,
    closes: Vec<usize>,
    link_up: bool,
}

impl End {
    fn new(domain: u8) -> End {
        End {
            domain,
            up: BTreeSet::new(),
            room: true,
            wire: VecDeque::new(),
            fabric: Vec::new(),
            closes: Vec::new(),
            link_up: false,
        }
    }
}

fn one_buffer(f: Frame) -> Option<Bytes> {
    let (three, _) = encode(f).ok()?;
    let mut b = BytesMut::new();
    for p in three {
        b.extend_from_slice(&p);
    }
    Some(b.freeze())
}

impl LinkIo for End {
    fn has_room(&self, slot: usize, _writes: usize) -> bool {
        self.room && self.up.contains(&slot)
    }

    fn write(&mut self, slot: usize, frames: Vec<(Frame, u8)>) -> bool {
        assert!(
            self.up.contains(&slot),
            "write to circuit {slot}, which is not up"
        );
        if !self.room {
            return false;
        }
        for (f, _) in frames {
            if let Some(b) = one_buffer(f) {
                self.wire.push_back((slot, b));
            }
        }
        true
    }

    fn dropped(&mut self, _n: u64) {}

    fn to_fabric(&mut self, f: Frame) {
        self.fabric.push(f);
    }

    fn to_controller(&mut self, f: Frame) {
        let _ = one_buffer(f);
    }

    fn fspf(&mut self, _r: SwIlsRepr) {}

    fn apply_zoning(&mut self, _z: ZoneDb) {}

    fn local_switch(&self) -> LocalSwitch {
        let name = Wwn(0x1000_0000_0000_0000 | u64::from(self.domain));
        LocalSwitch {
            domain: self.domain,
            switch_name: name,
            port_name: Wwn(name.0 | 0x8001),
            domains: vec![(self.domain, name)],
            zoning: ZoneDb { active: None },
            r_a_tov: 10_000,
            e_d_tov: 2_000,
        }
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Close { slot, .. } => {
                assert!(
                    self.up.remove(&slot),
                    "close of circuit {slot}, which is not up"
                );
                self.closes.push(slot);
            }
            Event::Up { .. } => self.link_up = true,
            Event::Down { .. } | Event::Isolated { .. } => self.link_up = false,
            _ => {}
        }
    }
}

fn config(
    u: &mut Unstructured<'_>,
    enhanced: bool,
    circuits: usize,
    originates: bool,
) -> Result<LinkConfig> {
    Ok(LinkConfig {
        name: if originates { "a".into() } else { "b".into() },
        enhanced,
        weights: (0..circuits)
            .map(|_| u.int_in_range(0..=3))
            .collect::<Result<_>>()?,
        compression: *u.choose(&[Mode::None, Mode::Lz4, Mode::Zstd, Mode::Auto])?,
        fastwrite: u.arbitrary()?,
        tape_pipelining: u.arbitrary()?,
        originates,
        window_bytes: u.int_in_range(1..=64)? << 12,
        keepalive: Duration::from_millis(500),
        dead_after: Duration::from_millis(1500),
        k_a_tov: 5_000,
        port_no: 1,
    })
}

fn frame(u: &mut Unstructured<'_>, seq: u16) -> Result<Frame> {
    let len = u.int_in_range(0..=2200usize)?;
    let mut payload = vec![0u8; len];
    payload[..len.min(2)].copy_from_slice(&seq.to_be_bytes()[..len.min(2)]);
    Ok(Frame {
        sof: *u.choose(&[Sof::I3, Sof::N3, Sof::F])?,
        header: FcHeaderRepr {
            r_ctl: RCtl(u.arbitrary()?),
            d_id: FcId::new(u.int_in_range(0..=0xff_ffff)?),
            s_id: FcId::new(u.int_in_range(0..=0xff_ffff)?),
            fc_type: FcType(u.arbitrary()?),
            ox_id: OxId(seq),
            ..FcHeaderRepr::default()
        },
        payload: Bytes::from(payload),
        eof: *u.choose(&[Eof::N, Eof::T])?,
    })
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let enhanced: bool = u.arbitrary()?;
    let circuits = u.int_in_range(1..=3usize)?;
    let first = if enhanced { 1 } else { 0 };
    let caps = enhanced.then(|| {
        Capabilities(
            Capabilities::ENHANCED
                | Capabilities::FASTWRITE
                | Capabilities::TAPE
                | Capabilities::READ_AHEAD
                | Capabilities::LZ4
                | Capabilities::ZSTD,
        )
    });
    let mut now = Instant::now();
    let (ca, cb) = (
        config(&mut u, enhanced, circuits, true)?,
        config(&mut u, enhanced, circuits, false)?,
    );
    // FastWrite answers and makes frames of its own: the order check
    // below is for links without it.
    let fastwrite = ca.fastwrite && cb.fastwrite;
    let mut a = Link::new(ca, now);
    let mut b = Link::new(cb, now);
    let (mut ea, mut eb) = (End::new(1), End::new(2));
    // Whether anything was lost or bent so far: the in-order check holds
    // only while nothing was.
    let mut clean = true;
    // Without faults the network is perfect (every frame delivered intact,
    // connections never cut or replaced, nothing injected): the fuzzer
    // reaches the in-order check easily, and explores around it.
    let faults: bool = u.arbitrary()?;
    let mut sent_a: Vec<u16> = Vec::new();
    let mut seq: u16 = 0;
    for _ in 0..u.int_in_range(0..=400usize)? {
        if u.is_empty() {
            break;
        }
        let side: bool = u.arbitrary()?;
        let (l, e, pl, pe) = if side {
            (&mut a, &mut ea, &mut b, &mut eb)
        } else {
            (&mut b, &mut eb, &mut a, &mut ea)
        };
        match u.int_in_range(0..=9u8)? {
            // A circuit comes up at both ends (a new connection).
            0 => {
                let s = u.int_in_range(first..=circuits)?;
                if !faults && (e.up.contains(&s) || pe.up.contains(&s)) {
                    continue;
                }
                // Frames queued on an old connection are gone with it.
                clean &= !e.wire.iter().chain(pe.wire.iter()).any(|(c, _)| *c == s);
                e.wire.retain(|(c, _)| *c != s);
                pe.wire.retain(|(c, _)| *c != s);
                for (l, e) in [(&mut *l, &mut *e), (&mut *pl, &mut *pe)] {
                    if e.up.remove(&s) {
                        clean = false;
                        l.circuit_down(s, "replaced", e);
                    }
                    e.up.insert(s);
                    l.circuit_up(s, caps, now, e);
                }
            }
            // A circuit's connection ends at this end.
            1 if faults => {
                let s = u.int_in_range(first..=circuits)?;
                if e.up.remove(&s) {
                    l.circuit_down(s, "closed", e);
                    clean = false;
                }
            }
            // Deliver (or lose, repeat, bend) what this end wrote.
            2 | 3 | 4 => {
                for _ in 0..u.int_in_range(1..=16usize)? {
                    let Some((s, mut bytes)) = e.wire.pop_front() else {
                        break;
                    };
                    if !pe.up.contains(&s) {
                        continue;
                    }
                    let fate = if faults {
                        u.int_in_range(0..=15u8)?
                    } else {
                        15
                    };
                    match fate {
                        0 => clean = false,
                        1 => {
                            clean = false;
                            pl.from_circuit(s, Item::Frame(bytes.clone()), now, pe);
                            pl.from_circuit(s, Item::Frame(bytes), now, pe);
                        }
                        2 if !bytes.is_empty() => {
                            clean = false;
                            let mut m = BytesMut::from(&bytes[..]);
                            let i = u.choose_index(m.len())?;
                            m[i] ^= u.int_in_range(1..=255u8)?;
                            bytes = m.freeze();
                            pl.from_circuit(s, Item::Frame(bytes), now, pe);
                        }
                        _ => pl.from_circuit(s, Item::Frame(bytes), now, pe),
                    }
                }
            }
            // Frames from this end's fabric (as the actor does: while the
            // link takes them).
            5 | 6 => {
                if l.can_take() {
                    let mut fs = Vec::new();
                    for _ in 0..u.int_in_range(1..=8usize)? {
                        seq = seq.wrapping_add(1);
                        let f = frame(&mut u, seq)?;
                        if side && l.is_up() {
                            sent_a.push(seq);
                        }
                        fs.push(f);
                    }
                    l.from_fabric(fs, e);
                }
            }
            // Time passes.
            7 => {
                now += Duration::from_millis(u.int_in_range(0..=2000)?);
                l.handle_timeout(now, e);
                pl.handle_timeout(now, pe);
                if !e.closes.is_empty() || !pe.closes.is_empty() {
                    clean = false;
                }
            }
            // Writers fill up or drain.
            8 => {
                e.room = u.arbitrary()?;
                if e.room {
                    l.on_room(e);
                }
            }
            // A frame of the input's own making arrives.
            9 if faults => {
                let s = u.int_in_range(first..=circuits)?;
                if e.up.contains(&s) {
                    clean = false;
                    let item = if u.ratio(1, 8)? {
                        Item::Special(Bytes::copy_from_slice(u.bytes(76)?))
                    } else if u.arbitrary()? {
                        let f = frame(&mut u, 0)?;
                        match one_buffer(f) {
                            Some(b) => Item::Frame(b),
                            None => continue,
                        }
                    } else {
                        let n = u.int_in_range(0..=200usize)?;
                        Item::Frame(Bytes::copy_from_slice(u.bytes(n)?))
                    };
                    l.from_circuit(s, item, now, e);
                }
            }
            _ => {}
        }
        if !ea.closes.is_empty() || !eb.closes.is_empty() {
            clean = false;
        }
    }
    // Everything still in flight is delivered, intact, with the writers
    // open: an enhanced link that stayed clean has handed B's fabric
    // every class 3 frame A's fabric sent, in order.
    if enhanced && !fastwrite && clean && ea.link_up && eb.link_up {
        // Full writers lose nothing in enhanced mode: the batches wait in
        // the send window.
        ea.room = true;
        eb.room = true;
        a.on_room(&mut ea);
        b.on_room(&mut eb);
        for _ in 0..64 {
            if ea.wire.is_empty() && eb.wire.is_empty() {
                break;
            }
            while let Some((s, bytes)) = ea.wire.pop_front() {
                b.from_circuit(s, Item::Frame(bytes), now, &mut eb);
            }
            while let Some((s, bytes)) = eb.wire.pop_front() {
                a.from_circuit(s, Item::Frame(bytes), now, &mut ea);
            }
        }
        let got: Vec<u16> = eb
            .fabric
            .iter()
            .filter(|f| f.header.fc_type != FcType::SW_ILS)
            .map(|f| f.header.ox_id.0)
            .collect();
        let want: Vec<u16> = sent_a.iter().copied().filter(|s| got.contains(s)).collect();
        assert_eq!(got, want, "frames reordered across the link");
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
