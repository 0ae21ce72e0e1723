// Hash routes: #/ (runs), #/run/ID, #/run/ID/rollout/N, #/run/ID/instance/KEY, #/compare/A/B.
// Every part is URI-encoded; ?k=v after the path holds a page's filters.
export function parseHash(hash) {
  const [path, query = ""] = (hash.replace(/^#/, "") || "/").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: Object.fromEntries(new URLSearchParams(query)) };
}

export function link(parts, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/") + (q.toString() ? "?" + q : "");
}

export function go(parts, params) {
  location.hash = link(parts, params);
}
