// The shell: a header and the page the location hash names.
import { html, render, useState, useEffect } from "./lib.js";
import { parseHash, link } from "./route.js";
import { RunsPage } from "./pages/runs.js";
import { RunPage } from "./pages/run.js";
import { TrajectoryPage } from "./pages/trajectory.js";
import { InstancePage } from "./pages/swe.js";
import { ComparePage } from "./pages/compare.js";

function page({ parts, params }) {
  const [first, id, sub, arg] = parts;
  if (first === "run" && id !== undefined && sub === "rollout") return html`<${TrajectoryPage} run=${id} n=${Number(arg)} />`;
  if (first === "run" && id !== undefined && sub === "instance") return html`<${InstancePage} run=${id} instance=${arg} />`;
  if (first === "run" && id !== undefined) return html`<${RunPage} run=${id} params=${params} />`;
  if (first === "compare" && parts.length === 3) return html`<${ComparePage} a=${parts[1]} b=${parts[2]} params=${params} />`;
  return html`<${RunsPage} params=${params} />`;
}

function App() {
  const [route, setRoute] = useState(parseHash(location.hash));
  useEffect(() => {
    const on = () => { setRoute(parseHash(location.hash)); window.scrollTo(0, 0); };
    window.addEventListener("hashchange", on);
    return () => window.removeEventListener("hashchange", on);
  }, []);
  return html`<header><a class="brand" href=${link([])}>sandgym view</a><nav><a href=${link([])}>runs</a></nav></header>
    <main>${page(route)}</main>`;
}

const root = document.getElementById("app");
root.textContent = "";
render(html`<${App} />`, root);
