//! Offline TCP stream reassembly, per direction, with gap detection.
//!
//! A capture is read whole, so reassembly sorts each direction's segments
//! by sequence number (relative to the SYN, or to the first segment seen),
//! drops retransmitted bytes, and cuts the stream into contiguous
//! [`Run`]s wherever bytes are missing (lost at capture, or cut by the
//! snap length). Every byte remembers the frame that carried it.

use std::net::SocketAddr;

use super::net::TcpSegment;

/// One direction of a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    /// Sender.
    pub src: SocketAddr,
    /// Receiver.
    pub dst: SocketAddr,
}

#[derive(Debug, Clone)]
struct Seg<'a> {
    frame: u64,
    seq: u32,
    data: &'a [u8],
    wire_len: usize,
}

/// The segments of one direction, in capture order.
#[derive(Debug, Clone, Default)]
pub struct Flow<'a> {
    isn: Option<u32>,
    segs: Vec<Seg<'a>>,
    /// Frame number of the first segment.
    pub first_frame: u64,
}

/// A contiguous stretch of stream bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Stream offset of the first byte.
    pub start: u64,
    /// The bytes.
    pub data: Vec<u8>,
    /// `(end offset, frame)`: bytes before `end` (and after the previous
    /// entry's end) came in `frame`.
    pub frames: Vec<(u64, u64)>,
    /// True if this run starts at the beginning of the stream (a SYN was seen
    /// and nothing before is missing).
    pub at_stream_start: bool,
}

impl Run {
    /// Stream offset just past the last byte.
    pub fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    /// The frame that carried the byte at stream offset `off`.
    pub fn frame_at(&self, off: u64) -> u64 {
        self.frames
            .iter()
            .find(|(end, _)| off < *end)
            .or(self.frames.last())
            .map_or(0, |(_, f)| *f)
    }
}

/// Missing bytes between two runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Stream offset where bytes go missing.
    pub offset: u64,
    /// How many bytes are missing.
    pub len: u64,
    /// The frame that resumes the stream after the gap.
    pub frame: u64,
}

impl<'a> Flow<'a> {
    /// Add a segment.
    pub fn push(&mut self, frame: u64, seg: &TcpSegment<'a>) {
        if self.segs.is_empty() && self.isn.is_none() {
            self.first_frame = frame;
        }
        if seg.syn {
            self.isn = Some(seg.seq);
        }
        if seg.wire_len > 0 {
            // A SYN's payload (rare) starts after the SYN's own sequence number.
            let seq = if seg.syn {
                seg.seq.wrapping_add(1)
            } else {
                seg.seq
            };
            self.segs.push(Seg {
                frame,
                seq,
                data: seg.payload,
                wire_len: seg.wire_len,
            });
        }
    }

    /// Reassemble into runs and the gaps between them.
    pub fn reassemble(&self) -> (Vec<Run>, Vec<Gap>) {
        let (base, from_syn) = match (self.isn, self.segs.first()) {
            (Some(isn), _) => (isn.wrapping_add(1), true),
            (None, Some(s)) => (s.seq, false),
            (None, None) => return (Vec::new(), Vec::new()),
        };
        // Relative offsets; segments before the base (retransmissions of
        // data sent before the capture began) are dropped.
        let mut segs: Vec<(u64, &Seg<'a>)> = self
            .segs
            .iter()
            .filter_map(|s| {
                let rel = s.seq.wrapping_sub(base);
                (rel < 0x8000_0000).then_some((u64::from(rel), s))
            })
            .collect();
        segs.sort_by_key(|(rel, s)| (*rel, s.frame));
        let mut runs: Vec<Run> = Vec::new();
        let mut gaps = Vec::new();
        let mut next: u64 = 0;
        let mut started = false;
        for (rel, s) in segs {
            let end = rel + s.data.len() as u64;
            let wire_end = rel + s.wire_len as u64;
            if !started {
                started = true;
                next = if from_syn { 0 } else { rel };
            }
            if wire_end <= next {
                continue;
            }
            if rel > next || runs.is_empty() {
                if rel > next {
                    gaps.push(Gap {
                        offset: next,
                        len: rel - next,
                        frame: s.frame,
                    });
                }
                runs.push(Run {
                    start: rel,
                    data: Vec::new(),
                    frames: Vec::new(),
                    at_stream_start: rel == 0 && from_syn,
                });
                next = rel;
            }
            if end > next
                && let Some(run) = runs.last_mut()
            {
                let skip = usize::try_from(next - rel).unwrap_or(usize::MAX);
                if let Some(fresh) = s.data.get(skip..) {
                    run.data.extend_from_slice(fresh);
                    run.frames.push((end, s.frame));
                }
                next = end;
            }
            if wire_end > end {
                // Cut by the snap length: the rest is missing.
                next = next.max(end);
                if wire_end > next {
                    // The next segment opens a new run after the gap; if none
                    // does, report the cut at the end.
                    gaps.push(Gap {
                        offset: next,
                        len: wire_end - next,
                        frame: s.frame,
                    });
                    runs.push(Run {
                        start: wire_end,
                        data: Vec::new(),
                        frames: Vec::new(),
                        at_stream_start: false,
                    });
                    next = wire_end;
                }
            }
        }
        runs.retain(|r| !r.data.is_empty());
        (runs, gaps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(seq: u32, data: &[u8], syn: bool) -> TcpSegment<'_> {
        TcpSegment {
            src: "10.0.0.1:1000".parse().unwrap(),
            dst: "10.0.0.2:3260".parse().unwrap(),
            seq,
            syn,
            fin: false,
            rst: false,
            payload: data,
            wire_len: data.len(),
        }
    }

    #[test]
    fn reorder_retransmit_gap() {
        let mut f = Flow::default();
        f.push(1, &seg(99, b"", true));
        f.push(2, &seg(100, b"abcd", false));
        f.push(3, &seg(108, b"ijkl", false)); // out of order
        f.push(4, &seg(104, b"efgh", false));
        f.push(5, &seg(102, b"cdef", false)); // retransmission overlap
        f.push(6, &seg(120, b"uvwx", false)); // gap of 4 bytes (116..120 missing after mnop)
        f.push(7, &seg(112, b"mnop", false));
        let (runs, gaps) = f.reassemble();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].data, b"abcdefghijklmnop");
        assert!(runs[0].at_stream_start);
        assert_eq!(runs[0].frame_at(5), 5); // the retransmission sorts first
        assert_eq!(runs[0].frame_at(7), 4);
        assert_eq!(runs[1].start, 20);
        assert_eq!(
            gaps,
            [Gap {
                offset: 16,
                len: 4,
                frame: 6
            }]
        );
    }

    #[test]
    fn snaplen_cut() {
        let mut f = Flow::default();
        let mut s = seg(0, b"ab", false);
        s.wire_len = 6;
        f.push(1, &s);
        f.push(2, &seg(6, b"gh", false));
        let (runs, gaps) = f.reassemble();
        assert_eq!(runs.len(), 2);
        assert!(!runs[0].at_stream_start);
        assert_eq!(
            gaps,
            [Gap {
                offset: 2,
                len: 4,
                frame: 1
            }]
        );
        assert_eq!(runs[1].data, b"gh");
    }
}
