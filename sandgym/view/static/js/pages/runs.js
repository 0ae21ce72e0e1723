// Every run found under the folders given to `sandgym view`, and the picker to compare two.
import { html, useState } from "../lib.js";
import { usePoll } from "../api.js";
import { link, go } from "../route.js";
import { fmt, score, Status, KindCounts, ErrorBox, Badge } from "../ui.js";

function passAtK(p) {
  const ks = Object.keys(p || {});
  return ks.length ? ks.map((k) => `pass@${k} ${score(p[k])}`).join(", ") : "–";
}

export function RunsPage() {
  const { data, error } = usePoll("runs", {});
  const [picked, setPicked] = useState([]);
  const toggle = (id) => setPicked((p) => p.includes(id) ? p.filter((x) => x !== id) : [...p, id].slice(-2));
  const runs = data ? data.runs : [];
  return html`<section>
    <h1>Runs</h1>
    <${ErrorBox} error=${error} />
    ${data && html`<p class="muted">${runs.length} run(s) under ${data.roots.join(", ")}</p>`}
    <div class="toolbar">
      <button id="compare" disabled=${picked.length !== 2} onClick=${() => go(["compare", picked[0], picked[1]])}>
        compare the two ticked runs</button>
      <span class="muted">tick two eval runs to compare them per example</span>
    </div>
    <table class="runs">
      <thead><tr><th></th><th>run</th><th>kind</th><th>environment</th><th>model / policy</th><th>status</th>
        <th>reward</th><th>pass@k</th><th>rollouts</th><th>infra failures</th><th>wall</th></tr></thead>
      <tbody>${runs.map((r) => html`<tr key=${r.id} data-run=${r.id}>
        <td>${(r.kind === "eval" || r.kind === "bfcl") && html`<input type="checkbox" class="pick"
          checked=${picked.includes(r.id)} onChange=${() => toggle(r.id)} />`}</td>
        <td><a class="runlink" href=${link(["run", r.id])}>${r.id}</a></td>
        <td>${r.kind}${r.mode ? html` <${Badge}>${r.mode}<//>` : ""}</td>
        <td>${r.env ?? "–"}</td><td>${r.model ?? "–"}</td><td><${Status} value=${r.status} /></td>
        <td class="num">${score(r.reward_mean)}</td><td>${passAtK(r.pass_at_k)}</td>
        <td class="num">${fmt(r.rollouts ?? r.runs ?? r.steps)}</td>
        <td><${KindCounts} counts=${r.error_kinds} /></td>
        <td class="num">${r.wall_s ? fmt(r.wall_s, 1) + " s" : "–"}</td>
      </tr>`)}</tbody>
    </table>
  </section>`;
}
