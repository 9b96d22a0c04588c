//! Compiling a filter once and checking it can run here.
//!
//! A [`FilterModule`] is compiled and linked once (wasmtime `InstancePre`),
//! then instantiated cheaply for every [`Vm`](crate::Vm). Loading is where
//! an unsupported guest is refused: an import the host lacks is an error
//! naming it, never a silent stub that would fail (or lie) later.

use crate::error::Error;
use crate::state::VmState;
use crate::{imports, wasi};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use wasmtime::{Engine, InstancePre, Linker, Module};

/// A compiled, linked proxy-wasm module. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct FilterModule {
    pub(crate) engine: Engine,
    pub(crate) pre: Arc<InstancePre<VmState>>,
    module: Module,
    abi: String,
}

impl std::fmt::Debug for FilterModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FilterModule")
            .field("abi", &self.abi)
            .finish_non_exhaustive()
    }
}

/// The ABI markers cpp-host accepts that this host implements.
const ABI_MARKERS: &[&str] = &["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];

impl FilterModule {
    /// Loads a `.wasm` (or `.wat`) file with a default engine.
    pub fn from_file(path: impl AsRef<Path>) -> Result<FilterModule, Error> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        FilterModule::from_bytes(&bytes)
    }

    /// Loads a module from Wasm binary or WAT text, with a default engine.
    pub fn from_bytes(bytes: &[u8]) -> Result<FilterModule, Error> {
        FilterModule::with_engine(&Engine::default(), bytes)
    }

    /// Loads a module with a caller-supplied engine (e.g. with fuel enabled).
    pub fn with_engine(engine: &Engine, bytes: &[u8]) -> Result<FilterModule, Error> {
        let module = Module::new(engine, bytes).map_err(|e| Error::Compile(format!("{e:#}")))?;
        FilterModule::link(engine, module, None)
    }

    /// The same module, linked so that its `env` import `name` does
    /// nothing and returns `status`: a host that fails (or answers a
    /// status the guest does not expect) in exactly one call, to show a
    /// filter survives it. No recompilation. `name` must be an import of
    /// the module that returns a status.
    pub fn with_failing_import(&self, name: &str, status: u32) -> Result<FilterModule, Error> {
        FilterModule::link(&self.engine, self.module.clone(), Some((name, status)))
    }

    fn link(
        engine: &Engine,
        module: Module,
        failing: Option<(&str, u32)>,
    ) -> Result<FilterModule, Error> {
        let mut linker = Linker::new(engine);
        let mut defined = HashSet::new();
        imports::define(&mut linker, &mut defined)
            .and_then(|()| wasi::define(&mut linker, &mut defined))
            .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        if let Some((name, status)) = failing {
            let ty = module
                .imports()
                .find(|i| i.module() == "env" && i.name() == name)
                .and_then(|i| i.ty().func().cloned())
                .filter(|f| f.results().len() == 1)
                .ok_or_else(|| Error::BadExport {
                    name: name.to_string(),
                    reason: "the module imports no such function returning a status".into(),
                })?;
            linker.allow_shadowing(true);
            linker
                .func_new("env", name, ty, move |_, _, results| {
                    if let Some(r) = results.first_mut() {
                        *r = wasmtime::Val::I32(status as i32);
                    }
                    Ok(())
                })
                .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        }
        let missing: Vec<String> = module
            .imports()
            .filter(|i| !defined.contains(&(i.module().to_string(), i.name().to_string())))
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect();
        if !missing.is_empty() {
            return Err(Error::MissingImports(missing));
        }
        let abi = ABI_MARKERS
            .iter()
            .find(|m| module.get_export(m).is_some())
            .ok_or_else(|| {
                let found: Vec<String> = module
                    .exports()
                    .filter(|e| e.name().starts_with("proxy_abi_version_"))
                    .map(|e| e.name().to_string())
                    .collect();
                Error::UnsupportedAbi(if found.is_empty() {
                    "no proxy_abi_version_* export".to_string()
                } else {
                    format!("found {}, need 0.2.0 or 0.2.1", found.join(", "))
                })
            })?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        Ok(FilterModule {
            engine: engine.clone(),
            pre: Arc::new(pre),
            module,
            abi: abi
                .trim_start_matches("proxy_abi_version_")
                .replace('_', "."),
        })
    }

    /// The ABI version the module declares, e.g. `0.2.1`.
    pub fn abi_version(&self) -> &str {
        &self.abi
    }
}
