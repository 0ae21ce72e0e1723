// A run's page: what it holds depends on its kind (eval, BFCL, SWE, training).
import { html } from "../lib.js";
import { usePoll } from "../api.js";
import { link } from "../route.js";
import { fmt, score, Status, KindCounts, ErrorBox, Json } from "../ui.js";
import { RolloutsTable } from "./rollouts.js";
import { SWERunPage } from "./swe.js";
import { TrainPage } from "./train.js";

export function RunPage({ run, params }) {
  const { data, error } = usePoll("run", { id: run });
  if (!data) return html`<${ErrorBox} error=${error} />${!error && html`<p class="muted">Loading…</p>`}`;
  const body = data.kind === "swe" ? html`<${SWERunPage} run=${run} data=${data} />`
    : data.kind === "train" ? html`<${TrainPage} run=${run} data=${data} params=${params} />`
    : html`<${EvalPage} run=${run} data=${data} params=${params} />`;
  return html`<section>
    <h1><span class="muted">run</span> ${data.id}</h1>
    <p class="muted path">${data.path}</p>
    <${ErrorBox} error=${error} />
    ${body}
  </section>`;
}

function EvalPage({ run, data, params }) {
  const s = data.summary || {};
  return html`
    <div class="cards">
      <div class="card"><b>environment</b>${data.env ?? "–"}</div>
      <div class="card"><b>model / policy</b>${data.model ?? "–"}</div>
      <div class="card"><b>status</b><${Status} value=${data.status} /></div>
      <div class="card"><b>reward (valid)</b><span id="reward">${score(s.reward_mean)}</span></div>
      <div class="card"><b>rollouts</b><span id="count">${fmt(data.rollouts)}</span></div>
      <div class="card"><b>pass@k</b>${Object.entries(s.pass_at_k || {}).map(([k, v]) => html`<div>pass@${k} ${score(v)}</div>`)}</div>
      <div class="card"><b>infra failures</b><${KindCounts} counts=${s.error_kinds} /></div>
      <div class="card"><b>wall</b>${s.wall_s ? fmt(s.wall_s, 1) + " s" : "–"}</div>
    </div>
    ${data.kind === "bfcl" && html`<${BFCLCategories} run=${run} rows=${data.categories} />`}
    <h2>Rollouts</h2>
    <${RolloutsTable} run=${run} params=${params} bfcl=${data.kind === "bfcl"} />
    <details><summary>meta.json</summary><${Json} value=${data.meta} /></details>`;
}

function BFCLCategories({ run, rows }) {
  return html`<h2>BFCL categories</h2>
    <table class="bfcl-categories">
      <thead><tr><th>category</th><th>entries</th><th>correct</th><th>accuracy</th><th>errors</th></tr></thead>
      <tbody>${rows.map((c) => html`<tr key=${c.category}>
        <td><a href=${link(["run", run], { category: c.category })}>${c.category}</a></td>
        <td class="num">${c.entries}</td><td class="num">${c.correct}</td>
        <td class="num">${score(c.accuracy)}</td><td class="num">${c.errors}</td></tr>`)}</tbody>
    </table>`;
}
