//! EXTENDED COPY (LID1) as the device server runs it: the checks, the
//! plan [`super::xcopy`] parsed, the copy itself, and the result kept for
//! RECEIVE COPY RESULTS.

use super::*;

impl Inner {
    /// EXTENDED COPY (LID1): checks the parameter list, then copies each
    /// segment within this LU.
    pub(super) async fn extended_copy(
        self: &Arc<Self>,
        task: &Task,
        service_action: u8,
        param_len: u32,
    ) -> TaskResult {
        if service_action != 0 {
            return bad_cdb(1, Some(4));
        }
        if param_len == 0 {
            return TaskResult::good();
        }
        if self.write_protected.load(Ordering::Acquire) {
            return write_protected();
        }
        // Longer than any list the limits allow: refused by the parser
        // from its header; no need to gather more than the limit.
        let cap = 16 + xcopy::MAX_DESCRIPTOR_LIST_LENGTH as usize + 64;
        let want = (param_len as usize).min(cap);
        let p = gather(&task.data_out, 0, want);
        if p.len() < want {
            return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
        }
        let plan = match xcopy::CopyPlan::parse(&p, self.naa, self.bs as u32) {
            Ok(plan) => plan,
            Err(sense) => return TaskResult::check_condition(sense),
        };
        let mut status = xcopy::CopyStatus {
            ok: true,
            segments: 0,
            bytes: 0,
        };
        let mut result = TaskResult::good();
        let fence = Fence::of(&self.alua, task);
        for seg in &plan.segments {
            let n = u64::from(seg.blocks);
            if self.range(seg.src_lba, n).is_some() || self.range(seg.dst_lba, n).is_some() {
                status.ok = false;
                result = check(SenseKey::COPY_ABORTED, asc::NO_ADDITIONAL_SENSE);
                break;
            }
            let len = n << self.shift;
            let (src, dst) = (seg.src_lba << self.shift, seg.dst_lba << self.shift);
            let fence = fence.clone();
            let res = self
                .io(move |me| {
                    let _g = me.write_lock.read().unwrap_or_else(|p| p.into_inner());
                    copy_within(me.backend.as_ref(), src, dst, len, &|| me.fence(&fence))
                })
                .await;
            match res {
                Some(Ok(())) => {
                    status.segments += 1;
                    status.bytes += len;
                }
                Some(Err(e @ BackendError::PortUnavailable)) => {
                    // Fenced between two pieces: what the copy wrote so far
                    // stays, and the host hears why it stopped.
                    status.ok = false;
                    result = backend_failed(&e, true, self.shift);
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "EXTENDED COPY segment failed");
                    status.ok = false;
                    result = check(
                        SenseKey::COPY_ABORTED,
                        xcopy::COPY_TARGET_DEVICE_NOT_REACHABLE,
                    );
                    break;
                }
                None => {
                    status.ok = false;
                    result = check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE);
                    break;
                }
            }
        }
        if plan.list_id_usage == 0 {
            let key = PortKey::of(&task.nexus);
            let mut st = self.lock();
            st.copy_results
                .retain(|(k, id, _)| !(*k == key && *id == plan.list_id));
            if st.copy_results.len() >= COPY_RESULTS_KEPT {
                st.copy_results.pop_front();
            }
            st.copy_results.push_back((key, plan.list_id, status));
        }
        result
    }
}
