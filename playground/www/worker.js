// The compiler's worker: loads the wasm module once and answers the page's
// calls ({id, op, ...} -> {id, result} or {id, threw}); a verify also posts
// {id, progress: [checked, total]} as it goes.
//
// Why a worker: Cedar's evaluations take long enough (a verify takes
// seconds) that on the page's thread they would freeze typing and
// scrolling. The handler is installed before the module loads, so no call
// is lost; each waits for the module.

import init, { Playground, verify } from "./pkg/ace_playground.js";

const started = performance.now();
const ready = init().then(() => ({ playground: new Playground(), ms: performance.now() - started }));

// Progress at most every 50 ms: the proof should not spend its time posting.
function throttled(id) {
  let last = 0;
  return (done, total) => {
    const now = performance.now();
    if (done === total || now - last >= 50) {
      last = now;
      postMessage({ id, progress: [done, total] });
    }
  };
}

function timed(f) {
  const t0 = performance.now();
  const answer = JSON.parse(f());
  answer.ms = performance.now() - t0;
  return answer;
}

onmessage = async (e) => {
  const { id, op } = e.data;
  try {
    const { playground, ms } = await ready;
    let result;
    switch (op) {
      case "hello":
        result = { ms };
        break;
      case "compile":
        result = timed(() => playground.compile(e.data.input));
        break;
      case "explain":
        result = JSON.parse(playground.explain(e.data.request));
        break;
      case "tables":
        result = playground.tables();
        break;
      case "plugin_config":
        result = JSON.parse(playground.plugin_config(e.data.restrict, e.data.readBody));
        break;
      case "verify":
        result = timed(() => verify(e.data.input, e.data.tables, throttled(id)));
        break;
      default:
        throw new Error(`unknown call \`${op}\``);
    }
    postMessage({ id, result });
  } catch (err) {
    postMessage({ id, threw: String((err && err.stack) || err) });
  }
};
