// SWE debug and validation runs: the instances, and per instance its status, the patch as a
// diff, the logs and the FAIL_TO_PASS / PASS_TO_PASS tests with their outcomes (flaky tests of
// a validation run highlighted).
import { html, useState } from "../lib.js";
import { usePoll } from "../api.js";
import { link } from "../route.js";
import { fmt, bytes, Badge, Status, ErrorBox, KindCounts, FileText, Json } from "../ui.js";

const PASSING = ["passed", "xfail"];

function ratio(d) {
  const v = Object.values(d || {});
  if (!v.length) return "–";
  const ok = v.filter((o) => PASSING.includes(o)).length;
  return html`<span class=${ok === v.length ? "good" : "bad"}>${ok}/${v.length}</span>`;
}

export function SWERunPage({ run, data }) {
  const validate = data.mode === "validate";
  const flaky = new Map((data.validation || []).map((v) => [v.instance_id, v]));
  return html`
    <div class="cards">
      <div class="card"><b>mode</b>${data.mode ?? "–"} (${(data.meta || {}).step ?? "–"})</div>
      <div class="card"><b>tasks</b>${data.model ?? "–"}</div>
      <div class="card"><b>status</b><${Status} value=${data.status} /></div>
      <div class="card"><b>resolved</b><span id="resolved">${data.resolved}/${data.runs}</span></div>
      <div class="card"><b>statuses</b>${Object.entries(data.statuses).map(([k, v]) => html`<div><${Status} value=${k} /> ${v}</div>`)}</div>
      <div class="card"><b>infra failures</b><${KindCounts} counts=${data.error_kinds} /></div>
      ${validate && html`<div class="card"><b>valid instances</b>${data.valid ?? "(running)"}</div>`}
      <div class="card"><b>wall</b>${data.wall_s ? fmt(data.wall_s, 1) + " s" : "–"}</div>
    </div>
    ${validate && html`<h2>Validation</h2><table class="validation">
      <thead><tr><th>instance</th><th>runs</th><th>verdict</th><th>flaky tests</th><th>problems</th></tr></thead>
      <tbody>${data.validation.map((v) => html`<tr key=${v.instance_id} class=${v.flaky.length ? "flaky" : ""}>
        <td>${v.instance_id}</td><td class="num">${v.runs.length}</td>
        <td>${v.verdict ? html`<${Badge} tone=${v.verdict === "valid" ? "ok" : "bad"}>${v.verdict}<//>` : "–"}</td>
        <td>${v.flaky.map((t) => html`<div class="flakytest">${t}</div>`)}${v.flaky_other ? html`<div class="muted">+${v.flaky_other} unlisted</div>` : ""}</td>
        <td>${(v.problems || []).map((p) => html`<div>${p}</div>`)}</td></tr>`)}</tbody></table>`}
    <h2>Instances</h2>
    <table class="instances">
      <thead><tr><th>${validate ? "run" : "instance"}</th><th>step</th><th>status</th><th>FAIL_TO_PASS</th><th>PASS_TO_PASS</th>
        <th>image</th><th>time</th><th>failing tests / error</th></tr></thead>
      <tbody>${data.lines.map((r) => html`<tr key=${r.key} class=${validate && flaky.get(r.instance_id) && flaky.get(r.instance_id).flaky.length ? "flaky" : ""}>
        <td><a class="instlink" href=${link(["run", run, "instance", r.key || r.instance_id])}>${r.key || r.instance_id}</a></td>
        <td>${r.step}</td><td><${Status} value=${r.status} /></td>
        <td>${ratio(r.fail_to_pass)}</td><td>${ratio(r.pass_to_pass)}</td>
        <td>${r.image_source === "prebuilt" ? "prebuilt" : r.image_reused === true ? "reused" : r.image_reused === false ? "built" : "–"}</td>
        <td class="num">${fmt((r.timings || {}).total_s, 1)} s</td>
        <td>${(r.failing_tests || []).join(", ")}${r.error ? html`<div class="err">${r.infra_reason ? `[${r.infra_reason}] ` : ""}${String(r.error).split("\n")[0]}</div>` : ""}</td>
      </tr>`)}</tbody>
    </table>`;
}

function Lazy({ title, children }) {
  const [open, setOpen] = useState(false);
  return html`<details onToggle=${(e) => setOpen(e.target.open)}><summary>${title}</summary>${open && children}</details>`;
}

function TestTable({ result, flaky, siblings }) {
  const rows = [];
  for (const [kind, tests] of [["FAIL_TO_PASS", result.fail_to_pass || {}], ["PASS_TO_PASS", result.pass_to_pass || {}]]) {
    for (const [t, o] of Object.entries(tests)) rows.push({ t, kind, o });
  }
  const flakySet = new Set(flaky || []);
  const runs = siblings || [];
  const outcome = (s, t) => ({ ...(s.fail_to_pass || {}), ...(s.pass_to_pass || {}) })[t] ?? "–";
  if (!rows.length) return html`<p class="muted">no FAIL_TO_PASS / PASS_TO_PASS outcomes (the tests did not run or were not graded)</p>`;
  return html`<table class="tests">
    <thead><tr><th>test</th><th>kind</th><th>outcome</th>${runs.map((s) => html`<th>${s.key.split("/").slice(-1)[0]}</th>`)}</tr></thead>
    <tbody>${rows.map(({ t, kind, o }) => html`<tr key=${kind + t} class=${flakySet.has(t) ? "flaky" : ""}>
      <td>${t}${flakySet.has(t) ? html` <${Badge} tone="warn">flaky<//>` : ""}</td><td>${kind}</td>
      <td class=${PASSING.includes(o) ? "good" : "bad"}>${o}</td>
      ${runs.map((s) => { const x = outcome(s, t); return html`<td class=${PASSING.includes(x) ? "good" : "bad"}>${x}</td>`; })}
    </tr>`)}</tbody>
  </table>`;
}

export function InstancePage({ run, instance }) {
  const { data, error } = usePoll("instance", { run, key: instance }, 0);
  if (!data) return html`<${ErrorBox} error=${error} />${!error && html`<p class="muted">Loading…</p>`}`;
  const r = data.result;
  const diff = data.files.find((f) => f.name === "applied.diff");
  const logs = data.files.filter((f) => f.name !== "applied.diff");
  return html`<section class="instance">
    <p><a href=${link(["run", run])}>← run ${run}</a></p>
    <h1>${data.key} <${Status} value=${r.status} /></h1>
    <div class="cards">
      <div class="card"><b>repo</b>${r.repo ?? "–"} ${r.version ?? ""}</div>
      <div class="card"><b>step</b>${r.step ?? "–"}</div>
      <div class="card"><b>resolution</b>${r.resolution ?? "–"}</div>
      <div class="card"><b>image</b>${r.image ?? "–"} ${r.image_source ? `(${r.image_source})` : ""}</div>
      <div class="card"><b>time</b>${Object.entries(r.timings || {}).map(([k, v]) => html`<div>${k} ${fmt(v, 2)}</div>`)}</div>
    </div>
    ${r.error && html`<div class="errorbox">${r.infra_reason ? html`<${Badge} tone="bad">${r.infra_reason}<//> ` : ""}<pre>${r.error}</pre></div>`}
    <h2>Tests</h2>
    <${TestTable} result=${r} flaky=${data.flaky} siblings=${data.siblings} />
    <h2>Patch</h2>
    ${diff ? html`<${FileText} run=${run} path=${diff.path} diff=${true} />` : html`<p class="muted">no diff</p>`}
    <h2>Logs</h2>
    ${logs.map((f) => html`<${Lazy} title=${`${f.name} (${bytes(f.bytes)})`}><${FileText} run=${run} path=${f.path} /><//>`)}
    <details><summary>result.json</summary><${Json} value=${r} /></details>
  </section>`;
}
