//! The fabric controller's RSCNs, one outstanding per port.
//!
//! A port is sent an RSCN and, until it answers (LS_ACC or LS_RJT), the
//! changes that follow for it wait and are merged: one page per affected
//! address, however often it changed. When the answer comes they go as
//! one RSCN. A burst of logins (a host's FLOGI, RFT_ID and RFF_ID, or a
//! thousand hosts' NPIV ports) so costs each registered port a few RSCNs
//! with many pages, not one per change: what each port then queries the
//! name server for is bounded by what changed, not by how often. The
//! slower a port answers, the more one RSCN carries. Switches coalesce
//! RSCNs for the same reason.
//!
//! An RSCN unanswered for 2 × R_A_TOV (lost on a lossy FCoE link, or a
//! port that never answers) no longer holds the next: the fabric keeps no
//! timers, so the waiting pages go with the first frame the fabric handles
//! after that time. Pages past one payload collapse into a single
//! fabric-format page ("re-discover everything"), so what waits for a port
//! stays bounded.

use std::time::Instant;

use crate::compose::{self, Route};
use crate::wire::els::{ElsRepr, Rscn, RscnPage, rscn_format};
use crate::wire::{FcId, MAX_PAYLOAD, OxId};

use super::Fabric;

/// Most pages one RSCN payload holds (a 4-byte header, 4 bytes a page).
const MAX_PAGES: usize = (MAX_PAYLOAD - 4) / 4;

/// An RSCN a port has not answered yet, and what waits behind it.
#[derive(Debug)]
pub(super) struct Outstanding {
    ox: OxId,
    sent: Instant,
    waiting: Vec<RscnPage>,
}

impl Fabric {
    /// RSCN about `affected` to every registered port that may see it.
    pub(super) fn rscn_for(&mut self, affected: FcId, qualifier: u8) {
        if affected.domain() == self.cfg.domain {
            self.isl.note_change(affected);
        }
        let targets: Vec<FcId> = self
            .scr
            .keys()
            .copied()
            .filter(|r| *r != affected && self.membership.allowed(*r, affected))
            .collect();
        let page = RscnPage {
            event_qualifier: qualifier,
            address_format: rscn_format::PORT,
            affected,
        };
        for t in targets {
            self.queue_rscn(t, vec![page]);
        }
    }

    /// Sends `pages` to `to` now, or merges them into what waits for
    /// `to`'s answer to the RSCN it has.
    pub(super) fn queue_rscn(&mut self, to: FcId, pages: Vec<RscnPage>) {
        let Some(o) = self.rscn_out.get_mut(&to) else {
            self.send_rscn(to, pages);
            return;
        };
        for p in pages {
            merge(&mut o.waiting, p);
        }
    }

    /// `from` answered the RSCN exchange `ox`: what waited goes now.
    pub(super) fn rscn_answered(&mut self, from: FcId, ox: OxId) {
        if self.rscn_out.get(&from).is_none_or(|o| o.ox != ox) {
            return;
        }
        let waiting = self
            .rscn_out
            .remove(&from)
            .map(|o| o.waiting)
            .unwrap_or_default();
        if !waiting.is_empty() {
            self.send_rscn(from, waiting);
        }
    }

    /// A port left: nothing more is owed to it.
    pub(super) fn rscn_forget(&mut self, port: FcId) {
        self.rscn_out.remove(&port);
    }

    /// Sends what waits behind RSCNs unanswered for 2 × R_A_TOV. Cheap
    /// when none is due: one comparison.
    pub(super) fn rscn_expire(&mut self, now: Instant) {
        if self.now < now {
            self.now = now;
        }
        let limit = self.cfg.timeouts.els_timeout();
        if self.rscn_due.is_none_or(|d| now < d) {
            return;
        }
        let due: Vec<FcId> = self
            .rscn_out
            .iter()
            .filter(|(_, o)| now.saturating_duration_since(o.sent) >= limit)
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let waiting = self
                .rscn_out
                .remove(&id)
                .map(|o| o.waiting)
                .unwrap_or_default();
            if !waiting.is_empty() {
                self.send_rscn(id, waiting);
            }
        }
        self.rscn_due = self.rscn_out.values().map(|o| o.sent + limit).min();
    }

    fn send_rscn(&mut self, to: FcId, mut pages: Vec<RscnPage>) {
        let Some(port) = self.logins.get(&to).map(|l| l.port) else {
            return;
        };
        if pages.len() > MAX_PAGES {
            pages = vec![everything()];
        }
        let ox = OxId(self.next_ox);
        self.next_ox = if self.next_ox >= 0xfffe {
            0
        } else {
            self.next_ox + 1
        };
        self.rscns_sent += 1;
        let f = compose::els(
            Route::request(FcId::FABRIC_CONTROLLER, to, ox),
            &ElsRepr::Rscn(Rscn { pages }),
        );
        let sent = self.now;
        self.rscn_out.insert(
            to,
            Outstanding {
                ox,
                sent,
                waiting: Vec::new(),
            },
        );
        let due = sent + self.cfg.timeouts.els_timeout();
        self.rscn_due = Some(self.rscn_due.map_or(due, |d| d.min(due)));
        self.send(port, f);
    }
}

/// The page that names the whole fabric.
fn everything() -> RscnPage {
    RscnPage {
        event_qualifier: 0,
        address_format: rscn_format::FABRIC,
        affected: FcId::UNIDENTIFIED,
    }
}

/// Adds `page` to `waiting` unless a page there already covers its
/// address; two events for one address become one page, its qualifier
/// "not specified" when they differ. Past one payload, everything.
fn merge(waiting: &mut Vec<RscnPage>, page: RscnPage) {
    if waiting
        .first()
        .is_some_and(|p| p.address_format == rscn_format::FABRIC)
    {
        return;
    }
    if let Some(p) = waiting
        .iter_mut()
        .find(|p| p.address_format == page.address_format && p.affected == page.affected)
    {
        if p.event_qualifier != page.event_qualifier {
            p.event_qualifier = 0;
        }
        return;
    }
    if waiting.len() >= MAX_PAGES {
        *waiting = vec![everything()];
        return;
    }
    waiting.push(page);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(id: u32, q: u8) -> RscnPage {
        RscnPage {
            event_qualifier: q,
            address_format: rscn_format::PORT,
            affected: FcId::new(id),
        }
    }

    #[test]
    fn pages_merge_per_address_and_collapse_past_one_payload() {
        let mut w = Vec::new();
        merge(&mut w, port(0x010100, 0));
        merge(&mut w, port(0x010100, 1));
        merge(&mut w, port(0x010200, 1));
        merge(&mut w, port(0x010200, 1));
        assert_eq!(w, vec![port(0x010100, 0), port(0x010200, 1)]);
        for i in 0..MAX_PAGES as u32 {
            merge(&mut w, port(0x020000 + i, 0));
        }
        assert_eq!(w, vec![everything()]);
        merge(&mut w, port(0x010300, 0));
        assert_eq!(w, vec![everything()]);
    }
}
