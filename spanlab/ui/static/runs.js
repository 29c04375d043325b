// Training runs: the runs in train_metrics and, for one, a line chart (inline SVG) per chosen metric and its
// per-role table (role_summary: each agent role's calls, rewards and policy versions per step).
import { api, el, fmt, grid, link } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2458c6", "#d6336c", "#2e9e4f", "#b7791f", "#7048e8", "#0c8599"];

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function ticks(lo, hi, n) {
  if (lo === hi) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((s) => (hi - lo) / s <= n) || step * 10;
  const out = [];
  for (let v = Math.ceil(lo / nice) * nice; v <= hi + 1e-12; v += nice) out.push(+v.toPrecision(12));
  return out;
}

// One metric's curve: steps on x, values on y; non-finite values (NaN loss) are gaps.
export function lineChart(name, series, color) {
  const W = 460, H = 240, L = 52, R = 12, T = 10, B = 30;
  const pts = series.step.map((s, i) => [s, series.value[i]]).filter(([, v]) => typeof v === "number" && isFinite(v));
  const chart = el("div", { class: "chart", dataset: { metric: name } }, el("div", { class: "title" }, name));
  if (!pts.length) { chart.append(el("p", { class: "dim" }, "no finite values")); return chart; }
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const g = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  for (const t of ticks(y0, y1, 5)) {
    g.append(svg("line", { class: "gridline", x1: L, x2: W - R, y1: Y(t), y2: Y(t) }),
      svg("text", { x: L - 6, y: Y(t) + 4, "text-anchor": "end" }, String(+t.toPrecision(4))));
  }
  for (const t of ticks(x0, x1, 6).filter(Number.isInteger)) {
    g.append(svg("text", { x: X(t), y: H - B + 16, "text-anchor": "middle" }, String(t)));
  }
  g.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }),
    svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }),
    svg("text", { x: (L + W - R) / 2, y: H - 2, "text-anchor": "middle" }, "step"));
  const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join("");
  g.append(svg("path", { class: "line", d, stroke: color }));
  if (pts.length <= 200) {
    for (const [x, y] of pts) {
      g.append(svg("circle", { cx: X(x), cy: Y(y), r: 2.5, fill: color }, svg("title", {}, `step ${x}: ${y}`)));
    }
  }
  chart.append(g);
  return chart;
}

export async function renderRuns(view, params) {
  const runs = await api("/api/runs");
  const head = el("h2", null, "Training runs");
  if (!runs.length) {
    view.replaceChildren(head, el("p", { class: "dim", id: "no-runs" },
      "No training metrics in this store yet (train_metrics is written by spanlab train)."));
    return;
  }
  const runId = params.get("run") || runs[0].run_id;
  const run = runs.find((r) => r.run_id === runId) || runs[0];
  // an async run (docs/async.md) also shows how old its samples were and how many were dropped as stale
  const defaults = ["reward_mean", "loss", "staleness_mean", "dropped_stale_rollouts"].filter((m) => run.metrics.includes(m))
    .concat(run.metrics.filter((m) => m.startsWith("curve_")));  // held-out accuracy during training (eval.curve)
  const chosen = (params.get("metrics") || defaults.join(",") || run.metrics.slice(0, 2).join(",")).split(",").filter(Boolean);
  const runPath = `/api/runs/${encodeURIComponent(run.run_id)}`;
  const [series, roles] = await Promise.all([
    api(`${runPath}/metrics?names=${encodeURIComponent(chosen.join(","))}`), api(`${runPath}/roles`)]);
  const cols = [
    { key: "run_id", label: "run", cls: "mono" }, { key: "algorithm", label: "algorithm" },
    { key: "steps", label: "steps", cls: "num" },
    { key: "updated", label: "last update", render: (r) => new Date(r.updated * 1000).toLocaleString() },
    { key: "metrics", label: "metrics", cls: "clip", render: (r) => r.metrics.join(", ") },
  ];
  const picker = el("div", { class: "tabs" }, run.metrics.map((m) => el("a", {
    href: link(["runs"], { run: run.run_id, metrics: (chosen.includes(m) ? chosen.filter((x) => x !== m) : [...chosen, m]).join(",") }),
    class: chosen.includes(m) ? "active" : null,
  }, m)));
  const charts = el("div", { class: "charts", id: "charts" },
    chosen.filter((m) => series[m]).map((m, i) => lineChart(m, series[m], COLORS[i % COLORS.length])));
  view.replaceChildren(head,
    grid(cols, runs, (r) => { location.hash = link(["runs"], { run: r.run_id }); }),
    el("h3", null, `Run ${run.run_id}`, el("span", { class: "dim" }, " — click a metric to add or remove its curve")),
    picker, charts, ...roleTable(roles));
}

const ROLE_COLUMNS = [
  { key: "step", label: "step", cls: "num" },
  { key: "mode", label: "mode" },
  { key: "role", label: "role", render: (r) => r.role ?? "—" },
  { key: "policy", label: "policy", cls: "mono", render: (r) => r.policy ?? "—" },
  { key: "policy_versions", label: "versions seen", cls: "mono", render: (r) => (r.policy_versions || []).join(", ") },
  { key: "rollouts", label: "rollouts", cls: "num" },
  { key: "llm_calls", label: "calls", cls: "num" },
  { key: "response_tokens", label: "sampled tok", cls: "num" },
  { key: "final_reward_mean", label: "final reward (mean)", cls: "num" },
  { key: "intermediate_reward_mean", label: "intermediate reward (mean)", cls: "num",
    title: (r) => `${fmt(r.intermediate_rewards)} intermediate reward span(s)` },
];

// The run's role_summary rows; a run whose calls name no role or policy (one agent, one policy) has no table.
function roleTable(rows) {
  const head = el("h3", null, "Per role", el("span", { class: "dim" }, " — last attempts' calls and rewards by step"));
  if (!rows.some((r) => r.role !== null || r.policy !== null)) {
    return [head, el("p", { class: "dim", id: "no-roles" },
      "No call of this run names an agent role or a policy (attributes.agent / attributes.policy).")];
  }
  const table = grid(ROLE_COLUMNS, rows, null);
  table.id = "roles-table";
  return [head, el("div", { class: "scroll" }, table)];
}
