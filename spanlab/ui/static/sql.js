// The SQL box: one read-only query on the store, as `spanlab sql` runs it; results as a table.
import { api, el, fmt, grid } from "./common.js";

const EXAMPLE = "SELECT rollout_id, status, attempts, final_reward, llm_calls, response_tokens\n"
  + "FROM rollout_summary ORDER BY enqueue_time DESC LIMIT 20";

function cell(v) {
  const text = fmt(v);
  return text.length > 120 ? text.slice(0, 119) + "…" : text;
}

export async function renderSql(view, params) {
  const box = el("textarea", { class: "sql", id: "sql-query", spellcheck: "false" });
  box.value = params.get("q") || sessionStorage.getItem("spanlab.sql") || EXAMPLE;
  const maxRows = el("input", { type: "number", id: "sql-max-rows", min: 1, max: 5000, value: 200 });
  const status = el("span", { class: "dim", id: "sql-status" });
  const out = el("div", { class: "scroll", id: "sql-result" });
  const run = async () => {
    sessionStorage.setItem("spanlab.sql", box.value);
    status.textContent = "running…";
    out.replaceChildren();
    const t0 = performance.now();
    try {
      const res = await api("/api/sql", { query: box.value, max_rows: Number(maxRows.value) || 200 });
      const cols = res.columns.map((c) => ({ key: c, label: c, cls: "mono", render: (r) => cell(r[c]), title: (r) => fmt(r[c]) }));
      out.replaceChildren(grid(cols, res.rows, null));
      status.textContent = `${res.rows.length} row(s)${res.truncated ? " (more: raise max rows)" : ""} in `
        + `${(performance.now() - t0).toFixed(0)} ms`;
    } catch (err) {
      status.textContent = "";
      out.replaceChildren(el("p", { class: "error", id: "sql-error" }, err.message));
    }
    view.dataset.sqlDone = String(Date.now());
  };
  box.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); } });
  view.replaceChildren(
    el("h2", null, "SQL ", el("span", { class: "dim" },
      "read-only: views llm_calls, rewards, rollout_summary, tito_sessions; tables rollouts, attempts, spans, train_metrics")),
    box,
    el("div", { class: "sqlbar" }, el("button", { id: "sql-run", onclick: run }, "Run (Ctrl+Enter)"),
      el("label", { class: "dim" }, "max rows ", maxRows), status),
    out);
}
