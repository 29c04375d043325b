// Shared helpers of the spanlab UI: API calls, DOM building, number formatting, the error banner.

export class ApiError extends Error {
  constructor(message, status, locked) { super(message); this.status = status; this.locked = locked; }
}

// GET (or POST with a JSON body) one API route; a non-2xx answer becomes an ApiError with the server's message.
export async function api(path, body) {
  const opts = body === undefined ? {} :
    { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) };
  const res = await fetch(path, opts);
  const data = await res.json().catch(() => ({ error: `HTTP ${res.status}` }));
  if (!res.ok) {
    const msg = data.error || (data.detail ? JSON.stringify(data.detail) : `HTTP ${res.status}`);
    throw new ApiError(msg, res.status, !!data.locked);
  }
  return data;
}

// el("td", {class: "num", title: "x"}, child, "text", ...): children may be nodes, strings or null.
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

export function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(digits);
  }
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function secs(v) {
  if (v === null || v === undefined) return "";
  return v < 1 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(1)} s`;
}

export function badge(status) { return el("span", { class: `badge ${status || ""}` }, status || "—"); }

export function showError(err) {
  const banner = document.getElementById("banner");
  banner.hidden = false;
  banner.className = err && err.locked ? "banner locked" : "banner";
  banner.textContent = err && err.locked
    ? `The store is locked by a writer (a training run or spanlab serve). Reads work again when it closes the `
      + `file. ${err.message}`
    : String(err && err.message ? err.message : err);
}

export function clearError() { document.getElementById("banner").hidden = true; }

// The hash route: "#/rollout/ro-1?attempt=at-2" -> {parts: ["rollout", "ro-1"], params: URLSearchParams}
export function route() {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

export function link(parts, params) {
  const q = params ? new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== "" && v !== undefined)) : null;
  return "#/" + parts.map(encodeURIComponent).join("/") + (q && [...q].length ? "?" + q : "");
}

// A table: columns [{key, label, cls, render(row)}]; onRow(row) makes rows clickable.
export function grid(columns, rows, onRow) {
  const head = el("tr", null, columns.map((c) => el("th", { class: c.cls }, c.label)));
  const body = rows.map((r) => el("tr", { class: onRow ? "click" : null, onclick: onRow ? () => onRow(r) : null },
    columns.map((c) => el("td", { class: c.cls, title: c.title ? c.title(r) : null },
      c.render ? c.render(r) : fmt(r[c.key])))));
  return el("table", { class: "grid" }, el("thead", null, head), el("tbody", null, body));
}

export function pager(offset, limit, total, go) {
  const end = Math.min(offset + limit, total);
  return el("div", { class: "pager" },
    el("button", { class: "secondary", disabled: offset <= 0, onclick: () => go(Math.max(0, offset - limit)) }, "‹ prev"),
    el("span", { class: "range" }, total ? `${fmt(offset + 1)}–${fmt(end)} of ${fmt(total)}` : "none"),
    el("button", { class: "secondary", disabled: end >= total, onclick: () => go(offset + limit) }, "next ›"));
}
