//! The inter-switch controller of one switch: FSPF over the switch's
//! VE_Ports (routes programmed into the fabric), the distributed name
//! server (every reachable domain's ports fetched from its domain
//! controller with GA_NXT/GFF_ID and entered into the local fabric), and
//! SW_RSCN both ways (local changes announced to every domain; a remote
//! announcement re-fetches that domain).
//!
//! Every frame the controller sends is class F from `FFFC<own domain>`:
//! FSPF frames go on the link they concern, everything else to `FFFC<d>`
//! through the route to `d` (intermediate switches forward it like any
//! other frame).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use unifab_fc::fabric::isl::domain_controller;
use unifab_fc::fabric::name_server::NsEntry;
use unifab_fc::io::Switch;
use unifab_fc::wire::ct::{CtBody, CtIu, NsAccept, NsRequest};
use unifab_fc::wire::frame::Frame;
use unifab_fc::wire::header::{FCtl, FcType, RCtl};
use unifab_fc::wire::{Eof, FcHeaderRepr, FcId, OxId, RxId, Sof, Wwn};

use crate::proto::eport::sw_ils_frame;
use crate::proto::fspf::{DEFAULT_COST, Fspf};
use crate::wire::sw_ils::{FspfHeader, Lsa, Lsu, RscnDevice, SwAcc, SwIlsRepr, SwRscn};

/// A VE_Port as the controller sees it: where to send class F frames.
#[derive(Debug, Clone)]
pub struct LinkHandle {
    /// Class F frames to send on the link.
    pub tx: mpsc::Sender<Frame>,
    /// The neighbour's domain.
    pub neighbor: u8,
}

#[derive(Debug)]
struct Ctl {
    fspf: Fspf,
    links: BTreeMap<u32, LinkHandle>,
    routes: BTreeMap<u8, u32>,
    pending: HashMap<u16, oneshot::Sender<Frame>>,
    next_ox: u16,
    /// Switch names of known domains (from EFP).
    names: BTreeMap<u8, Wwn>,
}

/// The controller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct InterSwitch {
    switch: Switch,
    domain: u8,
    ctl: Arc<Mutex<Ctl>>,
    sync: mpsc::Sender<u8>,
}

/// How long a name server query across the fabric may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// A query's entry in `Ctl::pending`, removed when this is dropped.
struct Waiting<'a> {
    ctl: &'a Mutex<Ctl>,
    ox: u16,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // OX_IDs of waiting queries are never reused, so the entry is ours.
        let mut c = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        c.pending.remove(&self.ox);
    }
}

impl InterSwitch {
    /// A controller for `switch`; spawns its background tasks (must run
    /// inside a tokio runtime).
    pub fn start(switch: Switch) -> InterSwitch {
        let domain = switch.with_fabric(|f| f.config().domain);
        let (sync, rx) = mpsc::channel(256);
        let me = InterSwitch {
            switch,
            domain,
            ctl: Arc::new(Mutex::new(Ctl {
                fspf: Fspf::new(domain),
                links: BTreeMap::new(),
                routes: BTreeMap::new(),
                pending: HashMap::new(),
                next_ox: 1,
                names: BTreeMap::new(),
            })),
            sync,
        };
        tokio::spawn(me.clone().sync_loop(rx));
        tokio::spawn(me.clone().rscn_loop());
        me
    }

    fn lock(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This switch's domain.
    pub fn domain(&self) -> u8 {
        self.domain
    }

    /// The switch.
    pub fn switch(&self) -> &Switch {
        &self.switch
    }

    /// Domains reachable now with their switch names, this switch's
    /// first (the domain list EFP announces).
    pub fn known_domains(&self) -> Vec<(u8, Wwn)> {
        let own = self.switch.with_fabric(|f| f.switch_name());
        let c = self.lock();
        let mut v = vec![(self.domain, own)];
        for (d, w) in &c.names {
            if c.routes.contains_key(d) {
                v.push((*d, *w));
            }
        }
        v
    }

    /// Current routes: domain → fabric port number (index + 1).
    pub fn routes(&self) -> BTreeMap<u8, u32> {
        self.lock().routes.clone()
    }

    fn fspf_frame(&self, r: SwIlsRepr) -> Frame {
        let fc = FcId::FABRIC_CONTROLLER;
        sw_ils_frame(&r, false, OxId(0x7000), RxId::UNASSIGNED, fc, fc)
    }

    fn header(&self) -> FspfHeader {
        FspfHeader {
            version: 2,
            domain: self.domain,
            ..FspfHeader::default()
        }
    }

    /// A VE_Port came up on fabric port `port` (index + 1) to `neighbor`,
    /// whose EFP listed `domains`.
    pub fn link_up(&self, port: u32, link: LinkHandle, domains: &[(u8, Wwn)]) {
        let (db, others) = {
            let mut c = self.lock();
            for (d, w) in domains {
                if *d != self.domain {
                    c.names.insert(*d, *w);
                }
            }
            c.fspf.link_up(port, link.neighbor, 0, DEFAULT_COST);
            c.links.insert(port, link);
            let others: Vec<mpsc::Sender<Frame>> = c.links.values().map(|l| l.tx.clone()).collect();
            (c.fspf.database(), others)
        };
        let lsu = self.fspf_frame(SwIlsRepr::Lsu(Lsu {
            header: self.header(),
            flags: 0,
            records: db,
        }));
        for tx in others {
            let _ = tx.try_send(lsu.clone());
        }
        self.recompute();
    }

    /// A VE_Port went down.
    pub fn link_down(&self, port: u32) {
        let (own, others) = {
            let mut c = self.lock();
            if c.links.remove(&port).is_none() {
                return;
            }
            let own = c.fspf.link_down(port);
            (
                own,
                c.links.values().map(|l| l.tx.clone()).collect::<Vec<_>>(),
            )
        };
        let lsu = self.fspf_frame(SwIlsRepr::Lsu(Lsu {
            header: self.header(),
            flags: 0,
            records: vec![own],
        }));
        for tx in others {
            let _ = tx.try_send(lsu.clone());
        }
        self.recompute();
    }

    /// An FSPF frame from the link on `port`.
    pub fn on_fspf(&self, port: u32, repr: SwIlsRepr) {
        let SwIlsRepr::Lsu(lsu) = repr else {
            return; // HLO (keep-alive, see the tunnel) and LSA need nothing here.
        };
        let mut newer = Vec::new();
        let (ack_tx, others) = {
            let mut c = self.lock();
            for r in &lsu.records {
                if c.fspf.receive(r) {
                    newer.push(r.clone());
                }
            }
            let ack_tx = c.links.get(&port).map(|l| l.tx.clone());
            let others: Vec<mpsc::Sender<Frame>> = c
                .links
                .iter()
                .filter(|(p, _)| **p != port)
                .map(|(_, l)| l.tx.clone())
                .collect();
            (ack_tx, others)
        };
        if let Some(tx) = ack_tx {
            let lsa = self.fspf_frame(SwIlsRepr::Lsa(Lsa {
                header: self.header(),
                flags: 0,
                headers: lsu.records.iter().map(|r| r.header).collect(),
            }));
            let _ = tx.try_send(lsa);
        }
        if !newer.is_empty() {
            let f = self.fspf_frame(SwIlsRepr::Lsu(Lsu {
                header: self.header(),
                flags: 0,
                records: newer,
            }));
            for tx in others {
                let _ = tx.try_send(f.clone());
            }
            self.recompute();
        }
    }

    fn recompute(&self) {
        let (new, old) = {
            let mut c = self.lock();
            let new = c.fspf.routes();
            let old = std::mem::replace(&mut c.routes, new.clone());
            (new, old)
        };
        if new == old {
            return;
        }
        self.switch.with_fabric(|f| {
            for d in old.keys().filter(|d| !new.contains_key(d)) {
                f.set_route(*d, None);
                f.set_remote_entries(*d, Vec::new());
            }
            for (d, p) in &new {
                f.set_route(*d, Some(unifab_fc::fabric::PortIndex(*p as usize - 1)));
            }
        });
        info!(domain = self.domain, routes = ?new, "FSPF routes");
        for d in new.keys() {
            if old.get(d) != new.get(d) {
                let _ = self.sync.try_send(*d);
            }
        }
    }

    fn send_to_domain(&self, d: u8, f: Frame) -> bool {
        let tx = {
            let c = self.lock();
            c.routes
                .get(&d)
                .and_then(|p| c.links.get(p))
                .map(|l| l.tx.clone())
        };
        tx.is_some_and(|t| t.try_send(f).is_ok())
    }

    /// A frame for this switch's domain controller (`FFFC<domain>`) that
    /// arrived over a tunnel: CT replies to our queries, SW_RSCN.
    pub fn deliver(&self, f: Frame) {
        let h = f.header;
        if h.fc_type == FcType::CT && h.r_ctl == RCtl::CT_REPLY {
            if let Some(tx) = self.lock().pending.remove(&h.ox_id.0) {
                let _ = tx.send(f);
            }
            return;
        }
        if h.fc_type == FcType::SW_ILS
            && h.r_ctl == RCtl(0x02)
            && let Ok(SwIlsRepr::Rscn(r)) = SwIlsRepr::parse(&f.payload, None)
        {
            let ack = sw_ils_frame(
                &SwIlsRepr::Acc(SwAcc::Plain),
                true,
                h.ox_id,
                RxId(0x20),
                h.d_id,
                h.s_id,
            );
            if let Some(d) = unifab_fc::fabric::isl::controller_domain(h.s_id) {
                self.send_to_domain(d, ack);
            }
            let d = r.affected.domain();
            debug!(from = %h.s_id, affected = %r.affected, "SW_RSCN");
            let _ = self.sync.try_send(d);
        }
        // Accepts of our SW_RSCNs: nothing to do.
    }

    /// Name server queries sent across the fabric and not yet answered
    /// (each waits at most `QUERY_TIMEOUT`).
    pub fn queries_waiting(&self) -> usize {
        self.lock().pending.len()
    }

    async fn query(&self, d: u8, req: NsRequest) -> Option<CtIu> {
        let cmd = req.command();
        let payload = CtIu::request(req).to_bytes().ok()?;
        let (tx, rx) = oneshot::channel();
        // However the query ends (answer, timeout, no route, the caller
        // dropping it), its entry goes with it.
        let waiting = {
            let mut c = self.lock();
            // The next OX_ID no waiting query holds (0 is never used).
            let mut ox = c.next_ox;
            while c.pending.contains_key(&ox) {
                ox = ox.wrapping_add(1).max(1);
                if ox == c.next_ox {
                    warn!("65,535 name server queries waiting; not sending another");
                    return None;
                }
            }
            c.next_ox = ox.wrapping_add(1).max(1);
            c.pending.insert(ox, tx);
            Waiting { ctl: &self.ctl, ox }
        };
        let header = FcHeaderRepr {
            r_ctl: RCtl::CT_REQUEST,
            d_id: domain_controller(d),
            s_id: domain_controller(self.domain),
            fc_type: FcType::CT,
            f_ctl: FCtl::request(),
            ox_id: OxId(waiting.ox),
            rx_id: RxId::UNASSIGNED,
            ..FcHeaderRepr::default()
        };
        let f = Frame {
            sof: Sof::F,
            header,
            payload,
            eof: Eof::T,
        };
        if !self.send_to_domain(d, f) {
            return None;
        }
        let reply = tokio::time::timeout(QUERY_TIMEOUT, rx).await.ok()?.ok()?;
        drop(waiting);
        CtIu::parse(&reply.payload, Some(cmd)).ok()
    }

    /// Fetches every port of domain `d` from its name server.
    async fn fetch_domain(&self, d: u8) -> Option<Vec<NsEntry>> {
        let mut out = Vec::new();
        let mut at = FcId::from_parts(d, 0, 0);
        for _ in 0..4096 {
            let iu = self.query(d, NsRequest::GaNxt(at)).await?;
            let CtBody::Accept(NsAccept::Object(o)) = iu.body else {
                break; // a reject: no more ports
            };
            if o.port_id.domain() != d || o.port_id <= at {
                break;
            }
            at = o.port_id;
            let features = match self.query(d, NsRequest::GffId(o.port_id)).await {
                Some(CtIu {
                    body: CtBody::Accept(NsAccept::Features(f)),
                    ..
                }) => *f,
                _ => Default::default(),
            };
            out.push(NsEntry {
                fc_id: o.port_id,
                port_name: o.port_name,
                node_name: o.node_name,
                port_type: o.port_type,
                class_of_service: o.class_of_service,
                fc4_types: o.fc4_types,
                fc4_features: features,
                symbolic_port_name: o.symbolic_port_name.clone(),
                symbolic_node_name: o.symbolic_node_name.clone(),
                fabric_port_name: o.fabric_port_name,
            });
        }
        Some(out)
    }

    async fn sync_loop(self, mut rx: mpsc::Receiver<u8>) {
        while let Some(first) = rx.recv().await {
            // Coalesce a burst of requests.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut todo = vec![first];
            while let Ok(d) = rx.try_recv() {
                if !todo.contains(&d) {
                    todo.push(d);
                }
            }
            for d in todo {
                if d == self.domain || !self.lock().routes.contains_key(&d) {
                    continue;
                }
                match self.fetch_domain(d).await {
                    Some(entries) => {
                        info!(
                            domain = d,
                            ports = entries.len(),
                            "name server entries of a remote domain"
                        );
                        self.switch
                            .with_fabric(|f| f.set_remote_entries(d, entries));
                    }
                    None => warn!(domain = d, "remote name server did not answer"),
                }
            }
        }
    }

    async fn rscn_loop(self) {
        let notify = self.switch.local_changes();
        loop {
            notify.notified().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
            let changed = self.switch.with_fabric(|f| f.take_local_changes());
            let domains: Vec<u8> = self.lock().routes.keys().copied().collect();
            if domains.is_empty() {
                continue;
            }
            let entries = self.switch.with_fabric(|f| f.local_entries());
            for id in changed {
                let e = entries.iter().find(|e| e.fc_id == id);
                let dev = RscnDevice {
                    state: if e.is_some() { 1 } else { 2 },
                    port_id: id,
                    port_name: e.map_or(Default::default(), |e| e.port_name),
                    node_name: e.map_or(Default::default(), |e| e.node_name),
                };
                let r = SwIlsRepr::Rscn(SwRscn {
                    event_format: 0,
                    affected: id,
                    detection: 1,
                    devices: vec![dev],
                });
                for d in &domains {
                    let f = sw_ils_frame(
                        &r,
                        false,
                        OxId(0x7100),
                        RxId::UNASSIGNED,
                        domain_controller(self.domain),
                        domain_controller(*d),
                    );
                    self.send_to_domain(*d, f);
                }
            }
        }
    }
}
