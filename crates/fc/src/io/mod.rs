//! tokio drivers (feature `io`): the in-memory link, the switch that runs
//! the sans-IO [`Fabric`](crate::fabric::Fabric) and routes frames between
//! attached links, the node driver that runs N_Ports (the gateway's FCP
//! target and initiator ports), and the scsi-core
//! [`Initiator`](unifab_scsi_core::initiator::Initiator) over FCP.

pub mod initiator;
pub mod memory;
pub mod node;
pub mod switch;

pub use initiator::{FcpInitiator, FcpInitiatorFactory, NpivNames, virtual_port_name};
pub use memory::MemoryLink;
pub use node::{
    Connect, FcNode, NodePortView, SESSION_RECORDS, STATS_REFRESH, SessionRecord, Uplink,
};
pub use switch::{FabricPort, Switch};
