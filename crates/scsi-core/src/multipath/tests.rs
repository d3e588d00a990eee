//! Two paths (two target ports of two groups) to one emulated LU with
//! ALUA, through loopback initiators; a path can be cut.

use std::sync::atomic::AtomicBool;

use super::*;
use crate::alua::{AluaConfig, PortGroup};
use crate::backend::MemoryBackend;
use crate::emulated::{EmulatedLu, EmulatedLuConfig, IoMode};
use crate::initiator::LoopbackFactory;
use crate::lu::LogicalUnit;
use crate::task::{TargetPort, TransportId};

fn lu() -> Arc<EmulatedLu> {
    let group = |id: u16, state| PortGroup {
        id,
        state,
        preferred: false,
        ports: vec![id],
    };
    Arc::new(
        EmulatedLu::new(
            EmulatedLuConfig {
                io_mode: IoMode::Inline,
                alua: AluaConfig {
                    groups: vec![
                        group(1, AccessState::ActiveOptimized),
                        group(2, AccessState::ActiveNonOptimized),
                    ],
                    explicit: true,
                    transition_secs: 1,
                },
                ..EmulatedLuConfig::default()
            },
            Arc::new(MemoryBackend::new(1 << 20)),
        )
        .unwrap(),
    )
}

fn port(n: u16) -> TargetPort {
    TargetPort {
        id: TransportId::Iscsi {
            name: format!("iqn.2026-11.test:t,t,{n:#x}"),
            isid: None,
        },
        relative_port_id: n,
        port_group: n,
    }
}

/// A path that can be cut: its commands then fail as after a connection
/// loss.
#[derive(Debug)]
struct Cuttable {
    inner: Arc<dyn Initiator>,
    cut: Arc<AtomicBool>,
}

impl Initiator for Cuttable {
    fn submit(&self, request: Request) -> Submitted {
        if self.cut.load(Ordering::SeqCst) {
            return Submitted::failed(InitiatorError::Disconnected);
        }
        self.inner.submit(request)
    }
    fn task_management(
        &self,
        lun: Lun,
        function: TmfFunction,
    ) -> BoxFuture<'static, Result<TmfResponse, InitiatorError>> {
        self.inner.task_management(lun, function)
    }
    fn close(&self) {
        self.inner.close();
    }
    fn remote(&self) -> String {
        self.inner.remote()
    }
}

#[derive(Debug)]
struct CuttableFactory {
    inner: LoopbackFactory,
    cut: Arc<AtomicBool>,
}

impl InitiatorFactory for CuttableFactory {
    fn open(&self, nexus: Option<&ItNexus>) -> Result<Arc<dyn Initiator>, InitiatorError> {
        Ok(Arc::new(Cuttable {
            inner: self.inner.open(nexus)?,
            cut: self.cut.clone(),
        }))
    }
    fn per_nexus(&self) -> bool {
        false
    }
}

/// Paths listed non-optimized first: port 2 (group 2), then port 1.
fn two_paths(lu: &Arc<EmulatedLu>) -> (MultipathFactory, Arc<AtomicBool>, Arc<AtomicBool>) {
    let own = TransportId::Iscsi {
        name: "iqn.2026-11.test:gateway".into(),
        isid: Some([0x40, 0, 0, 0, 0, 9]),
    };
    let cut1 = Arc::new(AtomicBool::new(false));
    let cut2 = Arc::new(AtomicBool::new(false));
    let path = |n: u16, cut: &Arc<AtomicBool>| -> (String, Arc<dyn InitiatorFactory>) {
        (
            format!("port {n}"),
            Arc::new(CuttableFactory {
                inner: LoopbackFactory::new(
                    lu.clone() as Arc<dyn LogicalUnit>,
                    port(n),
                    own.clone(),
                    false,
                ),
                cut: cut.clone(),
            }),
        )
    };
    let f = MultipathFactory::new(vec![path(2, &cut2), path(1, &cut1)]);
    (f, cut1, cut2)
}

const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

async fn read(i: &Arc<dyn Initiator>) -> Outcome {
    i.submit(Request::new(
        Lun::ZERO,
        bytes::Bytes::from_static(&READ10),
        512,
    ))
    .outcome
    .await
}

/// Reads until GOOD, past unit attentions (as a host does); at most 8.
async fn read_good(i: &Arc<dyn Initiator>) {
    for _ in 0..8 {
        if read(i).await.unwrap().status == Status::GOOD {
            return;
        }
    }
    panic!("no GOOD read");
}

/// Two paths in use (a read passed), then the groups swap: group 1
/// Standby, group 2 Active/Optimized.
async fn in_use_then_swapped() -> (Arc<EmulatedLu>, MultipathFactory, Arc<dyn Initiator>) {
    let lu = lu();
    let (f, _, _) = two_paths(&lu);
    let i = f.open(None).unwrap();
    read_good(&i).await;
    assert!(lu.set_alua_state(1, AccessState::Standby));
    assert!(lu.set_alua_state(2, AccessState::ActiveOptimized));
    (lu, f, i)
}

fn states(f: &MultipathFactory) -> Vec<(Option<u16>, Option<AccessState>)> {
    f.paths().iter().map(|p| (p.group, p.state)).collect()
}

#[tokio::test]
async fn learns_each_paths_state_and_prefers_the_optimized_one() {
    let lu = lu();
    let (f, _, cut2) = two_paths(&lu);
    let i = f.open(None).unwrap();
    read_good(&i).await;
    assert_eq!(
        states(&f),
        vec![
            (Some(2), Some(AccessState::ActiveNonOptimized)),
            (Some(1), Some(AccessState::ActiveOptimized))
        ]
    );
    // The non-optimized path (listed first) is not used: cut it, and
    // reads still pass with no failure counted.
    cut2.store(true, Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(read(&i).await.unwrap().status, Status::GOOD);
    }
    assert!(f.paths().iter().all(|p| p.failures == 0), "{:?}", f.paths());
}

#[tokio::test]
async fn a_transition_moves_commands_to_the_path_that_became_optimized() {
    // Group 1 goes Standby, group 2 Active/Optimized: the next command
    // hears the change, the states are learnt again, and reads go to
    // port 2.
    let (_lu, f, i) = in_use_then_swapped().await;
    read_good(&i).await;
    assert_eq!(
        states(&f),
        vec![
            (Some(2), Some(AccessState::ActiveOptimized)),
            (Some(1), Some(AccessState::Standby))
        ]
    );
    assert_eq!(read(&i).await.unwrap().status, Status::GOOD);
}

#[tokio::test]
async fn a_refused_or_lost_command_goes_to_the_other_path_when_it_may() {
    let lu = lu();
    let (f, cut1, _) = two_paths(&lu);
    let i = f.open(None).unwrap();
    read_good(&i).await;
    // The optimized path's connection is lost: a read (which may run
    // twice) goes to the other path, and the failure is counted.
    cut1.store(true, Ordering::SeqCst);
    assert_eq!(read(&i).await.unwrap().status, Status::GOOD);
    let p1 = &f.paths()[1];
    assert_eq!(p1.failures, 1, "{p1:?}");
    assert!(p1.last_error.as_deref().unwrap().contains("lost"), "{p1:?}");
    // COMPARE AND WRITE may not run twice: it fails with the transport's
    // error when its path is lost... unless the path it goes to is the
    // live one. Cut both to see it fail.
    let caw = {
        let mut c = [0u8; 16];
        c[0] = 0x89;
        c[13] = 1;
        c
    };
    f.shared.stale.store(false, Ordering::SeqCst);
    {
        let mut ps = f.shared.paths.lock().unwrap();
        ps[1].state = Some(AccessState::ActiveOptimized);
        ps[1].last_error = None;
    }
    let r = i
        .submit(Request::with_data_out(
            Lun::ZERO,
            bytes::Bytes::copy_from_slice(&caw),
            bytes::Bytes::from(vec![0u8; 1024]),
        ))
        .outcome
        .await;
    assert_eq!(r.unwrap_err(), InitiatorError::Disconnected);
    // Back: once the states are learnt again the optimized path is used.
    cut1.store(false, Ordering::SeqCst);
    f.shared.stale.store(true, Ordering::SeqCst);
    read_good(&i).await;
    assert!(f.paths()[1].last_error.is_none(), "{:?}", f.paths());
}

#[test]
fn vpd_and_rtpg_parsers_find_the_group_and_its_state() {
    // VPD 83h: a relative port designator, then a target port group one.
    let vpd = [
        0, 0x83, 0, 16, 0x61, 0x94, 0, 4, 0, 0, 0, 7, 0x61, 0x95, 0, 4, 0, 0, 0, 3,
    ];
    assert_eq!(port_group(&vpd), Some(3));
    assert_eq!(port_group(&vpd[..12]), None);
    // RTPG, extended format, two groups.
    let rtpg = [
        0, 0, 0, 28, 0x10, 10, 0, 0, //
        0x80, 0x8f, 0, 1, 0, 2, 0, 1, 0, 0, 0, 1, //
        0x02, 0x8f, 0, 3, 0, 2, 0, 1, 0, 0, 0, 3,
    ];
    assert_eq!(group_state(&rtpg, 3), Some(AccessState::Standby));
    assert_eq!(group_state(&rtpg, 1), Some(AccessState::ActiveOptimized));
    assert_eq!(group_state(&rtpg, 9), None);
    assert_eq!(group_state(&rtpg[..6], 1), None);
}

/// On a shared remote nexus the probes ask on the hosts' nexus: a unit
/// attention they meet is handed to the hosts, not swallowed. Here the
/// LU's states change and it turns read-only: the host's next read hears
/// the state change through the old path, the probes then meet MODE
/// PARAMETERS CHANGED on both paths, and the host hears that too before
/// its reads pass. Fails where the probes keep what they meet.
#[tokio::test]
async fn unit_attentions_the_probes_meet_on_a_shared_nexus_reach_the_host() {
    let (lu, _f, i) = in_use_then_swapped().await;
    lu.set_read_only(true).unwrap();
    let mut heard = Vec::new();
    for _ in 0..8 {
        let r = read(&i).await.unwrap();
        if r.status == Status::GOOD {
            break;
        }
        let s = Sense::parse(r.sense.as_ref().unwrap()).unwrap();
        assert_eq!(s.key, SenseKey::UNIT_ATTENTION, "{s:?}");
        heard.push(s.asc);
    }
    assert!(
        heard.contains(&crate::sense::asc::MODE_PARAMETERS_CHANGED),
        "the host never heard MODE PARAMETERS CHANGED: {heard:?}"
    );
    assert_eq!(read(&i).await.unwrap().status, Status::GOOD);
}
