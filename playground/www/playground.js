// The playground page: editors, and the compiler running in a worker.
//
// Compile and explain run in one module worker (worker.js) so that typing
// never waits for Cedar; verify runs in a worker of its own per run, so that
// it can be cancelled (terminated) and the page keeps compiling meanwhile.
// Nothing leaves the page: the worker is this site's script and the module
// its .wasm.

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- workers

function startWorker() {
  return new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
}

// Calls into a worker by message, one promise per call; `onProgress`
// receives the progress messages of that call.
function connect(worker, onFailure) {
  let next = 1;
  const pending = new Map();
  worker.onmessage = (e) => {
    const { id, progress, result, threw } = e.data;
    const call = pending.get(id);
    if (!call) return;
    if (progress) {
      if (call.onProgress) call.onProgress(progress[0], progress[1]);
      return;
    }
    pending.delete(id);
    if (threw !== undefined) call.reject(new Error(threw));
    else call.resolve(result);
  };
  worker.onerror = (e) => {
    const message = e.message || "the worker failed to start";
    for (const call of pending.values()) call.reject(new Error(message));
    pending.clear();
    onFailure(message);
  };
  return (op, args = {}, onProgress) =>
    new Promise((resolve, reject) => {
      const id = next++;
      pending.set(id, { resolve, reject, onProgress });
      worker.postMessage({ id, op, ...args });
    });
}

// The compiler's worker. A call that throws (rather than answering with
// problems) means the module trapped: a panic, or a stack overflow that
// Cedar's recursion can still reach in the browser. wasm-bindgen then
// keeps the compiler borrowed and refuses every later call, so the worker
// is replaced before the next one; what the user typed stays in the page.
let compiler = null;
function call(op, args, onProgress) {
  if (!compiler) {
    compiler = connect(startWorker(), (message) =>
      setStatus("error", `the compiler did not load: ${message}`));
  }
  const current = compiler;
  return current(op, args, onProgress).catch((e) => {
    if (compiler === current) compiler = null;
    throw e;
  });
}

// ---------------------------------------------------------------- state

const state = {
  files: [],        // { kind: "schema" | "manifest" | "policy", name, text }
  selected: 0,
  compiled: null,   // the last successful summary
  input: null,      // the JSON input of that compile
  seq: 0,           // compiles started; only the newest one's answer counts
  verifier: null,   // the running verify worker
};

function setStatus(kind, text) {
  const s = $("status");
  s.dataset.state = kind;
  s.textContent = text;
}

function input() {
  const one = (kind) => state.files.find((f) => f.kind === kind);
  const file = (f) => ({ name: f.name, text: f.text });
  return JSON.stringify({
    schema: file(one("schema")),
    manifest: file(one("manifest")),
    policies: state.files.filter((f) => f.kind === "policy").map(file),
  });
}

// ---------------------------------------------------------------- editors

function renderFiles() {
  const list = $("files");
  list.replaceChildren();
  state.files.forEach((f, i) => {
    const li = document.createElement("li");
    li.textContent = f.name;
    li.dataset.file = f.name;
    li.dataset.kind = f.kind;
    li.setAttribute("role", "option");
    li.setAttribute("aria-selected", String(i === state.selected));
    li.tabIndex = 0;
    li.onclick = () => select(i);
    li.onkeydown = (e) => { if (e.key === "Enter") select(i); };
    list.append(li);
  });
  const f = state.files[state.selected];
  $("file-name").textContent = f ? f.name : "";
  $("delete-policy").disabled = !f || f.kind !== "policy";
}

function select(i, line, column) {
  state.selected = i;
  const editor = $("editor");
  editor.value = state.files[i].text;
  renderFiles();
  if (line) {
    const offset = offsetOf(editor.value, line, column || 1);
    editor.focus();
    editor.setSelectionRange(offset, offset);
    const lineHeight = parseFloat(getComputedStyle(editor).lineHeight) || 16;
    editor.scrollTop = Math.max(0, (line - 3) * lineHeight);
  }
  showCursor();
}

// Byte offsets are not what Cedar's columns count: columns are characters.
function offsetOf(text, line, column) {
  const lines = text.split("\n");
  let offset = 0;
  for (let l = 0; l < line - 1 && l < lines.length; l++) offset += lines[l].length + 1;
  const rest = lines[line - 1] || "";
  return offset + [...rest].slice(0, column - 1).join("").length;
}

function showCursor() {
  const editor = $("editor");
  const before = editor.value.slice(0, editor.selectionStart);
  const line = before.split("\n").length;
  const column = [...before.slice(before.lastIndexOf("\n") + 1)].length + 1;
  $("cursor").textContent = `${line}:${column}`;
}

let compileTimer = 0;
function edited() {
  const f = state.files[state.selected];
  if (!f) return;
  f.text = $("editor").value;
  clearTimeout(compileTimer);
  compileTimer = setTimeout(compile, 250);
}

// ---------------------------------------------------------------- compile

async function compile() {
  const seq = ++state.seq;
  const text = input();
  $("compile-state").dataset.state = "compiling";
  $("compile-state").textContent = "compiling...";
  let answer;
  try {
    answer = await call("compile", { input: text });
  } catch (e) {
    if (seq === state.seq) showFailure(`the compiler stopped: ${e.message}`);
    return;
  }
  if (seq !== state.seq) return;
  if (!answer.ok) {
    state.compiled = null;
    state.input = null;
    showProblems(answer);
    return;
  }
  state.compiled = answer.value;
  state.input = text;
  showCompiled(answer.value, answer.ms);
  renderRequestForm(answer.value.attributes);
  explain();
}

function problemItem(p) {
  const li = document.createElement("li");
  const where = document.createElement("a");
  where.href = "#";
  where.className = "where";
  where.textContent = p.line ? `${p.file}:${p.line}:${p.column}` : p.file;
  where.onclick = (e) => {
    e.preventDefault();
    const i = state.files.findIndex((f) => f.name === p.file);
    if (i >= 0) select(i, p.line, p.column);
  };
  const message = document.createElement("span");
  message.className = "message";
  message.textContent = `: ${p.message}`;
  li.append(where, message);
  if (p.hint) {
    const hint = document.createElement("div");
    hint.className = "hint";
    hint.textContent = `hint: ${p.hint}`;
    li.append(hint);
  }
  li.dataset.file = p.file;
  li.dataset.line = p.line;
  li.dataset.column = p.column;
  li.dataset.text = p.text;
  return li;
}

function showProblems(answer) {
  const problems = answer.problems || [{ file: "", line: 0, column: 0, message: answer.error, hint: "", text: answer.error }];
  const n = problems.length;
  $("compile-state").dataset.state = "error";
  $("compile-state").textContent = `${n} problem${n === 1 ? "" : "s"}: the tables were not compiled`;
  $("problems").replaceChildren(...problems.map(problemItem));
  $("tables").hidden = true;
  $("factors").replaceChildren();
  $("warnings").replaceChildren();
  for (const b of ["download-tables", "download-config", "show-dump", "verify"]) $(b).disabled = true;
  $("dump").hidden = true;
  $("decisions").querySelector("tbody").replaceChildren();
  $("notes").textContent = "";
}

function showFailure(message) {
  showProblems({ error: message });
}

function showCompiled(s, ms) {
  $("compile-state").dataset.state = "ok";
  $("compile-state").dataset.ms = ms.toFixed(1);
  $("compile-state").textContent =
    `compiled ${s.policies} policies over ${s.destinations.length} destinations and ` +
    `${s.attributes.length} request attributes in ${ms.toFixed(1)} ms (${s.evaluations} Cedar evaluations)`;
  $("problems").replaceChildren();
  $("tables").hidden = false;
  $("bytes").textContent = s.bytes;
  $("sha256").textContent = s.sha256;
  $("factors").replaceChildren(...s.factors.map((f, i) => {
    const li = document.createElement("li");
    li.textContent = `factor ${i}: ${f.kind} keyed by [${f.attributes.join(", ")}], ${f.rows} rows: ${f.policies.join(", ")}`;
    return li;
  }));
  $("warnings").replaceChildren(...s.warnings.map((w) => {
    const li = problemItem(w);
    li.prepend("warning: ");
    return li;
  }));
  for (const b of ["download-tables", "download-config", "show-dump"]) $(b).disabled = false;
  $("verify").disabled = state.verifier !== null;
  $("dump").textContent = s.dump;
  $("verify-result").dataset.state = "none";
  $("verify-result").textContent = "";
  $("mismatches").replaceChildren();
  $("verify-progress").value = 0;
}

// ---------------------------------------------------------------- explain

function renderRequestForm(attributes) {
  const form = $("request");
  const previous = {};
  for (const s of form.querySelectorAll("select")) previous[s.name] = s.value;
  form.replaceChildren(...attributes.map((a) => {
    const label = document.createElement("label");
    label.append(`${a.name} `);
    const select = document.createElement("select");
    select.id = `attr-${a.name}`;
    select.name = a.name;
    const missing = new Option("(missing)", "");
    select.append(missing, ...a.values.map((v) => new Option(v, v)));
    select.value = a.name in previous && [...select.options].some((o) => o.value === previous[a.name])
      ? previous[a.name]
      : (a.values[0] || "");
    select.onchange = explain;
    label.append(select);
    return label;
  }));
}

function request() {
  const r = {};
  for (const s of $("request").querySelectorAll("select")) {
    if (s.value !== "") r[s.name] = s.value;
  }
  return r;
}

async function explain() {
  if (!state.compiled) return;
  const seq = state.seq;
  const asked = JSON.stringify(request());
  const answer = await call("explain", { request: asked });
  if (seq !== state.seq || asked !== JSON.stringify(request())) return;
  const body = $("decisions").querySelector("tbody");
  $("decisions").dataset.request = asked;
  if (!answer.ok) {
    $("notes").textContent = answer.error;
    body.replaceChildren();
    return;
  }
  $("notes").textContent = answer.value.notes.map((n) => `note: ${n}`).join("\n");
  body.replaceChildren(...answer.value.destinations.map((d) => {
    const tr = document.createElement("tr");
    tr.dataset.destination = d.destination;
    tr.dataset.allowed = String(d.table);
    tr.dataset.verdict = d.verdict;
    tr.className = d.table ? "allowed" : "denied";
    const why = d.policies.length ? d.policies.join(", ") : (d.cedar ? "-" : "no permit applies");
    let note = "";
    if (d.verdict === "fail-closed") note = " (denied by design: an unknown value fails closed)";
    if (d.verdict === "differ") note = " (the tables differ from Cedar: recompile or report a compiler bug)";
    const cells = [d.destination, d.cluster, d.table ? "allowed" : "denied", why + note];
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.append(td);
    }
    tr.dataset.policies = d.policies.join(",");
    for (const e of d.errors) {
      const td = tr.lastChild;
      const div = document.createElement("div");
      div.className = "hint";
      div.textContent = `error: ${e}`;
      td.append(div);
    }
    return tr;
  }));
}

// ---------------------------------------------------------------- verify

function verify() {
  if (!state.compiled || state.verifier) return;
  const worker = startWorker();
  state.verifier = worker;
  const progress = $("verify-progress");
  const result = $("verify-result");
  progress.value = 0;
  progress.dataset.updates = "0";
  result.dataset.state = "running";
  result.textContent = "verifying...";
  $("mismatches").replaceChildren();
  $("verify").disabled = true;
  $("cancel-verify").hidden = false;
  const finish = () => {
    worker.terminate();
    state.verifier = null;
    $("verify").disabled = !state.compiled;
    $("cancel-verify").hidden = true;
  };
  const verifyCall = connect(worker, (message) => {
    result.dataset.state = "error";
    result.textContent = `verify stopped: ${message}`;
    finish();
  });
  const inputText = state.input;
  call("tables").then((tables) =>
    verifyCall("verify", { input: inputText, tables }, (done, total) => {
      progress.max = Math.max(total, 1);
      progress.value = done;
      progress.dataset.updates = String(Number(progress.dataset.updates) + 1);
      result.textContent = `verifying... ${done} of ${total} requests`;
    })
  ).then((answer) => {
    if (state.verifier !== worker) return;
    if (!answer.ok) {
      result.dataset.state = "error";
      result.textContent = `verify could not run: ${answer.error}`;
    } else {
      const v = answer.value;
      result.dataset.state = v.mismatches === 0 ? "ok" : "mismatch";
      result.dataset.mismatches = String(v.mismatches);
      result.dataset.ms = answer.ms.toFixed(1);
      result.textContent =
        `coverage: ${v.coverage}\n` +
        `checked ${v.requests} requests (${v.known} with every value known, ${v.requests - v.known} ` +
        `with an unknown value) = ${v.decisions} decisions in ${(answer.ms / 1000).toFixed(2)} s\n` +
        `mismatches: ${v.mismatches}`;
      $("mismatches").replaceChildren(...v.first.map((m) => {
        const li = document.createElement("li");
        li.textContent = `mismatch: ${m}`;
        return li;
      }));
    }
    finish();
  }, (e) => {
    if (state.verifier !== worker) return;
    result.dataset.state = "error";
    result.textContent = `verify stopped: ${e.message}`;
    finish();
  });
  $("cancel-verify").onclick = () => {
    result.dataset.state = "cancelled";
    result.textContent = "cancelled";
    finish();
  };
}

// ---------------------------------------------------------------- downloads

function download(name, data, type) {
  const url = URL.createObjectURL(new Blob([data], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function pluginConfig() {
  const answer = await call("plugin_config", {
    restrict: $("restrict").checked,
    readBody: $("read-body").checked,
  });
  if (!answer.ok) {
    showProblems(answer);
    return null;
  }
  return answer.value;
}

// ---------------------------------------------------------------- start

async function loadExamples() {
  const get = async (path) => {
    const r = await fetch(path, { cache: "no-store" });
    if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
    return r;
  };
  const index = await (await get("examples/index.json")).json();
  const text = async (name) => (await get(`examples/${name}`)).text();
  const files = [
    { kind: "schema", name: index.schema, text: await text(index.schema) },
    { kind: "manifest", name: index.manifest, text: await text(index.manifest) },
  ];
  for (const p of index.policies) files.push({ kind: "policy", name: p, text: await text(p) });
  state.files = files;
  select(Math.min(2, files.length - 1));
  await compile();
}

function wire() {
  const editor = $("editor");
  editor.addEventListener("input", edited);
  for (const e of ["keyup", "click", "select"]) editor.addEventListener(e, showCursor);
  editor.addEventListener("keydown", (e) => {
    if (e.key === "Tab") {
      e.preventDefault();
      editor.setRangeText("  ", editor.selectionStart, editor.selectionEnd, "end");
      edited();
    }
  });
  $("reset").onclick = () => loadExamples().catch((e) => setStatus("error", e.message));
  $("new-policy").onclick = () => {
    let n = 1;
    while (state.files.some((f) => f.name === `policy_${n}.cedar`)) n++;
    state.files.push({
      kind: "policy",
      name: `policy_${n}.cedar`,
      text: `// Say what this policy is for.\n@id("policy_${n}")\nforbid (principal, action == Ace::Action::"dispatch", resource)\nwhen { false };\n`,
    });
    select(state.files.length - 1);
    compile();
  };
  $("delete-policy").onclick = () => {
    const f = state.files[state.selected];
    if (!f || f.kind !== "policy") return;
    state.files.splice(state.selected, 1);
    select(Math.min(state.selected, state.files.length - 1));
    compile();
  };
  $("download-tables").onclick = async () =>
    download("tables.acet", await call("tables"), "application/octet-stream");
  $("download-config").onclick = async () => {
    const config = await pluginConfig();
    if (config !== null) download("plugin-config.json", config, "application/json");
  };
  $("show-dump").onclick = () => { $("dump").hidden = !$("dump").hidden; };
  $("verify").onclick = verify;
}

// For scripts that drive the page (the end-to-end test, the console).
window.playground = { state, compile, explain, verify, pluginConfig, select, edited };

wire();
call("hello").then((hello) => {
  setStatus("ready", `compiler loaded in ${hello.ms.toFixed(0)} ms; loading the shipped examples...`);
  return loadExamples().then(() => setStatus("ready", "ready: edit a file, the tables recompile as you type"));
}).catch((e) => setStatus("error", `cannot start: ${e.message}`));
