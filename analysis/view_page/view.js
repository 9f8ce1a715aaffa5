// The rlpost samples viewer (served by analysis/view.py). The page's state lives in the URL hash
// (#page?key=value...), so every view can be linked to (the report does); the server filters and pages.
"use strict";

const PALETTE = ["#f4a261", "#8ecae6", "#b5e48c", "#cdb4db", "#ffd166", "#90be6d", "#f28482", "#a8dadc",
  "#e9c46a", "#bde0fe", "#ffafcc", "#caffbf", "#d4a373", "#c8b6ff"];
const PAGE_SIZE = 25;
const PAGES = ["collapse", "trajectories", "evals", "compare"];
let INDEX = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function route() {
  const [page, qs] = location.hash.slice(1).split("?");
  return { page: PAGES.includes(page) ? page : "collapse", q: new URLSearchParams(qs || "") };
}

function go(page, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined && v !== false) q.set(k, v);
  location.hash = page + "?" + q.toString();
}

async function api(path, params) {
  const res = await fetch(path + "?" + new URLSearchParams(params || {}).toString());
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function showErrors(lines) {
  const all = [...(INDEX ? INDEX.errors : []), ...(lines || [])];
  $("errors").replaceChildren(...all.map((line) => el("div", {}, line)));
}

function options(select, items, chosen) {
  select.replaceChildren(...items.map(([value, label]) => el("option", { value }, label)));
  if (chosen !== null && chosen !== undefined && items.some(([v]) => v === chosen)) select.value = chosen;
}

function fmt(x) {
  return x === null || x === undefined ? "–" : typeof x === "number" ? (Number.isInteger(x) ? x : x.toFixed(3)) : x;
}

function rendered(page) {
  window.rlpostRenders = (window.rlpostRenders || 0) + 1;
  document.body.dataset.rendered = page;
  if (window.rlpostFirstRender === undefined) window.rlpostFirstRender = performance.now();
}

// ---- collapse: one prompt across steps, a column per run -------------------------------------------

function classKey(r) {
  if (r.class !== null && r.class !== undefined) return "class " + r.class;
  if (r.answer !== null && r.answer !== undefined) return "answer " + r.answer;
  return "text " + (r.text || "").trim();
}

function groupCell(record) {
  if (!record) return el("td", { class: "empty" }, "not logged");
  const sizes = new Map();
  for (const r of record.responses) sizes.set(classKey(r), (sizes.get(classKey(r)) || 0) + 1);
  const ranked = [...sizes.entries()].sort((a, b) => b[1] - a[1]).map(([k]) => k);
  const chips = record.responses.map((r) => {
    const colour = PALETTE[ranked.indexOf(classKey(r)) % PALETTE.length];
    const label = r.answer !== null && r.answer !== undefined ? r.answer : (r.text || "").trim().slice(0, 24) || "∅";
    const tip = [`${classKey(r)}`, `reward ${fmt(r.reward)}`, `correct ${fmt(r.correct)}`, `quality ${fmt(r.quality)}`,
      `diversity ${fmt(r.diversity)}`, `advantage ${fmt(r.advantage)}`, `length ${fmt(r.length)} (${r.finish || "?"})`,
      "", ...(Array.isArray(r.turns)  // multi-turn: every turn, the model's and the environment's told apart
        ? r.turns.map((t) => `[${t.who || t.role}] ${t.text}`) : [r.text])].join("\n");
    return el("span", { class: "chip" + (r.correct === 0 ? " wrong" : ""), style: `background:${colour}`, title: tip },
      label + (r.correct === 1 ? " ✓" : r.correct === 0 ? " ✗" : ""));
  });
  const right = record.responses.filter((r) => r.correct === 1).length;
  const hasCorrect = record.responses.some((r) => r.correct !== null && r.correct !== undefined);
  return el("td", { "data-classes": sizes.size },
    el("div", { class: "prompt" }, record.prompt),
    el("div", { class: "chips" }, ...chips),
    el("div", { class: "cellnote" }, `${sizes.size} class${sizes.size === 1 ? "" : "es"} / ${record.responses.length}` +
      (hasCorrect ? ` · ${right} correct` : "")));
}

function defaultRuns() {
  const seen = new Set(), out = [];
  for (const r of INDEX.runs) if (!seen.has(r.arm)) { seen.add(r.arm); out.push(r.run_id); }
  return out;
}

// The run checkboxes and the prompt select of a page (prefix "c" or "t"); the chosen prompt's groups
// from the server (`steps`: all, or the first and the last logged step), or null when there is none.
async function chooseGroups(page, prefix, q, steps) {
  const kind = q.get("kind") || "val";
  const runs = q.has("runs") ? q.get("runs").split(",").filter(Boolean) : defaultRuns();
  $(prefix + "-kind").value = kind;
  $(prefix + "-runs").replaceChildren(el("span", {}, "runs:"), ...INDEX.runs.map((r) => {
    const box = el("input", { type: "checkbox", value: r.run_id });
    box.checked = runs.includes(r.run_id);
    box.addEventListener("change", () => {
      const chosen = [...$(prefix + "-runs").querySelectorAll("input:checked")].map((b) => b.value);
      go(page, { kind, runs: chosen.join(","), key: q.get("key") || "" });
    });
    return el("label", {}, box, " " + r.label);
  }));
  if (!runs.length) {
    $(prefix + "-grid").replaceChildren(el("p", {}, INDEX.runs.length ? "choose a run" : "no runs to show"));
    showErrors([]);
    return null;
  }
  const listing = await api("/api/prompts", { runs: runs.join(","), kind });
  const key = q.get("key") || (listing.prompts[0] ? listing.prompts[0].key : "");
  options($(prefix + "-key"), listing.prompts.map((p) => [p.key, p.label.length > 90 ? p.label.slice(0, 90) + "…" : p.label]), key);
  const data = key ? await api("/api/collapse", { runs: runs.join(","), kind, key, steps }) : { steps: [], runs: [], errors: [] };
  showErrors([...listing.errors, ...data.errors.filter((e) => !listing.errors.includes(e))]);
  if (!data.steps.length) {
    $(prefix + "-grid").replaceChildren(el("p", {}, `no ${kind} samples for this choice`));
    return null;
  }
  return data;
}

async function renderCollapse(q) {
  const data = await chooseGroups("collapse", "c", q, "all");
  if (!data) return rendered("collapse");
  const head = el("tr", {}, el("th", {}, "step"), ...data.runs.map((r) =>
    el("th", {}, r.label, " ", el("a", { href: r.link, target: "_blank", rel: "noopener" }, "MLflow"))));
  const rows = data.steps.map((s) => el("tr", {}, el("td", { class: "step" }, `step ${s}`),
    ...data.runs.map((r) => groupCell(r.cells[String(s)]))));
  $("c-grid").replaceChildren(el("table", { class: "grid", id: "collapse-table" }, head, ...rows));
  rendered("collapse");
}

// ---- trajectories: one prompt at the first and the last logged step, every turn labelled ---------------

function turnRow(who, text) {
  return el("div", { class: "turn", "data-who": who }, el("span", { class: `who who-${who}` }, who), el("pre", {}, text));
}

function trajectory(r, k) {
  const turns = Array.isArray(r.turns) ? r.turns.map((t) => turnRow(t.who || t.role, t.text)) : [turnRow("model", r.text || "")];
  const meta = [`#${k + 1}`, `answer ${fmt(r.answer)}`, r.correct === 1 ? "✓" : r.correct === 0 ? "✗" : "ungraded",
    `reward ${fmt(r.reward)}`, r.tool_calls !== undefined ? `tool calls ${fmt(r.tool_calls)}` : null,
    r.stop ? `stop ${r.stop}` : null].filter((x) => x !== null).join(" · ");
  return el("div", { class: "traj" + (r.correct === 1 ? " right" : r.correct === 0 ? " wrong" : "") },
    el("div", { class: "meta" }, meta), ...turns);
}

function trajectoryCell(record) {
  if (!record) return el("td", { class: "empty" }, "not logged");
  const right = record.responses.filter((r) => r.correct === 1).length;
  const multiTurn = record.responses.some((r) => r.tool_calls !== undefined);
  const calls = record.responses.filter((r) => r.tool_calls > 0).length;
  return el("td", { "data-step": record.step },
    el("div", { class: "cellnote" }, `${right} of ${record.responses.length} correct` + (multiTurn ? ` · ${calls} called a tool` : "")),
    ...record.responses.map(trajectory));
}

async function renderTrajectories(q) {
  const data = await chooseGroups("trajectories", "t", q, "ends");
  if (!data) return rendered("trajectories");
  const head = el("tr", {}, el("th", {}, "run"), ...data.steps.map((s, i) =>
    el("th", {}, `step ${s}` + (data.steps.length > 1 ? (i === 0 ? " (first logged)" : " (last logged)") : ""))));
  const rows = data.runs.map((r) => el("tr", {},
    el("td", { class: "step" }, r.label, " ", el("a", { href: r.link, target: "_blank", rel: "noopener" }, "MLflow")),
    ...data.steps.map((s) => trajectoryCell(r.cells[String(s)]))));
  const prompt = data.runs.map((r) => Object.values(r.cells).find(Boolean)).find(Boolean);
  $("t-grid").replaceChildren(el("div", { class: "prompt" }, prompt ? prompt.prompt : ""),
    el("table", { class: "grid", id: "trajectories-table" }, head, ...rows));
  rendered("trajectories");
}

// ---- eval samples: one checkpoint and suite, filtered and paged on the server ------------------------

function evalLabel(e) {
  return `${e.ckpt} / ${e.suite}` + (e.n_items ? ` (${e.n_items} items)` : "");
}

function badge(correct) {
  if (correct === 1) return el("span", { class: "badge right" }, "right");
  if (correct === 0) return el("span", { class: "badge wrong" }, "wrong");
  return el("span", { class: "badge none" }, "ungraded");
}

function sampleCard(s) {
  return el("div", { class: "card sample" },
    el("div", { class: "meta" }, el("b", {}, `${s.id}` + (s.k ? ` #${s.k}` : "")), badge(s.correct),
      el("span", {}, `dataset ${s.dataset}`), el("span", {}, `answer: ${fmt(s.answer)}`),
      el("span", {}, `gold: ${fmt(s.gold && s.gold.length > 80 ? s.gold.slice(0, 80) + "…" : s.gold)}`),
      el("span", {}, `score: ${fmt(s.score)}`),
      ...Object.entries(s.extra || {}).map(([k, v]) => el("span", {}, `${k}: ${typeof v === "object" ? JSON.stringify(v) : fmt(v)}`))),
    el("details", {}, el("summary", {}, "prompt"), el("pre", {}, s.prompt || "(not stored)")),
    el("pre", {}, s.response),
    s.rationale ? el("details", {}, el("summary", {}, "judge's rationale"), el("pre", {}, s.rationale)) : null);
}

function pager(box, page, offset, matched, total) {
  const prev = el("button", {}, "◀ previous"), next = el("button", {}, "next ▶");
  prev.disabled = offset <= 0;
  next.disabled = offset + PAGE_SIZE >= matched;
  prev.addEventListener("click", () => go(page.name, { ...page.params, offset: Math.max(0, offset - PAGE_SIZE) }));
  next.addEventListener("click", () => go(page.name, { ...page.params, offset: offset + PAGE_SIZE }));
  const shown = matched ? `${offset + 1}–${Math.min(offset + PAGE_SIZE, matched)} of ${matched}` : "0 of 0";
  box.replaceChildren(prev, el("span", { id: box.id + "-count" }, `${shown} matching` + (total !== null ? ` (${total} samples)` : "")), next);
}

function pickEval(q) {
  if (q.get("eval")) return q.get("eval");
  const mine = INDEX.evals.filter((e) => (!q.get("run") || e.run_id === q.get("run")) && (!q.get("suite") || e.suite === q.get("suite")));
  mine.sort((a, b) => (a.step || 0) - (b.step || 0));
  return mine.length ? mine[mine.length - 1].key : (INDEX.evals[0] ? INDEX.evals[0].key : "");
}

async function renderEvals(q) {
  const key = pickEval(q);
  options($("e-eval"), INDEX.evals.map((e) => [e.key, evalLabel(e)]), key);
  const params = { eval: key, wrong: q.get("wrong") || "", unparsed: q.get("unparsed") || "", score_min: q.get("score_min") || "",
    score_max: q.get("score_max") || "", dataset: q.get("dataset") || "" };
  $("e-wrong").checked = params.wrong === "1";
  $("e-unparsed").checked = params.unparsed === "1";
  $("e-smin").value = params.score_min;
  $("e-smax").value = params.score_max;
  if (!key) {
    $("e-list").replaceChildren(el("p", {}, "no eval results to show"));
    showErrors([]);
    return rendered("evals");
  }
  const entry = INDEX.evals.find((e) => e.key === key);
  $("e-link").textContent = entry && entry.link ? "its MLflow run" : "";
  if (entry && entry.link) $("e-link").href = entry.link;
  const offset = Number(q.get("offset") || 0);
  const data = await api("/api/evals", { ...params, offset, limit: PAGE_SIZE });
  options($("e-dataset"), [["", "all"], ...data.datasets.map((d) => [d, d])], params.dataset);
  showErrors(data.errors);
  pager($("e-pager"), { name: "evals", params }, offset, data.matched, data.total);
  $("e-list").replaceChildren(...(data.samples.length ? data.samples.map(sampleCard) : [el("p", {}, "no sample matches these filters")]));
  rendered("evals");
}

function evalsParams() {
  return { eval: $("e-eval").value, wrong: $("e-wrong").checked ? "1" : "", unparsed: $("e-unparsed").checked ? "1" : "",
    score_min: $("e-smin").value, score_max: $("e-smax").value, dataset: $("e-dataset").value };
}

// ---- compare: two checkpoints on the same items -------------------------------------------------------

async function renderCompare(q) {
  const keys = INDEX.evals.map((e) => e.key);
  const a = q.get("a") || keys[0] || "";
  const sameSuite = INDEX.evals.filter((e) => a && e.key !== a && e.suite === a.split("/").slice(1).join("/"));
  const b = q.get("b") || (sameSuite[0] ? sameSuite[0].key : keys[1] || "");
  const only = q.get("only") || "changed";
  options($("p-a"), INDEX.evals.map((e) => [e.key, evalLabel(e)]), a);
  options($("p-b"), INDEX.evals.map((e) => [e.key, evalLabel(e)]), b);
  $("p-only").value = only;
  if (!a || !b) {
    $("p-list").replaceChildren(el("p", {}, "two eval results are needed to compare"));
    showErrors([]);
    return rendered("compare");
  }
  const offset = Number(q.get("offset") || 0);
  const data = await api("/api/compare", { a, b, only, offset, limit: PAGE_SIZE });
  showErrors(data.errors);
  pager($("p-pager"), { name: "compare", params: { a, b, only } }, offset, data.matched, data.common);
  const link = (key) => {
    const e = INDEX.evals.find((x) => x.key === key);
    return e && e.link ? el("a", { href: e.link, target: "_blank", rel: "noopener" }, "MLflow run") : "";
  };
  const head = el("div", { class: "pair" }, el("h3", {}, `A: ${a} `, link(a)), el("h3", {}, `B: ${b} `, link(b)));
  $("p-list").replaceChildren(head, ...data.pairs.map(([l, r]) => el("div", { class: "pair" }, sampleCard(l), sampleCard(r))));
  rendered("compare");
}

// ---- wiring ---------------------------------------------------------------------------------------------

async function render() {
  const { page, q } = route();
  for (const name of PAGES) $("page-" + name).hidden = name !== page;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.page === page);
  try {
    if (page === "collapse") await renderCollapse(q);
    else if (page === "trajectories") await renderTrajectories(q);
    else if (page === "evals") await renderEvals(q);
    else await renderCompare(q);
  } catch (err) {
    showErrors([String(err.message || err)]);
    rendered(page);
  }
}

function wire() {
  for (const [page, prefix] of [["collapse", "c"], ["trajectories", "t"]]) {
    $(prefix + "-kind").addEventListener("change", () => go(page, { kind: $(prefix + "-kind").value, runs: route().q.get("runs") || "" }));
    $(prefix + "-key").addEventListener("change", () => {
      const q = route().q;
      go(page, { kind: $(prefix + "-kind").value, runs: q.get("runs") || "", key: $(prefix + "-key").value });
    });
  }
  for (const id of ["e-eval", "e-wrong", "e-unparsed", "e-smin", "e-smax", "e-dataset"]) {
    $(id).addEventListener("change", () => {
      const p = evalsParams();
      if (id === "e-eval") p.dataset = "";
      go("evals", p);
    });
  }
  for (const id of ["p-a", "p-b", "p-only"]) {
    $(id).addEventListener("change", () => go("compare", { a: $("p-a").value, b: $("p-b").value, only: $("p-only").value }));
  }
  window.addEventListener("hashchange", render);
}

async function start() {
  wire();
  try {
    INDEX = await api("/api/index");
  } catch (err) {
    $("errors").replaceChildren(el("div", {}, "cannot reach the viewer's server: " + (err.message || err)));
    return rendered("none");
  }
  await render();
}

start();
