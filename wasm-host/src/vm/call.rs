//! Calling into the guest: one callback at a time, on a context, with
//! fuel refilled before and counted after, and a trap turned into a failed
//! VM.

use super::exports::{F2R, F3R};
use super::Vm;
use crate::abi::{Action, LogLevel};
use crate::error::Error;
use crate::state::VmState;
use wasmtime::Store;

impl Vm {
    /// Turns a trap into [`Error::Trap`] and marks the VM failed, quoting
    /// the guest's last critical log line (the SDK logs its panics there).
    pub(super) fn check<T>(&mut self, callback: &str, r: wasmtime::Result<T>) -> Result<T, Error> {
        r.map_err(|e| {
            let critical = self
                .store
                .data()
                .logs
                .iter()
                .rev()
                .find(|l| l.level == LogLevel::Critical)
                .map(|l| format!(" (guest log: {})", l.message))
                .unwrap_or_default();
            let message = format!("{e:#}{critical}");
            self.failed = Some(format!("{callback}: {message}"));
            Error::Trap {
                callback: callback.to_string(),
                message,
            }
        })
    }

    /// Makes `ctx` current for a callback and refills the fuel; a failed
    /// VM runs nothing more.
    pub(super) fn enter(&mut self, ctx: u32) -> Result<(), Error> {
        if let Some(f) = &self.failed {
            return Err(Error::Failed(f.clone()));
        }
        if let Some(fuel) = self.fuel {
            // Cannot fail: start() checked the engine meters fuel.
            let _ = self.store.set_fuel(fuel);
        }
        let s = self.store.data_mut();
        s.current = ctx;
        s.effective = None;
        Ok(())
    }

    /// Counts the fuel burned and clears the current context.
    pub(super) fn leave(&mut self) {
        if let Some(fuel) = self.fuel {
            let left = self.store.get_fuel().unwrap_or(fuel);
            self.fuel_consumed += fuel.saturating_sub(left);
        }
        let s = self.store.data_mut();
        s.current = 0;
        s.effective = None;
    }

    /// Runs callback `f` on context `ctx`; a callback the guest does not
    /// export does nothing.
    pub(super) fn call_void<F: Clone>(
        &mut self,
        name: &str,
        ctx: u32,
        f: Option<F>,
        run: impl FnOnce(&F, &mut Store<VmState>) -> wasmtime::Result<()>,
    ) -> Result<(), Error> {
        self.enter(ctx)?;
        let r = match &f {
            Some(f) => run(f, &mut self.store),
            None => Ok(()),
        };
        self.leave();
        self.check(name, r)
    }

    /// Runs callback `f` on context `ctx` for its result; a callback the
    /// guest does not export answers `default`.
    pub(super) fn call_ret<F: Clone>(
        &mut self,
        name: &str,
        ctx: u32,
        f: Option<F>,
        default: i32,
        run: impl FnOnce(&F, &mut Store<VmState>) -> wasmtime::Result<i32>,
    ) -> Result<i32, Error> {
        self.enter(ctx)?;
        let r = match &f {
            Some(f) => run(f, &mut self.store),
            None => Ok(default),
        };
        self.leave();
        self.check(name, r)
    }

    /// `on_configure` on the root context, with the plugin configuration
    /// readable only during it; `settle`: deliver what it caused.
    pub(super) fn configure_root(&mut self, settle: bool) -> Result<(), Error> {
        let root = self.root_id();
        let len = self.store.data().plugin.configuration.len() as i32;
        self.store.data_mut().configuring = true;
        let f = self.exports.configure.clone();
        let r = self.call_ret("proxy_on_configure", root, f, 1, |f, s| {
            f.call(s, (root as i32, len))
        });
        self.store.data_mut().configuring = false;
        let ok = r?;
        if settle {
            self.settle()?;
        }
        if ok == 0 {
            return Err(Error::Rejected {
                callback: "proxy_on_configure".into(),
            });
        }
        Ok(())
    }

    /// Delivers a new plugin configuration to the running root context
    /// (`on_configure`); `Err(Rejected)` if the filter refuses it.
    pub fn reconfigure(&mut self, bytes: impl Into<Vec<u8>>) -> Result<(), Error> {
        self.store.data_mut().plugin.configuration = bytes.into();
        self.configure_root(true)
    }

    /// A stream callback with two arguments after the context id
    /// (headers and bodies).
    pub(super) fn stream_callback(
        &mut self,
        name: &str,
        id: u32,
        f: F3R,
        a: i32,
        b: i32,
    ) -> Result<Action, Error> {
        let r = self.call_ret(name, id, f, 0, |f, s| f.call(s, (id as i32, a, b)))?;
        Ok(Action::from_i32(r))
    }

    /// A stream callback with one argument after the context id
    /// (trailers).
    pub(super) fn stream_callback2(
        &mut self,
        name: &str,
        id: u32,
        f: F2R,
        a: i32,
    ) -> Result<Action, Error> {
        let r = self.call_ret(name, id, f, 0, |f, s| f.call(s, (id as i32, a)))?;
        Ok(Action::from_i32(r))
    }
}
