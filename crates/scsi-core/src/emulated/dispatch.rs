//! The device server's opcode switch: one parsed [`Command`] to the
//! handler of its command set (SPC-4 here and in [`super::spc`], SBC-3 in
//! [`super::sbc`], SANITIZE in [`super::sanitize`], EXTENDED COPY in
//! [`super::xcopy`]).

use super::*;

impl Inner {
    pub(super) async fn dispatch(self: &Arc<Self>, cmd: Command, task: &mut Task) -> TaskResult {
        match cmd {
            Command::TestUnitReady { .. } => TaskResult::good(),
            Command::RequestSense {
                desc, alloc_len, ..
            } => {
                let s = if self.sanitizing.load(Ordering::Acquire) {
                    Sense::new(
                        SenseKey::NOT_READY,
                        asc::LOGICAL_UNIT_NOT_READY_SANITIZE_IN_PROGRESS,
                    )
                } else {
                    Sense::new(SenseKey::NO_SENSE, asc::NO_ADDITIONAL_SENSE)
                };
                data_in(sense_bytes(&s, desc), usize::from(alloc_len))
            }
            Command::Inquiry {
                evpd,
                page_code,
                alloc_len,
                ..
            } => self.inquiry(&task.nexus, evpd, page_code, alloc_len),
            Command::ModeSense {
                ten,
                llbaa,
                dbd,
                pc,
                page_code,
                subpage,
                alloc_len,
                ..
            } => self.mode_sense(ten, llbaa, dbd, pc, page_code, subpage, alloc_len),
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
                ..
            } => self.mode_select(task, ten, pf, sp, param_len),
            Command::LogSense {
                pc,
                page_code,
                subpage,
                param_pointer,
                alloc_len,
                ..
            } => self.log_sense(pc, page_code, subpage, param_pointer, alloc_len),
            Command::Reserve { .. } => {
                let key = PortKey::of(&task.nexus);
                if let Some(store) = self.shared() {
                    return Box::pin(self.change_shared(store, move |s| {
                        if s.pr.is_active() {
                            return Err(PrRefusal::Conflict);
                        }
                        match &s.reserve6 {
                            Some(h) if *h != key => Err(PrRefusal::Conflict),
                            Some(_) => Ok(false),
                            None => {
                                s.reserve6 = Some(key.clone());
                                Ok(true)
                            }
                        }
                    }))
                    .await;
                }
                let mut st = self.lock();
                if st.pr.is_active() {
                    return TaskResult::status(Status::RESERVATION_CONFLICT);
                }
                match &st.reserve6 {
                    Some(h) if *h != key => TaskResult::status(Status::RESERVATION_CONFLICT),
                    _ => {
                        st.reserve6 = Some(key);
                        self.update_reserved(&st);
                        TaskResult::good()
                    }
                }
            }
            Command::Release { .. } => {
                if let Some(store) = self.shared() {
                    let key = PortKey::of(&task.nexus);
                    return Box::pin(self.change_shared(store, move |s| {
                        if s.reserve6.as_ref() != Some(&key) {
                            return Ok(false);
                        }
                        s.reserve6 = None;
                        Ok(true)
                    }))
                    .await;
                }
                let mut st = self.lock();
                if st.reserve6.as_ref() == Some(&PortKey::of(&task.nexus)) {
                    st.reserve6 = None;
                    self.update_reserved(&st);
                }
                TaskResult::good()
            }
            Command::StartStopUnit {
                power_condition,
                loej,
                start,
                ..
            } => {
                // A power condition other than START_VALID ignores LOEJ
                // and START (SBC-3 §5.25).
                if !self.cfg.removable || !loej || power_condition != 0 {
                    return TaskResult::good();
                }
                let st = self.lock();
                if !st.prevent.is_empty() {
                    return illegal(asc::MEDIUM_REMOVAL_PREVENTED);
                }
                self.ejected.store(!start, Ordering::Release);
                TaskResult::good()
            }
            Command::PreventAllow {
                prevent: p @ (0 | 1),
                ..
            } => {
                if self.cfg.removable {
                    let mut st = self.lock();
                    let key = PortKey::of(&task.nexus);
                    if p == 1 {
                        st.prevent.insert(key);
                    } else {
                        st.prevent.remove(&key);
                    }
                }
                TaskResult::good()
            }
            Command::PreventAllow { .. } => bad_cdb(4, Some(1)),
            Command::WriteAtomic16 {
                wrprotect,
                dpo,
                fua,
                lba,
                boundary,
                blocks,
                group,
                control,
            } => {
                if wrprotect != 0 {
                    return bad_cdb(1, Some(7));
                }
                if self.write_protected.load(Ordering::Acquire) {
                    return write_protected();
                }
                if let Some(r) = self.range(lba, u64::from(blocks)) {
                    return r;
                }
                if u32::from(blocks) > self.max_atomic_blocks() {
                    return bad_cdb(12, None);
                }
                // MAXIMUM ATOMIC BOUNDARY SIZE is zero: no boundaries.
                if boundary != 0 {
                    return bad_cdb(10, None);
                }
                let io = BlockIo {
                    size: CdbSize::Sixteen,
                    lba,
                    blocks: u32::from(blocks),
                    protect: 0,
                    dpo,
                    fua,
                    fua_nv: false,
                    rarc: false,
                    bytchk: 0,
                    group,
                    control,
                };
                self.write_locked(io, task, false, true).await
            }
            Command::SendDiagnostic {
                self_test_code,
                self_test,
                param_len,
                ..
            } => {
                let code_ok = if self_test {
                    self_test_code == 0
                } else {
                    matches!(self_test_code, 0 | 1 | 2 | 5 | 6)
                };
                if param_len != 0 {
                    bad_cdb(3, None)
                } else if !code_ok {
                    bad_cdb(1, Some(7))
                } else {
                    TaskResult::good()
                }
            }
            Command::FormatUnit {
                fmtpinfo, fmtdata, ..
            } => {
                if self.write_protected.load(Ordering::Acquire) {
                    return write_protected();
                }
                if fmtpinfo != 0 {
                    return bad_cdb(1, Some(7));
                }
                if fmtdata {
                    let hdr = gather(&task.data_out, 0, 4);
                    if hdr.len() < 4 {
                        return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                    }
                    if hdr.get(2..4) != Some(&[0, 0][..]) {
                        return bad_param(2, None);
                    }
                }
                TaskResult::good()
            }
            Command::ReadCapacity10 { .. } => {
                let last = self.blocks().saturating_sub(1).min(0xffff_ffff) as u32;
                let mut v = Vec::with_capacity(8);
                v.extend_from_slice(&last.to_be_bytes());
                v.extend_from_slice(&(self.bs as u32).to_be_bytes());
                TaskResult::with_data(Bytes::from(v))
            }
            Command::ReadCapacity16 { alloc_len, .. } => {
                let mut v = vec![0u8; 32];
                v[0..8].copy_from_slice(&self.blocks().saturating_sub(1).to_be_bytes());
                v[8..12].copy_from_slice(&(self.bs as u32).to_be_bytes());
                v[13] = self.lbppbe;
                if self.thin {
                    v[14] = 0x80 | 0x40; // LBPME, LBPRZ
                }
                data_in(v, alloc_len as usize)
            }
            Command::Read(io) => self.read(io).await,
            Command::Write(io) => self.write(io, task, false).await,
            Command::WriteAndVerify(io) => self.write(io, task, true).await,
            Command::Sanitize {
                immed,
                service_action,
                param_len,
                ..
            } => self.sanitize(task, immed, service_action, param_len).await,
            Command::ExtendedCopy {
                service_action,
                param_len,
                ..
            } => self.extended_copy(task, service_action, param_len).await,
            Command::ReceiveCopyResults {
                service_action,
                list_id,
                alloc_len,
                ..
            } => match service_action {
                0x03 => data_in(xcopy::operating_parameters(), alloc_len as usize),
                0x00 => {
                    let key = PortKey::of(&task.nexus);
                    let st = self.lock();
                    let found = st
                        .copy_results
                        .iter()
                        .rev()
                        .find(|(k, id, _)| *k == key && *id == list_id)
                        .map(|(_, _, s)| *s);
                    match found {
                        Some(s) => data_in(s.to_bytes(), alloc_len as usize),
                        None => bad_cdb(2, None),
                    }
                }
                _ => bad_cdb(1, Some(4)),
            },
            Command::Verify(io) => self.verify(io, task).await,
            Command::OrWrite(io) => self.orwrite(io, task).await,
            Command::CompareAndWrite(io) => self.compare_and_write(io, task).await,
            Command::PreFetch { lba, blocks, .. } => match self.range(lba, u64::from(blocks)) {
                Some(r) => r,
                None => TaskResult::good(),
            },
            Command::SynchronizeCache { lba, blocks, .. } => {
                if let Some(r) = self.range(lba, u64::from(blocks)) {
                    return r;
                }
                if let Some(refused) = self.flush_refused() {
                    return refused;
                }
                let flushed = match self.backend.aio() {
                    Some(aio) => Some(aio.flush().await),
                    None => self.io(|me| me.backend.flush()).await,
                };
                match flushed {
                    Some(Ok(())) => TaskResult::good(),
                    Some(Err(e)) => {
                        self.note_flush_failure(&e);
                        backend_failed(&e, true, self.shift)
                    }
                    None => check(SenseKey::HARDWARE_ERROR, asc::INTERNAL_TARGET_FAILURE),
                }
            }
            Command::WriteSame {
                size,
                wrprotect,
                anchor,
                unmap,
                ndob,
                lba,
                blocks,
                ..
            } => {
                self.write_same(task, size, wrprotect, anchor, unmap, ndob, lba, blocks)
                    .await
            }
            Command::Unmap {
                anchor, param_len, ..
            } => self.unmap(task, anchor, param_len).await,
            Command::ReadDefectData {
                twelve,
                req_plist,
                req_glist,
                format,
                alloc_len,
                ..
            } => {
                let flags = (u8::from(req_plist) << 4) | (u8::from(req_glist) << 3) | format;
                let v = if twelve {
                    vec![0, flags, 0, 0, 0, 0, 0, 0]
                } else {
                    vec![0, flags, 0, 0]
                };
                data_in(v, alloc_len as usize)
            }
            Command::PersistentReserveIn {
                service_action,
                alloc_len,
                ..
            } => {
                let st = self.lock();
                match st.pr.prin(
                    service_action,
                    self.cfg.pr_path.is_some() || self.shared.get().is_some(),
                ) {
                    Some(v) => data_in(v, usize::from(alloc_len)),
                    None => bad_cdb(1, Some(4)),
                }
            }
            Command::PersistentReserveOut {
                service_action,
                scope,
                pr_type,
                param_len,
                ..
            } => {
                // Boxed: its wait on a cluster's store would otherwise
                // grow every command's future (see the size test).
                Box::pin(self.prout(task, service_action, scope, pr_type, param_len)).await
            }
            Command::GetLbaStatus { lba, alloc_len, .. } => {
                self.get_lba_status(lba, alloc_len).await
            }
            Command::ReportLuns {
                select_report,
                alloc_len,
                ..
            } => {
                if alloc_len < 16 {
                    return bad_cdb(6, None);
                }
                if !matches!(select_report, 0 | 2) {
                    return bad_cdb(2, None);
                }
                let mut v = Vec::with_capacity(16);
                v.extend_from_slice(&8u32.to_be_bytes());
                v.extend_from_slice(&[0; 4]);
                v.extend_from_slice(&task.lun.to_bytes());
                data_in(v, alloc_len as usize)
            }
            Command::ReportTargetPortGroups {
                format, alloc_len, ..
            } => {
                let t = task.nexus.target();
                if format > 1 {
                    return bad_cdb(1, Some(7));
                }
                let v = self
                    .alua
                    .report(t.port_group, t.relative_port_id, format == 1);
                data_in(v, alloc_len as usize)
            }
            Command::SetTargetPortGroups { param_len, .. } => {
                let len = param_len as usize;
                if len == 0 {
                    return TaskResult::good();
                }
                let p = gather(&task.data_out, 0, len.min(1 << 16));
                if p.len() < len {
                    return illegal(asc::PARAMETER_LIST_LENGTH_ERROR);
                }
                if let Some(store) = self.alua_shared.get().cloned() {
                    let to = match self.alua.parse_set(&p) {
                        Ok(to) => to,
                        Err(s) => return TaskResult::check_condition(s),
                    };
                    return match Box::pin(store.set(to, PortKey::of(&task.nexus))).await {
                        Ok(()) => TaskResult::good(),
                        Err(e) => {
                            tracing::warn!(error = %e, "alua: SET TARGET PORT GROUPS not applied");
                            TaskResult::check_condition(Sense::new(
                                SenseKey::NOT_READY,
                                asc::LOGICAL_UNIT_NOT_ACCESSIBLE_TARGET_PORT_IN_UNAVAILABLE_STATE,
                            ))
                        }
                    };
                }
                let mut st = self.lock();
                let key = self.enter(&mut st, &task.nexus);
                match self.alua.set(&p) {
                    Ok(true) => {
                        // Every other I_T nexus hears of it (SPC-4
                        // §5.16.2.6); the one that asked knows.
                        self.ua_where(
                            &mut st,
                            |k| *k != key,
                            asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
                            false,
                        );
                        TaskResult::good()
                    }
                    Ok(false) => TaskResult::good(),
                    Err(s) => TaskResult::check_condition(s),
                }
            }
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                service_action,
                alloc_len,
                ..
            } => match report_opcodes(rctd, options, opcode, service_action) {
                Ok(v) => data_in(v, alloc_len as usize),
                Err(r) => r,
            },
            Command::ReportSupportedTmfs {
                repd, alloc_len, ..
            } => {
                // ATS ATSS CTSS LURS QTS TRS | QUAS QTSS ITNRS
                let mut v = vec![0xd0 | 0x08 | 0x04 | 0x02, 0x07, 0, 0];
                if repd {
                    v[3] = 0x0c;
                    v.resize(16, 0);
                }
                data_in(v, alloc_len as usize)
            }
        }
    }
}
