//! The target driver against libiscsi's command-line tools (Debian
//! libiscsi-bin), over a RAM "LU" that understands just enough SCSI for
//! them. The full SPC/SBC conformance run lives in the gateway's tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;
use unifab_iscsi::target::server::{ChapSettings, ServerConfig, TargetNode, TargetServer};
use unifab_scsi_core::{
    BoxFuture, Dispatch, ItNexus, Sense, SenseKey, Task, TaskResult, TmfRequest, TmfResponse,
    sense::asc,
};

const IQN: &str = "iqn.2026-11.io.unifab:smoke";

#[derive(Debug)]
struct RamDisk {
    data: Mutex<Vec<u8>>,
}

impl Dispatch for RamDisk {
    fn dispatch(&self, task: Task) -> BoxFuture<'static, TaskResult> {
        let cdb = task.cdb.as_bytes().to_vec();
        let result = match cdb.first().copied() {
            Some(0x00) => TaskResult::good(),
            Some(0x12) => {
                let mut inq = vec![0u8; 36];
                inq[2] = 6;
                inq[3] = 2;
                inq[4] = 31;
                inq[8..16].copy_from_slice(b"UNIFAB  ");
                inq[16..32].copy_from_slice(b"SMOKE           ");
                inq[32..36].copy_from_slice(b"0001");
                TaskResult::with_data(Bytes::from(inq))
            }
            Some(0xa0) => {
                let mut r = vec![0u8; 16];
                r[3] = 8;
                TaskResult::with_data(Bytes::from(r))
            }
            Some(0x25) => {
                let blocks = self.data.lock().unwrap().len() as u32 / 512;
                let mut r = (blocks - 1).to_be_bytes().to_vec();
                r.extend_from_slice(&512u32.to_be_bytes());
                TaskResult::with_data(Bytes::from(r))
            }
            _ => TaskResult::check_condition(Sense::new(
                SenseKey::ILLEGAL_REQUEST,
                asc::INVALID_COMMAND_OPERATION_CODE,
            )),
        };
        Box::pin(async move { result })
    }
    fn task_management(&self, _r: TmfRequest) -> BoxFuture<'static, TmfResponse> {
        Box::pin(async { TmfResponse::FunctionComplete })
    }
    fn nexus_loss(&self, _n: &ItNexus) {}
}

fn tool(name: &str) -> Command {
    // Fail with the reason when the peer is missing: never skip.
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{name} is not installed: run scripts/setup.sh (Debian package libiscsi-bin)"
    );
    Command::new(name)
}

async fn start(chap: Option<ChapSettings>) -> (std::net::SocketAddr, watch::Sender<bool>) {
    let node = TargetNode {
        name: IQN.into(),
        alias: Some("smoke".into()),
        scsi: Arc::new(RamDisk {
            data: Mutex::new(vec![0; 1 << 20]),
        }),
        allow: None,
        chap,
    };
    let (server, listeners) = TargetServer::bind(
        &["127.0.0.1:0".parse().unwrap()],
        ServerConfig::default(),
        vec![node],
    )
    .await
    .unwrap();
    let addr = server.local_addrs()[0];
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move { server.run(listeners, rx).await });
    (addr, tx)
}

async fn run(cmd: &mut Command) -> (bool, String) {
    let out = tokio::task::block_in_place(|| cmd.output()).unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iscsi_ls_and_inq() {
    let (addr, _stop) = start(None).await;
    let (ok, text) = run(tool("iscsi-ls").arg("-s").arg(format!("iscsi://{addr}"))).await;
    assert!(ok, "{text}");
    assert!(text.contains(IQN), "{text}");
    assert!(text.contains(&format!("{}", addr.port())), "{text}");

    let (ok, text) = run(tool("iscsi-inq").arg(format!("iscsi://{addr}/{IQN}/0"))).await;
    assert!(ok, "{text}");
    assert!(text.contains("UNIFAB") && text.contains("SMOKE"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_required_and_checked() {
    let chap = ChapSettings {
        user: "alice".into(),
        secret: b"correcthorsebattery".to_vec(),
        mutual: None,
    };
    let (addr, _stop) = start(Some(chap)).await;
    let (ok, text) = run(tool("iscsi-inq").arg(format!("iscsi://{addr}/{IQN}/0"))).await;
    assert!(!ok, "login without CHAP must fail: {text}");
    let (ok, text) =
        run(tool("iscsi-inq").arg(format!("iscsi://alice%wrongsecretxxxx@{addr}/{IQN}/0"))).await;
    assert!(!ok, "wrong secret must fail: {text}");
    let (ok, text) =
        run(tool("iscsi-inq").arg(format!("iscsi://alice%correcthorsebattery@{addr}/{IQN}/0")))
            .await;
    assert!(ok, "{text}");
    assert!(text.contains("UNIFAB"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_chap_with_libiscsi() {
    let chap = ChapSettings {
        user: "alice".into(),
        secret: b"correcthorsebattery".to_vec(),
        mutual: Some(("target1".into(), b"targetsecret1234".to_vec())),
    };
    let (addr, _stop) = start(Some(chap)).await;
    // The initiator checks the target's answer: the right target secret works…
    let ok_url = format!(
        "iscsi://alice%correcthorsebattery@{addr}/{IQN}/0?target_user=target1&target_password=targetsecret1234"
    );
    let (ok, text) = run(tool("iscsi-inq").arg(&ok_url)).await;
    assert!(ok, "{text}");
    assert!(text.contains("UNIFAB"), "{text}");
    // …a wrong one makes libiscsi refuse the target.
    let bad_url = format!(
        "iscsi://alice%correcthorsebattery@{addr}/{IQN}/0?target_user=target1&target_password=wrongwrongwrong"
    );
    let (ok, text) = run(tool("iscsi-inq").arg(&bad_url)).await;
    assert!(
        !ok,
        "a target proving the wrong secret must be refused: {text}"
    );
    // Without asking for mutual CHAP, the target (which requires it) refuses.
    let (ok, text) =
        run(tool("iscsi-inq").arg(format!("iscsi://alice%correcthorsebattery@{addr}/{IQN}/0")))
            .await;
    assert!(!ok, "mutual CHAP is required: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_digest_with_libiscsi() {
    let (addr, _stop) = start(None).await;
    let (ok, text) =
        run(tool("iscsi-inq").arg(format!("iscsi://{addr}/{IQN}/0?header_digest=crc32c"))).await;
    assert!(ok, "{text}");
    assert!(text.contains("UNIFAB"), "{text}");
}
