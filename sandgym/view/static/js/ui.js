// Small shared components. They only ever insert text (Preact escapes it): nothing from a
// run, a model or a sandbox becomes markup, an attribute name, or a URL that is not ours.
import { html, useState, useEffect, useRef } from "./lib.js";
import { get } from "./api.js";

export function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return x.toLocaleString("en-US");
  return x.toFixed(digits);
}

// Rewards and other scores: always three decimals, so a column lines up.
export function score(x) {
  return typeof x === "number" && !Number.isNaN(x) ? x.toFixed(3) : "–";
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function Badge({ tone = "", children, title }) {
  return html`<span class=${"badge " + tone} title=${title}>${children}</span>`;
}

const TONES = { finished: "ok", running: "live", stopped: "warn", resolved: "ok", unresolved: "warn", error: "bad", infra: "bad" };
export function Status({ value }) {
  return html`<${Badge} tone=${TONES[value] || ""}>${value}<//>`;
}

export function ErrorBox({ error }) {
  return error ? html`<div class="errorbox" role="alert">${error}</div>` : null;
}

export function KindCounts({ counts }) {
  const entries = Object.entries(counts || {});
  if (!entries.length) return html`<span class="muted">none</span>`;
  return entries.map(([k, v]) => html`<${Badge} tone="bad" title=${k}>${k} ${v}<//> `);
}

// A sortable column header: clicking sorts by `name`, clicking again flips the order.
export function SortTh({ name, label, sort, desc, onSort }) {
  const on = sort === name;
  return html`<th class=${"sortable" + (on ? " on" : "")} data-sort=${name}
    onClick=${() => onSort(name, on ? !desc : name === "reward" || name === "turns" || name === "bytes")}>
    ${label}${on ? (desc ? " ▼" : " ▲") : ""}</th>`;
}

// Text that may have been cut by the server: what is here, and a way to fetch the rest
// (1 MB at a time) or download the whole record.
export function TextBlock({ text, run, n, path, cut, className = "" }) {
  const key = JSON.stringify(path || []);
  const total = cut ? cut[key] : undefined;
  const [more, setMore] = useState("");
  const [error, setError] = useState(null);
  useEffect(() => setMore(""), [key, run, n]);
  const shown = (text ?? "") + more;
  const load = async () => {
    try {
      const r = await get("text", { run, n, path: key, start: shown.length, length: 1 << 20 });
      setMore((m) => m + r.value);
    } catch (e) { setError(String(e.message || e)); }
  };
  return html`<div class="textblock">
    <pre class=${className}>${shown}</pre>
    ${total !== undefined && shown.length < total && html`<div class="cut">
      showing ${fmt(shown.length)} of ${fmt(total)} characters
      <button class="more" onClick=${load}>load 1 MB more</button>
      <a href=${`/api/raw?run=${encodeURIComponent(run)}&n=${n}`} download>download the whole record</a>
    </div>`}
    <${ErrorBox} error=${error} />
  </div>`;
}

// A file of a run (a log, a diff), fetched in slices.
export function FileText({ run, path, diff = false }) {
  const [state, setState] = useState({ text: "", total: null, error: null });
  const load = async (start, reset) => {
    try {
      const r = await get("file", { run, path, start, length: 256 << 10 });
      setState((s) => ({ text: (reset ? "" : s.text) + r.value, total: r.total, error: null }));
    } catch (e) { setState((s) => ({ ...s, error: String(e.message || e) })); }
  };
  useEffect(() => { load(0, true); }, [run, path]);
  return html`<div class="textblock">
    ${diff ? html`<${Diff} text=${state.text} />` : html`<pre class="log">${state.text}</pre>`}
    ${state.total !== null && new TextEncoder().encode(state.text).length < state.total && html`<div class="cut">
      showing part of ${bytes(state.total)}
      <button class="more" onClick=${() => load(new TextEncoder().encode(state.text).length, false)}>load more</button></div>`}
    <${ErrorBox} error=${state.error} />
  </div>`;
}

export function Diff({ text }) {
  const lines = (text || "").split("\n");
  const tone = (l) => l.startsWith("+++") || l.startsWith("---") ? "file" : l.startsWith("+") ? "add"
    : l.startsWith("-") ? "del" : l.startsWith("@@") ? "hunk" : l.startsWith("diff ") ? "file" : "";
  if (!text) return html`<p class="muted">(empty diff)</p>`;
  return html`<pre class="diff">${lines.map((l) => html`<span class=${"dl " + tone(l)}>${l}${"\n"}</span>`)}</pre>`;
}

export function Json({ value }) {
  return html`<pre class="json">${JSON.stringify(value, null, 2)}</pre>`;
}

// Per-token logprobs as a strip of cells, red (unlikely) to green (likely); hover for values.
export function HeatStrip({ ids, logprobs }) {
  const ref = useRef(null);
  const [hover, setHover] = useState(null);
  const cell = 9, row = 16, perRow = 100;
  useEffect(() => {
    const c = ref.current;
    if (!c) return;
    const rows = Math.ceil(logprobs.length / perRow);
    c.width = perRow * cell;
    c.height = Math.max(1, rows) * row;
    const g = c.getContext("2d");
    logprobs.forEach((lp, i) => {
      const p = Math.exp(Math.min(0, lp));
      g.fillStyle = `hsl(${Math.round(120 * p)}, 70%, ${45 + 10 * (1 - p)}%)`;
      g.fillRect((i % perRow) * cell, Math.floor(i / perRow) * row, cell - 1, row - 2);
    });
  }, [logprobs]);
  const move = (e) => {
    const r = e.target.getBoundingClientRect();
    const i = Math.floor((e.clientY - r.top) / row) * perRow + Math.floor((e.clientX - r.left) / cell);
    setHover(i >= 0 && i < logprobs.length ? i : null);
  };
  return html`<div class="heat">
    <canvas ref=${ref} class="heatstrip" onMouseMove=${move} onMouseLeave=${() => setHover(null)}></canvas>
    <div class="heatinfo">${hover === null
      ? `${logprobs.length} tokens; mean logprob ${fmt(logprobs.reduce((a, b) => a + b, 0) / Math.max(1, logprobs.length))}`
      : `token ${hover}: id ${ids[hover] ?? "?"}, logprob ${fmt(logprobs[hover], 4)}, p ${fmt(Math.exp(logprobs[hover]), 4)}`}</div>
  </div>`;
}

export function Pager({ offset, limit, matched, onPage }) {
  const last = Math.max(0, matched - 1);
  return html`<div class="pager">
    <button disabled=${offset <= 0} onClick=${() => onPage(Math.max(0, offset - limit))}>‹ prev</button>
    <span>${matched ? `${fmt(offset + 1)}–${fmt(Math.min(matched, offset + limit))} of ${fmt(matched)}` : "no rows"}</span>
    <button disabled=${offset + limit > last} onClick=${() => onPage(offset + limit)}>next ›</button>
  </div>`;
}
