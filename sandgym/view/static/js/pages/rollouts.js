// The rollouts table of a run: filter, sort, page; it follows a run still being written.
import { html } from "../lib.js";
import { usePoll } from "../api.js";
import { link, go } from "../route.js";
import { fmt, score, bytes, Badge, ErrorBox, SortTh, Pager } from "../ui.js";

const LIMIT = 50;
const FILTERS = ["error_kind", "example_id", "truncated", "step", "category", "min_reward", "max_reward", "min_turns"];

export function RolloutsTable({ run, params, bfcl = false, train = false }) {
  const sort = params.sort || "n";
  const desc = params.desc === "true";
  const offset = Number(params.offset || 0);
  const query = { run, sort, desc, offset, limit: LIMIT };
  for (const f of FILTERS) if (params[f] !== undefined) query[f] = params[f];
  const { data, error } = usePoll("rollouts", query);
  const set = (changes) => go(["run", run], { ...params, offset: 0, ...changes });
  const onSort = (name, d) => set({ sort: name, desc: d });
  const kinds = data ? Object.keys(data.error_kinds).filter((k) => k !== "none") : [];
  const ix = data && data.indexing;
  return html`<div class="rollouts">
    <div class="toolbar filters">
      <label>error kind <select id="f-error-kind" value=${params.error_kind || ""}
          onChange=${(e) => set({ error_kind: e.target.value })}>
        <option value="">all</option><option value="none">no error</option><option value="any">any error</option>
        ${kinds.map((k) => html`<option value=${k}>${k} (${data.error_kinds[k]})</option>`)}
      </select></label>
      <label>example <input id="f-example" type="number" min="0" value=${params.example_id ?? ""}
        onChange=${(e) => set({ example_id: e.target.value })} /></label>
      <label>turns ≥ <input id="f-turns" type="number" min="0" value=${params.min_turns ?? ""}
        onChange=${(e) => set({ min_turns: e.target.value })} /></label>
      <label>truncated <select id="f-truncated" value=${params.truncated ?? ""} onChange=${(e) => set({ truncated: e.target.value })}>
        <option value="">any</option><option value="true">yes</option><option value="false">no</option></select></label>
      <label>reward ≥ <input id="f-min" type="number" step="any" value=${params.min_reward ?? ""}
        onChange=${(e) => set({ min_reward: e.target.value })} /></label>
      <label>reward ≤ <input id="f-max" type="number" step="any" value=${params.max_reward ?? ""}
        onChange=${(e) => set({ max_reward: e.target.value })} /></label>
      ${train && html`<label>step <input id="f-step" type="number" min="1" value=${params.step ?? ""}
        onChange=${(e) => set({ step: e.target.value })} /></label>`}
      ${bfcl && params.category && html`<${Badge}>category ${params.category}<//>`}
      ${FILTERS.some((f) => params[f] !== undefined) && html`<button onClick=${() => go(["run", run], { sort: params.sort, desc: params.desc })}>clear filters</button>`}
    </div>
    <${ErrorBox} error=${error || (data && data.index_error)} />
    ${ix && ix.building && html`<p class="muted indexing">indexing ${bytes(ix.indexed_bytes)} of ${bytes(ix.size)}…</p>`}
    ${data && html`<${Pager} offset=${offset} limit=${LIMIT} matched=${data.matched} onPage=${(o) => go(["run", run], { ...params, offset: o })} />`}
    <table class="rollouts-table">
      <thead><tr>
        <${SortTh} name="n" label="#" sort=${sort} desc=${desc} onSort=${onSort} />
        ${train && html`<${SortTh} name="step" label="step" sort=${sort} desc=${desc} onSort=${onSort} />`}
        <${SortTh} name="example_id" label="example" sort=${sort} desc=${desc} onSort=${onSort} />
        <${SortTh} name="rollout_index" label="rollout" sort=${sort} desc=${desc} onSort=${onSort} />
        ${bfcl && html`<${SortTh} name="category" label="category" sort=${sort} desc=${desc} onSort=${onSort} /><th>entry</th>`}
        <${SortTh} name="reward" label="reward" sort=${sort} desc=${desc} onSort=${onSort} />
        <${SortTh} name="error_kind" label="error" sort=${sort} desc=${desc} onSort=${onSort} />
        <${SortTh} name="turns" label="turns" sort=${sort} desc=${desc} onSort=${onSort} />
        <${SortTh} name="truncated" label="truncated" sort=${sort} desc=${desc} onSort=${onSort} />
        <th>stop</th><th>tokens</th><th>time</th>
        <${SortTh} name="bytes" label="size" sort=${sort} desc=${desc} onSort=${onSort} />
      </tr></thead>
      <tbody>${data && data.rows.map((r) => html`<tr key=${r.n} class=${r.error_kind ? "failed" : ""} data-n=${r.n}>
        <td><a class="open" href=${link(["run", run, "rollout", r.n])}>${r.n}</a></td>
        ${train && html`<td class="num">${r.step ?? "–"}</td>`}
        <td class="num">${r.example_id}</td><td class="num">${r.rollout_index}</td>
        ${bfcl && html`<td>${r.category}</td><td>${r.entry}</td>`}
        <td class="num reward">${score(r.reward)}</td>
        <td>${r.error_kind && html`<${Badge} tone="bad" title=${r.error}>${r.error_kind}<//>`}</td>
        <td class="num">${r.turns}</td><td>${r.truncated ? html`<${Badge} tone="warn">truncated<//>` : ""}</td>
        <td>${r.stop_reason ?? ""}</td><td class="num">${fmt(r.completion_tokens)}</td>
        <td class="num">${r.total_s !== undefined && r.total_s !== null ? fmt(r.total_s, 2) + " s" : "–"}</td>
        <td class="num">${bytes(r.bytes)}</td>
      </tr>`)}</tbody>
    </table>
  </div>`;
}
