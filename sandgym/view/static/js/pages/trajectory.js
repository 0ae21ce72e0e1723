// One rollout, turn by turn: messages, tool calls and their results (with flags), reward and
// metrics, token counts and the per-token logprobs.
import { html } from "../lib.js";
import { usePoll } from "../api.js";
import { link } from "../route.js";
import { fmt, score, bytes, Badge, ErrorBox, Json, TextBlock, HeatStrip } from "../ui.js";

function prettyArgs(text) {
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch { return text; }
}

// Arguments pretty-printed when they are whole JSON (a cut string is shown as it is).
function Args({ c, at, ctx }) {
  const text = c.function ? c.function.arguments : JSON.stringify(c.arguments);
  const cut = ctx.cut && ctx.cut[JSON.stringify(at)] !== undefined;
  return html`<${TextBlock} className="args" text=${cut || typeof text !== "string" ? text : prettyArgs(text)} path=${at} ...${ctx} />`;
}

function Flags({ flags }) {
  if (!flags) return null;
  return html`<span class="flags">
    ${flags.exit_code !== undefined && html`<${Badge} tone="bad">exit code ${flags.exit_code}<//>`}
    ${flags.timed_out && html`<${Badge} tone="bad">timed out${flags.timeout_s ? ` after ${flags.timeout_s}s` : ""}<//>`}
    ${flags.oom_killed && html`<${Badge} tone="bad">out of memory<//>`}
    ${flags.truncated && html`<${Badge} tone="warn">output truncated<//>`}
    ${flags.stderr && html`<${Badge} tone="warn">stderr<//>`}
  </span>`;
}

function Content({ value, at, ctx }) {
  if (typeof value === "string") return html`<${TextBlock} text=${value} path=${at} ...${ctx} />`;
  if (Array.isArray(value)) {
    return value.map((part, k) => part && typeof part.text === "string"
      ? html`<${TextBlock} text=${part.text} path=${[...at, k, "text"]} ...${ctx} />`
      : html`<${Json} value=${part} />`);
  }
  return value === null || value === undefined ? null : html`<${Json} value=${value} />`;
}

function Message({ m, at, ctx }) {
  if (!m || typeof m !== "object") return html`<${Json} value=${m} />`;
  const role = String(m.role ?? "?");
  return html`<div class=${"msg role-" + role.replace(/[^a-z]/g, "")}>
    <div class="msghead"><${Badge}>${role}<//>${m.name ? html` <span class="muted">${m.name}</span>` : ""}
      ${m.tool_call_id ? html` <span class="muted">for ${m.tool_call_id}</span>` : ""} <${Flags} flags=${m.flags} /></div>
    <${Content} value=${m.content} at=${[...at, "content"]} ctx=${ctx} />
    ${(m.tool_calls || []).map((c, k) => html`<div class="toolcall">
      <div><${Badge} tone="call">call<//> <b class="callname">${c.function ? c.function.name : c.name}</b>
        <span class="muted">${c.id ?? ""}</span></div>
      <${Args} c=${c} at=${[...at, "tool_calls", k, "function", "arguments"]} ctx=${ctx} />
    </div>`)}
  </div>`;
}

function Turn({ t, i, ctx }) {
  const tok = t.tokens;
  return html`<div class="turn" data-turn=${i}>
    <h3>Turn ${i + 1}
      ${t.finish_reason && html` <${Badge} tone=${t.finish_reason === "length" ? "warn" : ""}>finish: ${t.finish_reason}<//>`}
      <span class="muted small">model ${fmt(t.model_s, 3)} s · tools ${fmt(t.tools_s, 3)} s
        ${t.usage && Object.keys(t.usage).length ? ` · tokens ${Object.entries(t.usage).map(([k, v]) => `${k} ${v}`).join(", ")}` : ""}
        ${tok ? ` · prompt ${tok.prompt_len} / completion ${tok.completion_ids.length} token ids` : ""}
        ${tok && tok.policy_version !== null && tok.policy_version !== undefined ? ` · policy v${tok.policy_version}` : ""}</span></h3>
    <${Message} m=${t.completion} at=${["turns", i, "completion"]} ctx=${ctx} />
    ${tok && tok.completion_logprobs && tok.completion_logprobs.length > 0 &&
      html`<${HeatStrip} ids=${tok.completion_ids} logprobs=${tok.completion_logprobs} />`}
    ${(t.env_response || []).map((m, j) => html`<${Message} m=${m} at=${["turns", i, "env_response", j]} ctx=${ctx} />`)}
  </div>`;
}

function BFCLEntry({ b }) {
  return html`<div class="bfcl-entry">
    <h2>BFCL entry ${b.id} <span class="muted">${b.category}</span>
      ${b.valid ? html` <${Badge} tone="ok">valid<//>` : html` <${Badge} tone="bad">invalid<//>`}</h2>
    ${!b.valid && html`<div class="reason"><b>checker:</b> <span class="error-type">${b.error_type ?? "–"}</span>
      <pre class="checker-reason">${typeof b.reason === "string" ? b.reason : JSON.stringify(b.reason, null, 2)}</pre></div>`}
    <div class="sidebyside">
      <div><h3>calls made</h3><${Json} value=${b.calls} /></div>
      <div><h3>possible answers</h3>${b.possible_answers_error
        ? html`<p class="muted">${b.possible_answers_error}</p>` : html`<${Json} value=${b.possible_answers} />`}</div>
    </div>
  </div>`;
}

export function TrajectoryPage({ run, n }) {
  const { data: r, error } = usePoll("record", { run, n }, 0);
  if (!r) return html`<${ErrorBox} error=${error} />${!error && html`<p class="muted">Loading…</p>`}`;
  const ctx = { run, n, cut: r.truncated };
  const turns = r.turns || [];
  const prompt = turns.length ? turns[0].prompt : r.prompt;
  const promptAt = turns.length ? ["turns", 0, "prompt"] : ["prompt"];
  const cutCount = Object.keys(r.truncated || {}).length;
  return html`<section class="trajectory">
    <p><a href=${link(["run", run])}>← run ${run}</a></p>
    <h1>Rollout ${n} <span class="muted">example ${r.example_id} · rollout ${r.rollout_index}${r.step !== undefined ? ` · step ${r.step}` : ""}</span></h1>
    ${cutCount > 0 && html`<div class="cutnote">This record is ${bytes(r.bytes)}; ${cutCount} long field(s) are shown cut.
      <a href=${`/api/raw?run=${encodeURIComponent(run)}&n=${n}`} download>download the whole record</a></div>`}
    <div class="cards">
      <div class="card"><b>reward</b><span id="reward">${score(r.reward)}</span></div>
      ${r.advantage !== null && r.advantage !== undefined && html`<div class="card"><b>advantage</b>${fmt(r.advantage)}</div>`}
      <div class="card"><b>stop</b>${r.stop_reason ?? "–"}</div>
      <div class="card"><b>turns</b>${turns.length}</div>
      ${Object.keys(r.usage || {}).length > 0 && html`<div class="card"><b>tokens</b>${Object.entries(r.usage).map(([k, v]) => html`<div>${k} ${fmt(v)}</div>`)}</div>`}
      <div class="card"><b>time</b>${Object.entries(r.timing || {}).map(([k, v]) => html`<div>${k} ${fmt(v, 3)}</div>`)}</div>
    </div>
    ${r.error && html`<div class="errorbox rollout-error"><${Badge} tone="bad">${r.error_kind ?? "error"}<//>
      <pre>${r.error}</pre></div>`}
    ${Object.keys(r.metrics || {}).length > 0 && html`<table class="metrics"><thead><tr><th>metric</th><th>value</th></tr></thead>
      <tbody>${Object.entries(r.metrics).map(([k, v]) => html`<tr><td>${k}</td><td class="num">${fmt(v, 4)}</td></tr>`)}</tbody></table>`}
    ${r.bfcl && html`<${BFCLEntry} b=${r.bfcl} />`}
    <h2>Prompt</h2>
    ${(prompt || []).map((m, j) => html`<${Message} m=${m} at=${[...promptAt, j]} ctx=${ctx} />`)}
    ${r.tools && r.tools.length > 0 && html`<details><summary>${r.tools.length} tool schema(s)</summary><${Json} value=${r.tools} /></details>`}
    <h2>Turns</h2>
    ${turns.map((t, i) => html`<${Turn} t=${t} i=${i} ctx=${ctx} />`)}
    ${!turns.length && (r.completion || []).map((m, j) => html`<${Message} m=${m} at=${["completion", j]} ctx=${ctx} />`)}
    <details><summary>answer and info</summary><${Json} value=${{ answer: r.answer, info: r.info, task: r.task, sandbox_id: r.sandbox_id }} /></details>
  </section>`;
}
