//! Read-ahead end to end: a host side, a drive side and a drive that
//! keeps a real position, joined by FIFOs whose interleaving a seeded
//! generator picks, so announcements, results, hits and discards cross in
//! every order the tunnel allows.

use std::collections::VecDeque;

use super::super::{TapeHost, TapeStats};
use super::*;
use unifab_fc::wire::FcHeaderRepr;
use unifab_fc::wire::header::{FCtl, FcType};

const HOST: FcId = FcId::new(0x010100);
const DRIVE: FcId = FcId::new(0x020100);
const BLOCK: u32 = 1000;

fn cmnd_frame(ox: u16, cdb: &[u8], dl: u32) -> Frame {
    let mut c16 = [0u8; 16];
    c16[..cdb.len()].copy_from_slice(cdb);
    let tmpl = FcpCmndRepr {
        lun: FcpCmndRepr::parse(&Bytes::from(vec![0u8; 32])).unwrap().lun,
        crn: 0,
        priority: 0,
        task_attribute: FcpTaskAttr::SIMPLE,
        tmf: FcpTmf(0),
        rddata: dl > 0,
        wrdata: false,
        cdb: Bytes::copy_from_slice(&c16),
        fcp_dl: dl,
        bidirectional_read_dl: None,
    };
    let mut b = vec![0u8; tmpl.buffer_len()];
    tmpl.emit(&mut b).unwrap();
    Frame::new(
        FcHeaderRepr {
            r_ctl: RCtl::FCP_CMND,
            d_id: DRIVE,
            s_id: HOST,
            fc_type: FcType::FCP,
            f_ctl: FCtl::request(),
            ox_id: OxId(ox),
            rx_id: RxId::UNASSIGNED,
            ..FcHeaderRepr::default()
        },
        Bytes::from(b),
    )
}

fn read6(ox: u16) -> Frame {
    let l = BLOCK.to_be_bytes();
    cmnd_frame(ox, &[0x08, 0, l[1], l[2], l[3], 0], BLOCK)
}

fn read_position(ox: u16) -> Frame {
    cmnd_frame(ox, &[0x34, 0, 0, 0, 0, 0, 0, 0, 0, 0], 20)
}

/// A drive: entries are blocks (their index is their content) or
/// filemarks; `counts_filemarks` spaces over a filemark as a block, as
/// tgtd does.
struct Drive {
    medium: Vec<Option<u32>>,
    pos: usize,
    counts_filemarks: bool,
    /// SPACE fails with MEDIUM ERROR.
    space_fails: bool,
}

fn sense(key: u8, fm: bool, asc: u8, ascq: u8) -> Bytes {
    let mut s = vec![0u8; 18];
    s[0] = 0x70;
    s[2] = key | if fm { 0x80 } else { 0 };
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    Bytes::from(s)
}

impl Drive {
    fn answer(&mut self, f: &Frame) -> Vec<Frame> {
        let c = FcpCmndRepr::parse(&f.payload).unwrap();
        let (status, s, data) = match c.cdb[0] {
            0x08 => match self.medium.get(self.pos) {
                None => (CHECK_CONDITION, sense(0x08, false, 0, 5), None),
                Some(None) => {
                    self.pos += 1;
                    (CHECK_CONDITION, sense(0, true, 0, 1), None)
                }
                Some(Some(b)) => {
                    self.pos += 1;
                    let mut d = vec![(*b % 251) as u8; BLOCK as usize];
                    d[..4].copy_from_slice(&b.to_be_bytes());
                    (GOOD, Bytes::new(), Some(Bytes::from(d)))
                }
            },
            0x11 => {
                let n = i32::from_be_bytes([
                    if c.cdb[2] & 0x80 != 0 { 0xff } else { 0 },
                    c.cdb[2],
                    c.cdb[3],
                    c.cdb[4],
                ]);
                assert!(n < 0 && c.cdb[1] & 0x07 == 0, "only reverse block spaces");
                if self.space_fails {
                    return self.reply(f, CHECK_CONDITION, sense(0x03, false, 0x14, 0), None);
                }
                let mut left = -n;
                let mut out = (GOOD, Bytes::new(), None);
                while left > 0 {
                    assert!(self.pos > 0, "spaced back past BOP");
                    if self.medium[self.pos - 1].is_none() && !self.counts_filemarks {
                        self.pos -= 1;
                        out = (CHECK_CONDITION, sense(0, true, 0, 1), None);
                        break;
                    }
                    self.pos -= 1;
                    left -= 1;
                }
                out
            }
            0x34 => {
                let mut d = vec![0u8; 20];
                d[4..8].copy_from_slice(&(self.pos as u32).to_be_bytes());
                (GOOD, Bytes::new(), Some(Bytes::from(d)))
            }
            0x00 => (GOOD, Bytes::new(), None),
            op => panic!("drive got {op:#x}"),
        };
        self.reply(f, status, s, data)
    }

    fn reply(&self, f: &Frame, status: u8, s: Bytes, data: Option<Bytes>) -> Vec<Frame> {
        let h = f.header;
        let reply = |r_ctl, p: Bytes, param: u32| {
            Frame::new(
                FcHeaderRepr {
                    r_ctl,
                    d_id: h.s_id,
                    s_id: h.d_id,
                    fc_type: FcType::FCP,
                    ox_id: h.ox_id,
                    rx_id: RxId(0x0900),
                    parameter: param,
                    ..FcHeaderRepr::default()
                },
                p,
            )
        };
        let mut out = Vec::new();
        if let Some(d) = data {
            // Two frames, to test offsets.
            let half = d.len() / 2;
            out.push(reply(RCtl::FCP_DATA, d.slice(..half), 0));
            out.push(reply(RCtl::FCP_DATA, d.slice(half..), half as u32));
        }
        let r = FcpRspRepr {
            scsi_status: status,
            sense: s,
            ..FcpRspRepr::default()
        };
        out.push(reply(RCtl::FCP_RSP, r.to_bytes().unwrap(), 0));
        out
    }
}

struct World {
    host: TapeHost,
    far: AheadTarget,
    drive: Drive,
    down: VecDeque<(Frame, u8)>,
    up: VecDeque<(Frame, u8)>,
    to_drive: VecDeque<Frame>,
    from_drive: VecDeque<Frame>,
    to_host: Vec<Frame>,
    seed: u64,
}

impl World {
    fn new(medium: Vec<Option<u32>>, counts_filemarks: bool, seed: u64) -> World {
        let mut host = TapeHost::new(4, 1 << 20, 1 << 20);
        host.set_read_ahead(true);
        let inq = cmnd_frame(1, &[0x12, 0, 0, 0, 36, 0], 36);
        assert!(host.outbound(inq).is_err());
        let d = Frame::new(
            FcHeaderRepr {
                r_ctl: RCtl::FCP_DATA,
                d_id: HOST,
                s_id: DRIVE,
                fc_type: FcType::FCP,
                ox_id: OxId(1),
                ..FcHeaderRepr::default()
            },
            Bytes::from(vec![0x01, 0x80, 6, 2]),
        );
        assert!(host.inbound(d, 0).is_err());
        assert_eq!(host.tapes(), 1);
        World {
            host,
            far: AheadTarget::new(),
            drive: Drive {
                medium,
                pos: 0,
                counts_filemarks,
                space_fails: false,
            },
            down: VecDeque::new(),
            up: VecDeque::new(),
            to_drive: VecDeque::new(),
            from_drive: VecDeque::new(),
            to_host: Vec::new(),
            seed,
        }
    }

    fn rand(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    fn host_acts(&mut self, acts: Vec<HostAction>) {
        for a in acts {
            match a {
                HostAction::Fabric(f) => self.to_host.push(f),
                HostAction::Tunnel(f, fl) => self.down.push_back((f, fl)),
            }
        }
    }

    fn far_act(&mut self, act: TargetAct) {
        self.to_drive.extend(act.to_fabric);
        self.up.extend(act.up);
        for (f, fl) in act.released {
            let a = self.far.command(f, fl);
            self.far_act(a);
        }
        if let Some(f) = act.pass {
            if f.header.r_ctl == RCtl::FCP_CMND {
                self.to_drive.push_back(f);
            } else {
                self.up.push_back((f, 0));
            }
        }
    }

    /// One event from a queue the generator picks; false when all are
    /// empty.
    fn step(&mut self) -> bool {
        let ready = [
            !self.down.is_empty(),
            !self.up.is_empty(),
            !self.to_drive.is_empty(),
            !self.from_drive.is_empty(),
        ];
        if !ready.iter().any(|r| *r) {
            return false;
        }
        let mut q = (self.rand() % 4) as usize;
        while !ready[q] {
            q = (q + 1) % 4;
        }
        match q {
            0 => {
                let (f, fl) = self.down.pop_front().unwrap();
                let a = self.far.command(f, fl);
                self.far_act(a);
            }
            1 => {
                let (f, fl) = self.up.pop_front().unwrap();
                match self.host.inbound(f, fl) {
                    Ok(got) => {
                        self.to_host.extend(got.to_fabric);
                        self.down.extend(got.to_tunnel);
                    }
                    Err(f) => self.to_host.push(f),
                }
            }
            2 => {
                let f = self.to_drive.pop_front().unwrap();
                let got = self.drive.answer(&f);
                self.from_drive.extend(got);
            }
            _ => {
                let f = self.from_drive.pop_front().unwrap();
                let a = self.far.from_drive(f);
                self.far_act(a);
            }
        }
        true
    }

    /// The host sends `f` and waits for its status: the data (by
    /// relative offset) and the FCP_RSP.
    fn exec(&mut self, f: Frame) -> (Vec<u8>, FcpRspRepr) {
        let ox = f.header.ox_id;
        match self.host.outbound(f) {
            Ok(acts) => self.host_acts(acts),
            Err(f) => self.down.push_back((f, 0)),
        }
        let mut data = Vec::new();
        loop {
            let mut done = None;
            for f in std::mem::take(&mut self.to_host) {
                assert_eq!(
                    f.header.ox_id, ox,
                    "a frame for another exchange reached the host"
                );
                assert_eq!(f.header.d_id, HOST);
                match f.header.r_ctl {
                    RCtl::FCP_DATA => {
                        let at = f.header.parameter as usize;
                        if data.len() < at + f.payload.len() {
                            data.resize(at + f.payload.len(), 0);
                        }
                        data[at..at + f.payload.len()].copy_from_slice(&f.payload);
                    }
                    RCtl::FCP_RSP => done = Some(FcpRspRepr::parse(&f.payload).unwrap()),
                    r => panic!("host got r_ctl {r:?}"),
                }
            }
            if let Some(r) = done {
                return (data, r);
            }
            assert!(self.step(), "the host's command {ox:?} was never answered");
        }
    }

    fn settle(&mut self) {
        for _ in 0..(self.rand() % 64) {
            self.step();
        }
    }
}

fn block_of(data: &[u8]) -> u32 {
    assert_eq!(data.len(), BLOCK as usize);
    u32::from_be_bytes(data[..4].try_into().unwrap())
}

/// 40 blocks, a filemark, 10 blocks, a filemark, end-of-data.
fn medium() -> Vec<Option<u32>> {
    let mut m: Vec<Option<u32>> = (0..40).map(Some).collect();
    m.push(None);
    m.extend((100..110).map(Some));
    m.push(None);
    m
}

fn run(seed: u64, counts_filemarks: bool) -> TapeStats {
    let mut w = World::new(medium(), counts_filemarks, seed);
    let mut ox = 0x100u16;
    let mut next = || {
        ox += 1;
        ox
    };
    let expect = medium();
    let mut pos = 0usize;
    // Reads of a length chosen by the generator, each then checked by
    // READ POSITION (which discards whatever was read ahead).
    while pos <= expect.len() {
        let n = (w.rand() % 45) as usize;
        for _ in 0..n {
            let (d, r) = w.exec(read6(next()));
            match expect.get(pos) {
                Some(Some(b)) => {
                    assert_eq!(r.scsi_status, GOOD, "block {pos}");
                    assert_eq!(block_of(&d), *b, "the block at {pos}");
                    pos += 1;
                }
                Some(None) => {
                    assert_eq!(r.scsi_status, CHECK_CONDITION);
                    assert_eq!(r.sense[2], 0x80, "FILEMARK at {pos}");
                    pos += 1;
                }
                None => {
                    assert_eq!(r.scsi_status, CHECK_CONDITION);
                    assert_eq!(r.sense[2] & 0x0f, 0x08, "BLANK CHECK at end-of-data");
                }
            }
            w.settle();
        }
        w.settle();
        let (d, r) = w.exec(read_position(next()));
        assert_eq!(r.scsi_status, GOOD);
        assert_eq!(
            u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize,
            pos,
            "the drive is where the host's own commands left it (seed {seed})"
        );
        if pos == expect.len() {
            break;
        }
    }
    while w.step() {}
    assert_eq!(w.drive.pos, pos);
    let mut s = w.host.stats();
    s.read_ahead_issued = w.far.issued;
    s
}

#[test]
fn a_restore_reads_every_block_once_in_order_and_the_position_holds() {
    let mut hits = 0;
    let mut discarded = 0;
    for seed in 1..=60u64 {
        let s = run(seed * 0x9e37_79b9, seed % 2 == 0);
        hits += s.read_ahead_hits;
        discarded += s.read_ahead_discarded;
        assert!(s.read_ahead_issued >= s.read_ahead_hits);
    }
    assert!(
        hits > 1000,
        "reads were answered from what was read ahead: {hits}"
    );
    assert!(
        discarded > 0,
        "streams were discarded with results unconsumed"
    );
}

#[test]
fn a_stream_reads_no_further_than_its_window() {
    let mut w = World::new((0..200).map(Some).collect(), false, 7);
    let (_, r) = w.exec(read6(2));
    assert_eq!(r.scsi_status, GOOD);
    while w.step() {}
    assert_eq!(w.far.issued, WINDOW_CMDS as u64);
    assert_eq!(w.drive.pos, 1 + WINDOW_CMDS);
    let (d, _) = w.exec(read6(3));
    assert_eq!(block_of(&d), 1);
    while w.step() {}
    assert_eq!(
        w.far.issued,
        WINDOW_CMDS as u64 + 1,
        "one hit, one more read"
    );
    assert_eq!(w.host.stats().read_ahead_hits, 1);
}

#[test]
fn a_different_read_discards_and_crosses_after_the_space_back() {
    let mut w = World::new((0..200).map(Some).collect(), false, 11);
    w.exec(read6(2));
    w.exec(read6(3));
    while w.step() {}
    // A READ of another length: not a hit.
    let l = 512u32.to_be_bytes();
    let other = cmnd_frame(4, &[0x08, 0x02, l[1], l[2], l[3], 0], 512);
    let (d, r) = w.exec(other);
    assert_eq!(r.scsi_status, GOOD);
    assert_eq!(
        u32::from_be_bytes(d[..4].try_into().unwrap()),
        2,
        "the block after the two read"
    );
    assert_eq!(w.far.spaced_back, 1);
    assert_eq!(w.host.stats().read_ahead_discarded, WINDOW_CMDS as u64);
}

/// Whatever a peer sends (any frame kind, status, sense, record flags,
/// exchange, in any order), neither side panics and neither keeps more
/// than its bounds.
#[test]
fn garbage_from_the_peer_and_the_drive_is_survived_within_bounds() {
    let mut w = World::new(medium(), false, 3);
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..200_000 {
        let r = rand();
        let ox = if r & 1 == 0 {
            0xffc0 + (r >> 8) as u16 % 0x40
        } else {
            (r >> 8) as u16 % 8
        };
        let flags = [0, RECORD_AHEAD, RECORD_HIT, RECORD_STREAM, 0xff][(r >> 24) as usize % 5];
        let mut f = match (r >> 32) % 6 {
            0 => read6(ox),
            1 => cmnd_frame(ox, &[0x01, 0, 0, 0, 0, 0], 0),
            2 => cmnd_frame(ox, &[0x08, (r >> 40) as u8 & 3, 0, 3, 0xe8, 0], 1000),
            3 | 4 => {
                let st = [GOOD, CHECK_CONDITION, 0x08, 0x18][(r >> 40) as usize % 4];
                let rsp = FcpRspRepr {
                    scsi_status: st,
                    sense: sense((r >> 44) as u8 & 0x0f, r & (1 << 50) != 0, 0, 1),
                    ..FcpRspRepr::default()
                };
                let mut f = Frame::new(
                    FcHeaderRepr {
                        r_ctl: RCtl::FCP_RSP,
                        d_id: HOST,
                        s_id: DRIVE,
                        fc_type: FcType::FCP,
                        ox_id: OxId(ox),
                        ..FcHeaderRepr::default()
                    },
                    rsp.to_bytes().unwrap(),
                );
                if (r >> 32) % 6 == 4 {
                    f.header.r_ctl = RCtl::FCP_DATA;
                    f.payload = Bytes::from(vec![7u8; (r >> 52) as usize % 3000]);
                }
                f
            }
            _ => {
                let mut f = read6(ox);
                f.payload = Bytes::from(vec![0u8; (r >> 40) as usize % 40]);
                f
            }
        };
        if r & (1 << 61) != 0 {
            std::mem::swap(&mut f.header.s_id, &mut f.header.d_id);
        }
        match (r >> 62) % 4 {
            0 => {
                if let Ok(a) = w.host.outbound(f) {
                    w.host_acts(a);
                }
            }
            1 => {
                let _ = w.host.inbound(f, flags);
            }
            2 => {
                let a = w.far.command(f, flags);
                w.to_drive.extend(a.to_fabric);
            }
            _ => {
                let _ = w.far.from_drive(f);
            }
        }
        assert!(
            w.host
                .ahead
                .as_ref()
                .is_some_and(|a| a.streams() <= MAX_STREAMS)
        );
        assert!(w.far.readers() <= MAX_STREAMS && w.far.own.len() <= 2 * MAX_STREAMS);
        w.to_host.clear();
        w.down.clear();
        w.to_drive.clear();
    }
    let _ = w.host.sweep();
    let _ = w.far.sweep();
    let _ = w.far.sweep();
}

/// A stream discarded by a command whose answer never crosses keeps its
/// nexus draining through one sweep, and is free after the next.
#[test]
fn a_drain_without_an_end_ends_after_a_whole_sweep_interval() {
    let mut w = World::new((0..100).map(Some).collect(), false, 5);
    w.exec(read6(2));
    while w.step() {}
    let n = (HOST, DRIVE, 0u64);
    let ahead = |w: &mut World| w.host.ahead.as_mut().unwrap().may_start(n);
    // The host's REWIND discards the stream; its answer is lost.
    let acts = w
        .host
        .outbound(cmnd_frame(3, &[0x01, 0, 0, 0, 0, 0], 0))
        .unwrap_err();
    assert_eq!(acts.header.ox_id, OxId(3));
    assert!(!ahead(&mut w), "draining until the REWIND's answer");
    let _ = w.host.sweep();
    assert!(
        !ahead(&mut w),
        "a sweep just after the drain began keeps it"
    );
    let _ = w.host.sweep();
    assert!(ahead(&mut w), "the next sweep ends it");
}

/// When the drive cannot be spaced back, the command that waited for it
/// is answered with the drive's error as a deferred error: the host must
/// not go on at a position it did not leave the drive in.
#[test]
fn a_failed_space_back_is_a_deferred_error_for_the_waiting_command() {
    let mut w = World::new((0..100).map(Some).collect(), false, 9);
    w.drive.space_fails = true;
    w.exec(read6(2));
    w.exec(read6(3));
    while w.step() {}
    let (_, r) = w.exec(cmnd_frame(4, &[0, 0, 0, 0, 0, 0], 0));
    assert_eq!(r.scsi_status, CHECK_CONDITION);
    assert_eq!(r.sense[0] & 0x7f, 0x71, "deferred: {:02x?}", r.sense);
    assert_eq!(
        (r.sense[2] & 0x0f, r.sense[12]),
        (0x03, 0x14),
        "the drive's sense"
    );
    // The next command reaches the drive.
    let (_, r) = w.exec(cmnd_frame(5, &[0, 0, 0, 0, 0, 0], 0));
    assert_eq!(r.scsi_status, GOOD);
}
