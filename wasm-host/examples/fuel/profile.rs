//! Where the fuel goes (`ACE_FUEL_PROFILE`): the module instrumented with
//! three `i64` counters per defined function (Wasm instructions as
//! wasmtime charges fuel for them, calls, and bytes that `memory.copy` and
//! `memory.fill` move, which wasmtime charges one unit each), exported as
//! globals for the host to read ([`Vm::exported_i64`]).
//!
//! Each straight-line run of instructions (up to and including the next
//! branch, block boundary or `end`) adds its cost once, at its start, so the
//! counters cost a few instructions per run and the instructions counted
//! are exactly those executed. The counters' own instructions are not
//! counted.

use ace_wasm_host::Vm;
use std::collections::HashMap;
use wasm_encoder::reencode::{self, Reencode};
use wasm_encoder::{ConstExpr, Function, GlobalType, Instruction, ValType};
use wasmparser::{KnownCustom, Name, Operator, Parser, Payload, TypeRef};

type Error = Box<dyn std::error::Error>;

/// What `instrument` learnt about the module: the defined functions'
/// indices and names, in order.
struct Layout {
    functions: Vec<(u32, String)>,
    /// For the functions picked for a closer look: each straight-line
    /// run's function and instructions (its counter is `counter('r', k)`).
    runs: Vec<(u32, Vec<String>)>,
}

/// Exported name of a counter: `kind` is `i` (instructions), `n` (calls)
/// or `b` (bytes copied or filled).
fn counter(kind: char, function: u32) -> String {
    format!("__fuel_{kind}{function}")
}

/// Wasmtime's default fuel cost of one operator (wasmtime-environ's
/// `default_operator_cost`).
fn cost(op: &Operator) -> i64 {
    match op {
        Operator::Nop
        | Operator::Drop
        | Operator::Block { .. }
        | Operator::Loop { .. }
        | Operator::Unreachable
        | Operator::Return
        | Operator::Else
        | Operator::End => 0,
        _ => 1,
    }
}

/// Whether the instruction after `op` starts a new straight-line run.
fn ends_run(op: &Operator) -> bool {
    matches!(
        op,
        Operator::Block { .. }
            | Operator::Loop { .. }
            | Operator::If { .. }
            | Operator::Else
            | Operator::End
            | Operator::Br { .. }
            | Operator::BrIf { .. }
            | Operator::BrTable { .. }
            | Operator::Return
            | Operator::Unreachable
            | Operator::ReturnCall { .. }
            | Operator::ReturnCallIndirect { .. }
            | Operator::Throw { .. }
            | Operator::TryTable { .. }
    )
}

struct Instrument {
    /// Index of the first counter global (three per defined function).
    first_global: u32,
    imported_functions: u32,
    defined_functions: u32,
    /// The defined function whose body comes next.
    next_body: u32,
    /// Parameter count of each defined function.
    params: Vec<u32>,
    /// Defined functions looked at closer, and the index of their first
    /// run's counter among the run counters.
    picked: HashMap<u32, u32>,
    /// Counters before the run counters.
    runs_from: u32,
    /// Total run counters.
    run_count: u32,
}

/// The straight-line runs of a body: index ranges into `ops`.
fn runs(ops: &[Operator]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        let mut end = i;
        while end < ops.len() {
            end += 1;
            if ends_run(&ops[end - 1]) {
                break;
            }
        }
        out.push((i, end));
        i = end;
    }
    out
}

impl Instrument {
    fn global(&self, defined: u32, kind: u32) -> u32 {
        self.first_global + defined * 3 + kind
    }
}

fn add(f: &mut Function, global: u32, by: i64) {
    f.instruction(&Instruction::GlobalGet(global));
    f.instruction(&Instruction::I64Const(by));
    f.instruction(&Instruction::I64Add);
    f.instruction(&Instruction::GlobalSet(global));
}

impl Reencode for Instrument {
    type Error = std::convert::Infallible;

    fn parse_global_section(
        &mut self,
        globals: &mut wasm_encoder::GlobalSection,
        section: wasmparser::GlobalSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_global_section(self, globals, section)?;
        let ty = GlobalType {
            val_type: ValType::I64,
            mutable: true,
            shared: false,
        };
        for _ in 0..self.defined_functions * 3 + self.run_count {
            globals.global(ty, &ConstExpr::i64_const(0));
        }
        Ok(())
    }

    fn parse_export_section(
        &mut self,
        exports: &mut wasm_encoder::ExportSection,
        section: wasmparser::ExportSectionReader<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        reencode::utils::parse_export_section(self, exports, section)?;
        for d in 0..self.defined_functions {
            let f = self.imported_functions + d;
            for (k, kind) in ['i', 'n', 'b'].into_iter().enumerate() {
                exports.export(
                    &counter(kind, f),
                    wasm_encoder::ExportKind::Global,
                    self.global(d, k as u32),
                );
            }
        }
        for k in 0..self.run_count {
            exports.export(
                &counter('r', k),
                wasm_encoder::ExportKind::Global,
                self.first_global + self.runs_from + k,
            );
        }
        Ok(())
    }

    fn parse_function_body(
        &mut self,
        code: &mut wasm_encoder::CodeSection,
        func: wasmparser::FunctionBody<'_>,
    ) -> Result<(), reencode::Error<Self::Error>> {
        let d = self.next_body;
        self.next_body += 1;
        let mut locals = Vec::new();
        let mut count = self.params[d as usize];
        for pair in func.get_locals_reader()? {
            let (n, ty) = pair?;
            count += n;
            locals.push((n, self.val_type(ty)?));
        }
        // One scratch local for the length of a memory.copy or fill.
        let scratch = count;
        locals.push((1, ValType::I32));
        let mut f = Function::new(locals);
        let ops: Vec<Operator> = func
            .get_operators_reader()?
            .into_iter()
            .collect::<Result<_, _>>()?;
        add(&mut f, self.global(d, 1), 1);
        let picked = self.picked.get(&d).copied();
        for (k, (i, end)) in runs(&ops).into_iter().enumerate() {
            let run: i64 = ops[i..end].iter().map(cost).sum();
            if run > 0 {
                add(&mut f, self.global(d, 0), run);
            }
            if let Some(first) = picked {
                let g = self.first_global + self.runs_from + first + k as u32;
                add(&mut f, g, 1);
            }
            for op in &ops[i..end] {
                if matches!(
                    op,
                    Operator::MemoryCopy { .. } | Operator::MemoryFill { .. }
                ) {
                    let bytes = self.global(d, 2);
                    f.instruction(&Instruction::LocalTee(scratch));
                    f.instruction(&Instruction::GlobalGet(bytes));
                    f.instruction(&Instruction::LocalGet(scratch));
                    f.instruction(&Instruction::I64ExtendI32U);
                    f.instruction(&Instruction::I64Add);
                    f.instruction(&Instruction::GlobalSet(bytes));
                }
                f.instruction(&self.instruction(op.clone())?);
            }
        }
        code.function(&f);
        Ok(())
    }
}

/// The module with its counters, and its functions' names (demangled, from
/// the name section; an index where there is none). `pick`: functions
/// whose name contains it get a counter per run too.
fn instrument(wasm: &[u8], pick: Option<&str>) -> Result<(Vec<u8>, Layout), Error> {
    let mut types: Vec<u32> = Vec::new();
    let mut imported_functions = 0;
    let mut globals = 0;
    let mut params = Vec::new();
    let mut names = HashMap::new();
    let mut bodies = Vec::new();
    for payload in Parser::new(0).parse_all(wasm) {
        match payload? {
            Payload::TypeSection(s) => {
                for ty in s.into_iter_err_on_gc_types() {
                    types.push(ty?.params().len() as u32);
                }
            }
            Payload::ImportSection(s) => {
                for import in s.into_imports() {
                    match import?.ty {
                        TypeRef::Func(_) => imported_functions += 1,
                        TypeRef::Global(_) => globals += 1,
                        _ => {}
                    }
                }
            }
            Payload::FunctionSection(s) => {
                for ty in s {
                    params.push(types[ty? as usize]);
                }
            }
            Payload::GlobalSection(s) => globals += s.count(),
            Payload::CodeSectionEntry(body) => bodies.push(body),
            Payload::CustomSection(c) => {
                if let KnownCustom::Name(reader) = c.as_known() {
                    for name in reader {
                        if let Name::Function(map) = name? {
                            for naming in map {
                                let naming = naming?;
                                let name = format!("{:#}", rustc_demangle::demangle(naming.name));
                                names.insert(naming.index, name);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let defined_functions = params.len() as u32;
    let mut picked = HashMap::new();
    let mut run_list = Vec::new();
    for (d, body) in bodies.iter().enumerate() {
        let f = imported_functions + d as u32;
        let name = names.get(&f).map_or("", String::as_str);
        if !pick.is_some_and(|p| name.contains(p)) {
            continue;
        }
        picked.insert(d as u32, run_list.len() as u32);
        let ops: Vec<Operator> = body
            .get_operators_reader()?
            .into_iter()
            .collect::<Result<_, _>>()?;
        for (i, end) in runs(&ops) {
            run_list.push((f, ops[i..end].iter().map(|o| format!("{o:?}")).collect()));
        }
    }
    let mut pass = Instrument {
        first_global: globals,
        imported_functions,
        defined_functions,
        next_body: 0,
        params,
        picked,
        runs_from: defined_functions * 3,
        run_count: run_list.len() as u32,
    };
    let mut module = wasm_encoder::Module::new();
    pass.parse_core_module(&mut module, Parser::new(0), wasm)
        .map_err(|e| format!("instrumenting: {e:?}"))?;
    let functions = (0..defined_functions)
        .map(|d| {
            let f = imported_functions + d;
            (
                f,
                names.remove(&f).unwrap_or_else(|| format!("function {f}")),
            )
        })
        .collect();
    Ok((
        module.finish(),
        Layout {
            functions,
            runs: run_list,
        },
    ))
}

/// A profiled run: the layout, how much to print, and the counters when
/// the measured requests began.
pub struct Profile {
    layout: Layout,
    rows: usize,
    functions: Vec<[i64; 3]>,
    runs: Vec<i64>,
}

impl Profile {
    /// `wasm` instrumented, and the profile to read it with (`rows`
    /// functions listed; `pick` as in [`instrument`]).
    pub fn instrument(
        wasm: &[u8],
        rows: usize,
        pick: Option<String>,
    ) -> Result<(Vec<u8>, Profile), Error> {
        let (bytes, layout) = instrument(wasm, pick.as_deref())?;
        let profile = Profile {
            layout,
            rows,
            functions: Vec::new(),
            runs: Vec::new(),
        };
        Ok((bytes, profile))
    }

    /// The measured requests begin now.
    pub fn start(&mut self, vm: &mut Vm) {
        self.functions = self.function_counters(vm);
        self.runs = self.run_counters(vm);
    }

    /// Print the costliest functions, then the picked functions' runs, per
    /// request over the `n` requests since [`Profile::start`].
    pub fn report(&self, vm: &mut Vm, n: u64) -> Result<(), Error> {
        let names = &self.layout.functions;
        let after = self.function_counters(vm);
        let mut per: Vec<([i64; 3], &str)> = names
            .iter()
            .zip(self.functions.iter().zip(&after))
            .map(|((_, name), (b, a))| ([a[0] - b[0], a[1] - b[1], a[2] - b[2]], name.as_str()))
            .filter(|(c, _)| c.iter().any(|&v| v > 0))
            .collect();
        per.sort_by_key(|([i, _, b], _)| std::cmp::Reverse(i + b));
        let n = n.max(1) as f64;
        let total: i64 = per.iter().map(|([i, _, b], _)| i + b).sum();
        println!(
            "profile: {:.1} fuel per request in the counters (instructions + bytes copied or filled)",
            total as f64 / n
        );
        println!("{:>9} {:>8} {:>6}  function", "instr", "bytes", "calls");
        for ([i, c, b], name) in per.iter().take(self.rows) {
            let [i, b, c] = [*i, *b, *c].map(|v| v as f64 / n);
            println!("{i:>9.1} {b:>8.1} {c:>6.1}  {name}");
        }
        let after = self.run_counters(vm);
        let mut last = None;
        for (((f, ops), b), a) in self.layout.runs.iter().zip(&self.runs).zip(after) {
            if last != Some(*f) {
                let name = names
                    .iter()
                    .find(|(g, _)| g == f)
                    .map_or("?", |(_, n)| n.as_str());
                println!("\n== {name}");
                last = Some(*f);
            }
            let times = (a - b) as f64 / n;
            for (k, op) in ops.iter().enumerate() {
                if k == 0 {
                    println!("{times:>9.1}  {op}");
                } else {
                    println!("{:>9}  {op}", "");
                }
            }
        }
        Ok(())
    }

    /// Every defined function's counters (instructions, calls, bytes).
    fn function_counters(&self, vm: &mut Vm) -> Vec<[i64; 3]> {
        self.layout
            .functions
            .iter()
            .map(|(f, _)| ['i', 'n', 'b'].map(|k| vm.exported_i64(&counter(k, *f)).unwrap_or(0)))
            .collect()
    }

    /// The picked functions' run counters.
    fn run_counters(&self, vm: &mut Vm) -> Vec<i64> {
        (0..self.layout.runs.len() as u32)
            .map(|k| vm.exported_i64(&counter('r', k)).unwrap_or(0))
            .collect()
    }
}
