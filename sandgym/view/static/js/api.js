// Talking to the viewer's JSON API, and polling it while a page is open (live runs).
import { useEffect, useState, useRef } from "./lib.js";

export const POLL_MS = 1500;

export async function get(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const url = `/api/${path}${q.toString() ? "?" + q : ""}`;
  const resp = await fetch(url, { credentials: "same-origin" });
  const body = await resp.json().catch(() => ({ detail: resp.statusText }));
  if (!resp.ok) throw new Error(`${resp.status}: ${body.detail || resp.statusText}`);
  return body;
}

// Fetch now, then again every `every` ms while mounted (0: once). Returns {data, error}.
// A new `key` (the request's parameters) refetches at once.
export function usePoll(path, params, every = POLL_MS) {
  const [state, setState] = useState({ data: null, error: null });
  const key = JSON.stringify([path, params]);
  const live = useRef(key);
  useEffect(() => {
    live.current = key;
    let timer = null;
    const tick = async () => {
      try {
        const data = await get(path, params);
        if (live.current === key) setState({ data, error: null });
      } catch (error) {
        if (live.current === key) setState((s) => ({ data: s.data, error: String(error.message || error) }));
      }
      if (every && live.current === key) timer = setTimeout(tick, every);
    };
    tick();
    return () => { live.current = null; clearTimeout(timer); };
  }, [key]);
  return state;
}
