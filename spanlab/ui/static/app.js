// spanlab UI: hash router, the rollouts table and the rollout view. Other views live in their own modules.
import { api, badge, clearError, el, fmt, grid, link, pager, route, secs, showError } from "./common.js";
import { renderRuns } from "./runs.js";
import { renderSql } from "./sql.js";
import { renderTokens } from "./tokens.js";

const view = document.getElementById("view");
let info = null;

const FILTERS = ["status", "mode", "version", "search", "min_reward", "max_reward", "sort", "limit"];

async function renderRollouts(params) {
  info = info || await api("/api/info");
  const q = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  const offset = Number(params.get("offset") || 0);
  const limit = Number(q.limit || 50);
  const query = new URLSearchParams(Object.entries({ ...q, offset, limit }).filter(([, v]) => v !== ""));
  const page = await api(`/api/rollouts?${query}`);

  const select = (name, values) => el("label", null, name,
    el("select", { name }, el("option", { value: "" }, "any"),
      values.map((v) => el("option", { value: v, selected: q[name] === String(v) }, v))));
  const form = el("form", { class: "filters", id: "rollout-filters", onsubmit: (e) => {
    e.preventDefault();
    const data = Object.fromEntries(new FormData(e.target));
    location.hash = link(["rollouts"], data);
  } },
  select("status", info.status), select("mode", info.mode), select("version", info.version),
  el("label", null, "search ID / input", el("input", { name: "search", value: q.search, placeholder: "substring" })),
  el("label", null, "reward ≥", el("input", { name: "min_reward", type: "number", step: "any", value: q.min_reward })),
  el("label", null, "reward ≤", el("input", { name: "max_reward", type: "number", step: "any", value: q.max_reward })),
  el("label", null, "order", el("select", { name: "sort" },
    ["newest", "oldest"].map((s) => el("option", { value: s, selected: q.sort === s }, s)))),
  el("label", null, "rows", el("select", { name: "limit" },
    [25, 50, 100, 200].map((n) => el("option", { value: n, selected: limit === n }, n)))),
  el("button", { type: "submit" }, "Filter"),
  el("button", { type: "button", class: "secondary", onclick: () => { location.hash = "#/rollouts"; } }, "Reset"));

  const cols = [
    { key: "rollout_id", label: "rollout", cls: "mono" },
    { key: "status", label: "status", render: (r) => badge(r.status) },
    { key: "mode", label: "mode" },
    { key: "attempts", label: "attempts", cls: "num" },
    { key: "final_reward", label: "reward", cls: "num" },
    { key: "llm_calls", label: "calls", cls: "num" },
    { key: "prompt_tokens", label: "prompt tok", cls: "num" },
    { key: "response_tokens", label: "sampled tok", cls: "num" },
    { key: "resources_version", label: "version", cls: "mono" },
    { key: "duration_s", label: "duration", cls: "num", render: (r) => secs(r.duration_s) },
    { key: "input", label: "input", cls: "clip mono", title: (r) => r.input },
  ];
  const go = (o) => { location.hash = link(["rollouts"], { ...q, offset: o }); };
  view.replaceChildren(
    el("h2", null, "Rollouts ", el("span", { class: "dim" }, `(${fmt(info.rollouts)} in the store, `
      + `${fmt(info.spans)} spans)`)),
    form, pager(offset, limit, page.total, go),
    el("div", { class: "scroll" }, grid(cols, page.rows, (r) => { location.hash = link(["rollout", r.rollout_id]); })),
    pager(offset, limit, page.total, go));
  view.querySelector("table").id = "rollouts-table";
}

async function renderRollout(rolloutId, params) {
  const offset = Number(params.get("offset") || 0);
  const attempt = params.get("attempt");
  const query = new URLSearchParams({ offset, ...(attempt ? { attempt } : {}) });
  const d = await api(`/api/rollouts/${encodeURIComponent(rolloutId)}?${query}`);
  const r = d.rollout;
  const meta = el("dl", { class: "meta" },
    [["status", badge(r.status)], ["mode", r.mode], ["attempts", r.num_attempts],
      ["resources version", r.resources_version || "—"], ["input", fmt(r.input)], ["metadata", fmt(r.metadata) || "—"]]
      .map(([k, v]) => [el("dt", null, k), el("dd", { class: k === "input" ? "mono" : null }, v)]));
  const tabs = el("div", { class: "tabs" }, d.attempts.map((a) => el("a", {
    href: link(["rollout", rolloutId], { attempt: a.attempt_id }), class: a.attempt_id === d.attempt_id ? "active" : null,
    title: `${a.attempt_id} · ${a.worker_id || ""}`,
  }, `attempt ${a.sequence_id}: ${a.status}`)));
  const segs = d.tito_segments.length ? [
    el("h3", null, "TITO session"),
    el("p", null, el("a", { href: link(["session", d.attempt_id]), id: "session-link" },
      `token view of the session (${d.tito_segments.length} segment(s), `
      + `${fmt(d.tito_segments.reduce((s, x) => s + x.num_tokens, 0))} tokens)`)),
  ] : [];
  const cols = [
    { key: "sequence_id", label: "#", cls: "num" },
    { key: "kind", label: "kind" },
    { key: "name", label: "name" },
    { key: "role", label: "role" },
    { key: "policy_version", label: "policy version", cls: "mono", render: (s) => s.policy_version ?? s.policy ?? "",
      title: (s) => (s.policy ? `policy ${s.policy}` : null) },
    { key: "status", label: "status", render: (s) => badge(s.status) },
    { key: "model", label: "model" },
    { key: "finish_reason", label: "finish" },
    { key: "latency_s", label: "latency", cls: "num", render: (s) => secs(s.latency_s) },
    { key: "prompt_len", label: "prompt tok", cls: "num" },
    { key: "response_len", label: "sampled tok", cls: "num" },
    { key: "reward_value", label: "reward", cls: "num" },
    { key: "tito_segment", label: "segment", cls: "num" },
    { key: "preview", label: "output", cls: "clip", title: (s) => s.preview },
    { key: "span_id", label: "", render: (s) => s.kind === "llm_call"
      ? el("a", { href: link(["call", s.span_id]), class: "token-link" }, "tokens") : "" },
  ];
  const go = (o) => { location.hash = link(["rollout", rolloutId], { attempt: d.attempt_id, offset: o }); };
  view.replaceChildren(
    el("h2", null, el("a", { href: "#/rollouts" }, "Rollouts"), " / ", el("span", { class: "mono" }, rolloutId)),
    meta, tabs, ...segs,
    el("h3", null, `Spans of attempt ${d.attempt_id || "—"} in order`),
    pager(offset, d.limit, d.spans_total, go),
    el("div", { class: "scroll" }, grid(cols, d.spans, null)));
  view.querySelector("table").id = "spans-table";
}

const ROUTES = {
  rollouts: (parts, params) => renderRollouts(params),
  rollout: (parts, params) => renderRollout(parts[1], params),
  call: (parts, params) => renderTokens(view, "call", parts[1], params),
  session: (parts, params) => renderTokens(view, "session", parts[1], params),
  runs: (parts, params) => renderRuns(view, params),
  sql: (parts, params) => renderSql(view, params),
};

async function render() {
  const { parts, params } = route();
  const name = ROUTES[parts[0]] ? parts[0] : "rollouts";
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === name || (name === "rollout" && a.dataset.nav === "rollouts"));
  }
  document.body.dataset.view = name;
  document.body.dataset.ready = "";
  try {
    clearError();
    await ROUTES[name](parts, params);
  } catch (err) {
    showError(err);
  } finally {
    document.body.dataset.ready = name;  // tests wait for this
  }
}

window.addEventListener("hashchange", render);
api("/api/info").then((i) => {
  info = i;
  document.getElementById("dbinfo").textContent = i.db;
}).catch(() => {});
render();
