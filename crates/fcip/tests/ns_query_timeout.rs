//! A remote domain whose name server never answers: each query the
//! controller sends it gives up after its timeout and leaves nothing
//! behind (bounded memory per peer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::sync::mpsc;
use unifab_fc::fabric::FabricConfig;
use unifab_fc::io::Switch;
use unifab_fc::wire::Wwn;
use unifab_fc::wire::header::{FcType, RCtl};
use unifab_fcip::io::InterSwitch;
use unifab_fcip::io::controller::LinkHandle;
use unifab_fcip::proto::fspf::{DEFAULT_COST, Fspf};
use unifab_fcip::wire::sw_ils::{FspfHeader, Lsu, SwIlsRepr};

const SW_A: Wwn = Wwn(0x1000_0000_0000_00a1);
const SW_B: Wwn = Wwn(0x1000_0000_0000_00b1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_name_server_queries_leave_nothing_behind() {
    let a = Switch::new(FabricConfig {
        domain: 1,
        switch_name: SW_A,
        ..FabricConfig::default()
    });
    let ctl = InterSwitch::start(a);
    // A link to domain 2 whose frames land here and are never answered.
    let (tx, mut link) = mpsc::channel(64);
    ctl.link_up(1, LinkHandle { tx, neighbor: 2 }, &[(2, SW_B)]);
    // Domain 2's link record names the link back: the route comes up, and
    // the controller asks domain 2's name server for its ports.
    let mut b = Fspf::new(2);
    b.link_up(1, 1, 1, DEFAULT_COST);
    ctl.on_fspf(
        1,
        SwIlsRepr::Lsu(Lsu {
            header: FspfHeader {
                version: 2,
                domain: 2,
                ..FspfHeader::default()
            },
            flags: 0,
            records: vec![b.own()],
        }),
    );
    assert_eq!(ctl.routes().get(&2), Some(&1), "no route to domain 2");
    let query = loop {
        let f = tokio::time::timeout(Duration::from_secs(30), link.recv())
            .await
            .expect("no name server query was sent to domain 2")
            .expect("the link closed");
        if f.header.fc_type == FcType::CT {
            break f;
        }
    };
    assert_eq!(query.header.r_ctl, RCtl::CT_REQUEST);
    assert_eq!(ctl.queries_waiting(), 1);
    // The query times out (after 5 s); its entry must go with it. The
    // bound here is only how long to wait before failing.
    for _ in 0..300 {
        if ctl.queries_waiting() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        ctl.queries_waiting(),
        0,
        "a query that timed out is still waiting"
    );
}
