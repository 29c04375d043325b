// Token view: every token as text (ID on hover), sampled vs prompt/tool-delta colouring, segment boundaries,
// and tokens that re-tokenizing the decoded text would change.
import { api, el, fmt, link, pager } from "./common.js";

const tip = () => document.getElementById("tip");

function shown(text) {
  // make whitespace visible without losing the layout: newlines get a mark and still break the line
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function describe(d, i) {
  const lines = [`id ${d.ids[i]} · position ${d.offset + i}`, d.mask[i] ? "sampled (loss mask 1)" : "prompt / tool delta (mask 0)"];
  if (d.text) lines.push(`text ${JSON.stringify(d.text[i])}`);
  if (d.logprobs[i] !== null && d.logprobs[i] !== undefined) lines.push(`logprob ${d.logprobs[i].toFixed(4)}`);
  if (d.retokenized[i]) lines.push(`re-tokenizing gives [${d.retokenized[i].join(", ")}]`);
  return lines.join("\n");
}

function tokenNodes(d) {
  const starts = new Set(d.segment_starts);
  const frag = document.createDocumentFragment();
  d.ids.forEach((id, i) => {
    const pos = d.offset + i;
    if (starts.has(pos) && (pos > 0 || d.segment_starts.length > 1)) {
      const seg = d.segment_starts.indexOf(pos);
      frag.append(el("span", { class: "seg", title: `segment ${seg} starts at token ${pos}` }, `segment ${seg}`));
    }
    const text = d.text ? d.text[i] : `${id} `;
    const cls = ["tok", d.mask[i] ? "sampled" : "prompt"];
    if (d.retokenized[i]) cls.push("drift");
    if (d.text && /^<\|.*\|>$/.test(text)) cls.push("special");
    frag.append(el("span", { class: cls.join(" "), dataset: { id, i } }, shown(text)));
  });
  return frag;
}

function hover(box, d) {
  box.addEventListener("mousemove", (e) => {
    const t = e.target.closest(".tok");
    const node = tip();
    if (!t || !box.contains(t)) { node.hidden = true; return; }
    node.textContent = describe(d, Number(t.dataset.i));
    node.hidden = false;
    node.style.left = `${Math.min(e.clientX + 14, window.innerWidth - 440)}px`;
    node.style.top = `${e.clientY + 16}px`;
  });
  box.addEventListener("mouseleave", () => { tip().hidden = true; });
}

export async function renderTokens(view, kind, key, params) {
  const offset = Number(params.get("offset") || 0);
  const limit = Number(params.get("limit") || 20000);
  const route = kind === "call" ? "calls" : "sessions";
  const d = await api(`/api/${route}/${encodeURIComponent(key)}/tokens?offset=${offset}&limit=${limit}`);
  const title = kind === "call"
    ? `LLM call ${d.span_id} (call ${d.sequence_id}, ${d.model || "model ?"}, finish ${d.finish_reason || "—"}`
      + `${d.tito_mode ? ", TITO " + d.tito_mode : ""})`
    : `TITO session of attempt ${d.attempt_id} (${d.segments} segment(s))`;
  const sampledHere = d.mask.reduce((s, m) => s + m, 0);
  const stats = el("p", { class: "dim", id: "token-stats" },
    `${fmt(d.total)} tokens: ${fmt(d.num_sampled)} sampled, ${fmt(d.total - d.num_sampled)} prompt / tool delta; `,
    d.text ? `${fmt(d.num_drift)} change when re-tokenized (tokenizer ${d.tokenizer})`
      : `no tokenizer (${d.tokenizer_error || "none"}): showing IDs only`,
    d.total > d.limit ? ` · showing ${fmt(d.limit)} (${fmt(sampledHere)} sampled)` : "");
  const legend = el("div", { class: "legend" },
    el("span", { class: "tok sampled" }, "sampled (loss mask 1)"),
    el("span", { class: "tok prompt" }, "prompt / tool delta (mask 0)"),
    el("span", { class: "tok prompt drift" }, "re-tokenizing gives other IDs"),
    el("span", { class: "seg" }, "segment boundary"),
    el("span", { class: "dim" }, "hover a token for its ID"));
  const box = el("div", { class: "tokens", id: "tokens" }, tokenNodes(d));
  hover(box, d);
  const go = (o) => { location.hash = link([kind, key], { offset: o, limit }); };
  const back = d.rollout_id ? el("a", { href: link(["rollout", d.rollout_id], { attempt: d.attempt_id }) },
    `rollout ${d.rollout_id}`) : null;
  const paging = d.total > d.limit ? [pager(offset, d.limit || limit, d.total, go)] : [];
  view.replaceChildren(
    el("h2", null, el("a", { href: "#/rollouts" }, "Rollouts"), " / ", back, " / ", "tokens"),
    el("p", null, title), stats, legend, ...paging, box);
}
