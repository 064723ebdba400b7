//! Commands from the handles (`Engine`) over the command channel: new
//! requests, aborts, shutdown, prefix-cache resets. They are taken at the
//! start of each step (or while the loop waits), so everything they change
//! is settled before the next `schedule()`.

use super::EngineCore;
use crate::engine::{Command, ShutdownMode};
use sluice_core::FinishReason;
use std::sync::atomic::Ordering;
use std::sync::mpsc::TryRecvError;

impl EngineCore {
    pub(super) fn drain_commands(&mut self) {
        loop {
            match self.commands.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
    }

    pub(super) fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add(req) => self.add_request(*req),
            Command::AbortSeq(seq) => self.abort_parent(seq, FinishReason::Abort, None),
            Command::AbortId(id) => {
                if let Some(&seq) = self.ids.get(&id) {
                    self.abort_parent(seq, FinishReason::Abort, None);
                }
            }
            Command::Shutdown(mode) => {
                self.shared.accepting.store(false, Ordering::SeqCst);
                if self.shutdown != Some(ShutdownMode::Abort) {
                    self.shutdown = Some(mode);
                }
                if mode == ShutdownMode::Abort {
                    self.fail_all(FinishReason::Abort, None);
                }
            }
            Command::ResetPrefixCache {
                reset_running_requests,
                reply,
            } => {
                let ok = self.scheduler.reset_prefix_cache(reset_running_requests);
                // The caller may have given up waiting; nothing to undo.
                let _ = reply.send(ok);
            }
        }
    }
}
