// Two eval runs side by side, per example: mean reward in each, the delta, and which examples
// flipped (solved by some rollout in one run, by none in the other).
import { html } from "../lib.js";
import { usePoll } from "../api.js";
import { link, go } from "../route.js";
import { fmt, score, Badge, ErrorBox } from "../ui.js";

function Side({ run, s }) {
  if (!s) return html`<td class="muted">absent</td>`;
  return html`<td class="num"><a href=${link(["run", run, "rollout", s.first])}>${score(s.reward)}</a>
    ${s.errors ? html` <${Badge} tone="bad">${s.errors} failed<//>` : ""}</td>`;
}

export function ComparePage({ a, b, params }) {
  const { data, error } = usePoll("compare", { a, b });
  const only = params.only || "";
  if (!data) return html`<${ErrorBox} error=${error} />${!error && html`<p class="muted">Loading…</p>`}`;
  const rows = data.examples.filter((r) => !only || (only === "flipped" ? r.flip : only === "changed" ? r.delta : true));
  return html`<section class="compare">
    <h1>Compare</h1>
    <table class="pair">
      <thead><tr><th></th><th>run</th><th>environment</th><th>model / policy</th><th>reward</th><th>rollouts</th></tr></thead>
      <tbody>${[["A", data.a], ["B", data.b]].map(([name, r]) => html`<tr><td><b>${name}</b></td>
        <td><a href=${link(["run", r.id])}>${r.id}</a></td><td>${r.env}</td><td>${r.model}</td>
        <td class="num">${score(r.reward_mean)}</td><td class="num">${fmt(r.rollouts)}</td></tr>`)}</tbody>
    </table>
    <p id="flips"><${Badge} tone="ok">${data.gained} gained<//> <${Badge} tone="bad">${data.lost} lost<//>
      <span class="muted">(examples solved in B and not in A, and the other way)</span></p>
    <div class="toolbar"><label>show <select id="f-only" value=${only} onChange=${(e) => go(["compare", a, b], { only: e.target.value })}>
      <option value="">every example</option><option value="flipped">flipped only</option><option value="changed">reward changed</option>
    </select></label></div>
    <${ErrorBox} error=${error} />
    <table class="examples">
      <thead><tr><th>example</th><th>reward A</th><th>reward B</th><th>delta</th><th>flip</th></tr></thead>
      <tbody>${rows.map((r) => html`<tr key=${r.example_id} class=${r.flip || ""} data-example=${r.example_id}>
        <td class="num">${r.example_id}</td><${Side} run=${a} s=${r.a} /><${Side} run=${b} s=${r.b} />
        <td class="num">${r.delta === null ? "–" : (r.delta > 0 ? "+" : "") + score(r.delta)}</td>
        <td>${r.flip && html`<${Badge} tone=${r.flip === "gained" ? "ok" : "bad"}>${r.flip}<//>`}</td></tr>`)}</tbody>
    </table>
  </section>`;
}
