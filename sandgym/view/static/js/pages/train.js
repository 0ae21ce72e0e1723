// Training runs (GRPO and SFT): per-step plots that extend while the run is written, and the
// sample rollouts of each step.
import { html, useEffect, useRef, useState } from "../lib.js";
import { get, POLL_MS } from "../api.js";
import { fmt, Status, KindCounts, ErrorBox, Json } from "../ui.js";
import { RolloutsTable } from "./rollouts.js";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
const FAILURES = ["sandbox", "model", "environment", "timeout", "scoring"];

const GRPO_PLOTS = [
  { title: "reward", keys: ["reward_mean", "reward_std"] },
  { title: "loss", keys: ["loss"] },
  { title: "KL", keys: ["kl", "mismatch_kl"] },
  { title: "entropy", keys: ["entropy"] },
  { title: "clip fraction", keys: ["clip_frac"] },
  { title: "step time (s)", keys: ["step_s", "generate_s", "train_s"] },
  { title: "infra failures", keys: FAILURES.map((k) => "failed_" + k), bars: true },
];
const SFT_PLOTS = [
  { title: "loss", keys: ["loss"] },
  { title: "grad norm", keys: ["grad_norm"] },
  { title: "learning rate", keys: ["lr"] },
  { title: "step time (s)", keys: ["train_s"] },
];

// Every metrics line so far, fetched again from where the last fetch stopped.
function useSteps(run) {
  const [state, setState] = useState({ steps: [], error: null });
  useEffect(() => {
    let stop = false, timer = null, have = [];
    const tick = async () => {
      try {
        const r = await get("metrics", { run, since: have.length });
        if (r.steps.length && !stop) { have = have.concat(r.steps); setState({ steps: have, error: null }); }
      } catch (e) { if (!stop) setState((s) => ({ ...s, error: String(e.message || e) })); }
      if (!stop) timer = setTimeout(tick, POLL_MS);
    };
    tick();
    return () => { stop = true; clearTimeout(timer); };
  }, [run]);
  return state;
}

function Plot({ spec, steps }) {
  const canvas = useRef(null);
  const chart = useRef(null);
  const keys = spec.keys.filter((k) => steps.some((s) => s[k] !== undefined));
  useEffect(() => () => { if (chart.current) chart.current.destroy(); }, []);
  useEffect(() => {
    if (!window.Chart || !canvas.current || !keys.length) return;
    if (!chart.current) {
      chart.current = new window.Chart(canvas.current, {
        type: spec.bars ? "bar" : "line",
        data: { labels: [], datasets: [] },
        options: {
          animation: false, responsive: true, maintainAspectRatio: false, interaction: { mode: "index", intersect: false },
          scales: { x: { title: { display: true, text: "step" }, stacked: !!spec.bars }, y: { stacked: !!spec.bars } },
          plugins: { legend: { labels: { boxWidth: 12 } } }, elements: { point: { radius: steps.length < 30 ? 2 : 0 } },
        },
      });
    }
    const c = chart.current;
    c.data.labels = steps.map((s) => s.step);
    c.data.datasets = keys.map((k, i) => ({
      label: k, data: steps.map((s) => s[k] ?? null), borderColor: COLORS[i % COLORS.length],
      backgroundColor: COLORS[i % COLORS.length], borderWidth: 1.5, spanGaps: true,
    }));
    c.update("none");
  }, [steps.length, keys.join()]);
  // A plot appears once the run has logged one of its series (an SFT run has no reward).
  if (!keys.length) return null;
  return html`<div class="plot" data-plot=${spec.title} data-points=${steps.length}>
    <h3>${spec.title}</h3><div class="plotbox"><canvas ref=${canvas}></canvas></div></div>`;
}

export function TrainPage({ run, data, params }) {
  const { steps, error } = useSteps(run);
  const sft = data.mode === "sft";
  const last = steps[steps.length - 1] || {};
  return html`
    <div class="cards">
      <div class="card"><b>mode</b>${sft ? "SFT" : "GRPO"}</div>
      <div class="card"><b>environment</b>${data.env ?? "–"}</div>
      <div class="card"><b>model</b>${data.model ?? "–"}</div>
      <div class="card"><b>status</b><${Status} value=${data.status} /></div>
      <div class="card"><b>steps</b><span id="steps">${steps.length}</span>${data.total_steps ? ` / ${data.total_steps}` : ""}</div>
      ${!sft && html`<div class="card"><b>reward (last step)</b>${fmt(last.reward_mean)}</div>`}
      <div class="card"><b>loss (last step)</b>${fmt(last.loss, 4)}</div>
      <div class="card"><b>infra failures</b><${KindCounts} counts=${data.error_kinds} /></div>
    </div>
    <${ErrorBox} error=${error} />
    <div class="plots">${(sft ? SFT_PLOTS : GRPO_PLOTS).map((p) => html`<${Plot} key=${p.title} spec=${p} steps=${steps} />`)}</div>
    ${!sft && html`<h2>Sample rollouts</h2>
      ${data.samples ? html`<${RolloutsTable} run=${run} params=${params} train=${true} />`
        : html`<p class="muted">no samples.jsonl in this run (written by sandgym train with output.samples_per_step > 0)</p>`}`}
    <details><summary>config.json</summary><${Json} value=${data.config} /></details>`;
}
