//! Reservation state shared by several target processes (a cluster of
//! gateways in front of one LU).
//!
//! One value per LU in a store outside the process ([`ReservationStore`]:
//! etcd in the gateway) holds everything a reservation check reads — the
//! persistent reservation state and the RESERVE(6) holder — with the
//! effects of the change that wrote it (unit attentions and aborts, which
//! every member applies to its own I_T nexuses). A change is read, decided
//! and written back conditioned on the version it read (compare and swap),
//! so changes are linearized by the store; the member that made one
//! answers the command only once every member has applied it
//! ([`ReservationStore::settle`]).

use crate::lu::BoxFuture;
use crate::sense::Asc;

use super::{PortKey, PrState, UaTarget, tid_parse, tid_text};

/// Where a cluster keeps one LU's reservation state.
///
/// Versions are the store's: 0 means nothing stored yet, and every
/// successful [`store`](ReservationStore::store) returns a larger one.
pub trait ReservationStore: Send + Sync + std::fmt::Debug {
    /// This member's name (the `origin` of the changes it makes).
    fn member(&self) -> &str;
    /// The stored value and its version (a linearizable read).
    fn load(&self) -> BoxFuture<'static, Result<(u64, Option<String>), String>>;
    /// Writes `value` if the stored version is still `version`:
    /// `Ok(Some(new version))`, or `Ok(None)` when another change came first.
    fn store(&self, version: u64, value: String)
    -> BoxFuture<'static, Result<Option<u64>, String>>;
    /// Resolves once every member has applied `version` or has left the
    /// cluster (and so, fenced, serves nothing).
    fn settle(&self, version: u64) -> BoxFuture<'static, Result<(), String>>;
    /// Runs `work` in the background (a change that no command waits for:
    /// the RESERVE(6) an I_T nexus loss releases).
    fn detach(&self, work: BoxFuture<'static, ()>);
}

/// How many earlier versions' effects a version carries
/// ([`SharedReservations::history`]).
pub const HISTORY: usize = 32;

/// The unit attentions (and reset) an earlier version established, kept
/// so that a member applying a later version without having applied that
/// one (it was away from the store: fenced, then joining again) still
/// establishes them for its own I_T nexuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastEffects {
    /// The version that established them.
    pub version: u64,
    /// Its unit attentions.
    pub unit_attentions: Vec<(UaTarget, Asc)>,
    /// Its reset, if it was one.
    pub reset: Option<Asc>,
}

/// One version of a LU's shared reservation state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedReservations {
    /// The member whose change wrote it.
    pub origin: String,
    /// Persistent reservations.
    pub pr: PrState,
    /// The RESERVE(6) holder.
    pub reserve6: Option<PortKey>,
    /// Unit attentions the change established, for every member's nexuses.
    pub unit_attentions: Vec<(UaTarget, Asc)>,
    /// Nexuses whose tasks the change aborted (PREEMPT AND ABORT).
    pub abort: Vec<UaTarget>,
    /// The change is a reset of the LU (LOGICAL UNIT RESET, or a TARGET
    /// RESET through one member) with this unit attention: the other
    /// members abort every task, clear what a reset clears, and every one
    /// of their nexuses hears it.
    pub reset: Option<Asc>,
    /// The effects of the versions before it that had any, oldest first,
    /// at most [`HISTORY`].
    pub history: Vec<PastEffects>,
}

fn target_text(t: &UaTarget) -> String {
    format!(
        "{} {}",
        tid_text(&t.initiator),
        t.target.as_ref().map_or_else(|| "*".to_string(), tid_text)
    )
}

fn target_parse(i: &str, t: &str) -> Option<UaTarget> {
    Some(UaTarget {
        initiator: tid_parse(i)?,
        target: if t == "*" { None } else { Some(tid_parse(t)?) },
    })
}

fn asc_parse(code: &str) -> Option<Asc> {
    if code.len() != 4 {
        return None;
    }
    let a = u8::from_str_radix(code.get(..2)?, 16).ok()?;
    let q = u8::from_str_radix(code.get(2..)?, 16).ok()?;
    Some(Asc(a, q))
}

impl SharedReservations {
    /// Starts the change that follows `version` (this state as read): its
    /// effects go to the history, and are cleared.
    pub fn next_change(&mut self, version: u64) {
        let unit_attentions = std::mem::take(&mut self.unit_attentions);
        let reset = self.reset.take();
        self.abort.clear();
        if version > 0 && (!unit_attentions.is_empty() || reset.is_some()) {
            self.history.push(PastEffects {
                version,
                unit_attentions,
                reset,
            });
            let over = self.history.len().saturating_sub(HISTORY);
            self.history.drain(..over);
        }
    }

    /// The text kept in the store: header lines, then
    /// [`PrState::to_text`].
    pub fn to_text(&self) -> String {
        let mut s = String::from("unifab-reservations 1\n");
        if !self.origin.is_empty() {
            s.push_str(&format!("origin {}\n", self.origin));
        }
        if let Some(h) = &self.reserve6 {
            s.push_str(&format!(
                "reserve6 {} {}\n",
                tid_text(&h.initiator),
                tid_text(&h.target)
            ));
        }
        for (t, a) in &self.unit_attentions {
            s.push_str(&format!("ua {} {:02x}{:02x}\n", target_text(t), a.0, a.1));
        }
        for t in &self.abort {
            s.push_str(&format!("abort {}\n", target_text(t)));
        }
        if let Some(a) = self.reset {
            s.push_str(&format!("reset {:02x}{:02x}\n", a.0, a.1));
        }
        for p in &self.history {
            s.push_str(&format!("past {}\n", p.version));
            for (t, a) in &p.unit_attentions {
                s.push_str(&format!(
                    "pastua {} {:02x}{:02x}\n",
                    target_text(t),
                    a.0,
                    a.1
                ));
            }
            if let Some(a) = p.reset {
                s.push_str(&format!("pastreset {:02x}{:02x}\n", a.0, a.1));
            }
        }
        s.push_str(&self.pr.to_text());
        s
    }

    /// Parses [`SharedReservations::to_text`]; `None` if it is not that.
    pub fn from_text(text: &str) -> Option<SharedReservations> {
        // `\n` ends lines, nothing else (`lines` would also eat a `\r`).
        if text.contains('\r') {
            return None;
        }
        let mut lines = text.lines();
        if lines.next()? != "unifab-reservations 1" {
            return None;
        }
        let mut out = SharedReservations::default();
        let mut rest = String::new();
        for line in lines.by_ref() {
            let mut w = line.split(' ');
            match w.next()? {
                "origin" => {
                    // A cluster member's name: 1–64 of A-Z a-z 0-9 - _ .
                    let name = w.next()?;
                    let ok = (1..=64).contains(&name.len())
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
                    if !ok || w.next().is_some() {
                        return None;
                    }
                    out.origin = name.to_string();
                }
                "reserve6" => {
                    out.reserve6 = Some(PortKey {
                        initiator: tid_parse(w.next()?)?,
                        target: tid_parse(w.next()?)?,
                    })
                }
                "ua" => {
                    let t = target_parse(w.next()?, w.next()?)?;
                    out.unit_attentions.push((t, asc_parse(w.next()?)?));
                }
                "reset" => out.reset = Some(asc_parse(w.next()?)?),
                "past" => {
                    // Versions increase, and there are at most HISTORY.
                    let version: u64 = w.next()?.parse().ok()?;
                    let after = out.history.last().is_none_or(|p| p.version < version);
                    if !after || out.history.len() == HISTORY || w.next().is_some() {
                        return None;
                    }
                    out.history.push(PastEffects {
                        version,
                        unit_attentions: Vec::new(),
                        reset: None,
                    });
                }
                "pastua" => {
                    let t = target_parse(w.next()?, w.next()?)?;
                    let a = asc_parse(w.next()?)?;
                    out.history.last_mut()?.unit_attentions.push((t, a));
                }
                "pastreset" => out.history.last_mut()?.reset = Some(asc_parse(w.next()?)?),
                "abort" => out.abort.push(target_parse(w.next()?, w.next()?)?),
                _ => {
                    rest.push_str(line);
                    rest.push('\n');
                    break;
                }
            }
        }
        for line in lines {
            rest.push_str(line);
            rest.push('\n');
        }
        out.pr = PrState::from_text(&rest)?;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TransportId;

    fn tid(n: &str, isid: Option<[u8; 6]>) -> TransportId {
        TransportId::Iscsi {
            name: n.into(),
            isid,
        }
    }

    #[test]
    fn text_round_trip() {
        let mut pr = PrState::new();
        pr.set_aptpl_for_test(false);
        let s = SharedReservations {
            origin: "gw-a".into(),
            pr,
            reserve6: Some(PortKey {
                initiator: tid("iqn.h", Some([0x40, 0, 1, 2, 3, 4])),
                target: tid("iqn.t,t,0x0002", None),
            }),
            unit_attentions: vec![(
                UaTarget {
                    initiator: tid("iqn.h", Some([0x40, 0, 1, 2, 3, 4])),
                    target: None,
                },
                Asc(0x2a, 0x03),
            )],
            abort: vec![UaTarget {
                initiator: tid("iqn.x", None),
                target: Some(tid("iqn.t,t,0x0001", None)),
            }],
            reset: Some(Asc(0x29, 0x03)),
            history: vec![
                PastEffects {
                    version: 7,
                    unit_attentions: vec![(
                        UaTarget {
                            initiator: tid("iqn.h", None),
                            target: Some(tid("iqn.t,t,0x0001", None)),
                        },
                        Asc(0x2a, 0x05),
                    )],
                    reset: None,
                },
                PastEffects {
                    version: 9,
                    unit_attentions: Vec::new(),
                    reset: Some(Asc(0x29, 0x03)),
                },
            ],
        };
        let back = SharedReservations::from_text(&s.to_text()).expect("parses");
        assert_eq!(back, s);
        let empty = SharedReservations::default();
        assert_eq!(
            SharedReservations::from_text(&empty.to_text()).expect("parses"),
            empty
        );
        let mut full = empty.clone();
        for v in 1..=40u64 {
            full.reset = Some(Asc(0x29, 0x03));
            full.next_change(v);
        }
        assert_eq!(full.history.len(), HISTORY);
        assert_eq!(full.history[0].version, 40 - HISTORY as u64 + 1);
        assert_eq!(full.reset, None);
        assert_eq!(
            SharedReservations::from_text(&full.to_text()).expect("parses"),
            full
        );
        let over = full
            .to_text()
            .replacen("unifab-pr", "past 99\nunifab-pr", 1);
        assert_eq!(
            SharedReservations::from_text(&over),
            None,
            "more than HISTORY"
        );
        for bad in [
            "",
            "unifab-reservations 2\n",
            "unifab-reservations 1\nua iscsi:00 * 2a\nunifab-pr 1\n",
            "unifab-reservations 1\nreserve6 fc:zz fc:01\nunifab-pr 1\n",
            "unifab-reservations 1\norigin a\n",
            "unifab-reservations 1\norigin a\r\r\nunifab-pr 1\n",
            "unifab-reservations 1\norigin a b\nunifab-pr 1\n",
            "unifab-reservations 1\norigin \nunifab-pr 1\n",
            "unifab-reservations 1\npastua iscsi:00 * 2a05\nunifab-pr 1\n",
            "unifab-reservations 1\npast 9\npast 7\nunifab-pr 1\n",
            "unifab-reservations 1\npast x\nunifab-pr 1\n",
        ] {
            assert_eq!(SharedReservations::from_text(bad), None, "{bad:?}");
        }
    }
}
