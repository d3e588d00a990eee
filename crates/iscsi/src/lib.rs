//! iSCSI.
