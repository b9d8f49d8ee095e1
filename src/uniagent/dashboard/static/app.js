// uniagent dashboard: plain JS, no build step. Hash routes:
//   #/                               runs
//   #/run/R?exit=..&resolved=..      episodes of run R (filters and sort in the query)
//   #/run/R/ep/ID/S                  one episode
//   #/run/R/ep/ID/S/tokens?segment=K its token view, one segment at a time (the first by default)
//   #/train/T[,U...]                 training runs, overlaid (training.js)
"use strict";

const view = document.getElementById("view");
const crumbs = document.getElementById("crumbs");
const liveBadge = document.getElementById("live-status");
const tip = document.getElementById("tip");
let pollMs = 2000;
let pollTimer = null;
let routeSeq = 0;

const REASON_COLORS = {
  finished: "#2f7fd1", max_turns: "#d69e2e", format_errors: "#9f7aea", context_limit: "#ed8936",
  timeout_budget: "#e53e3e", sandbox_dead: "#718096", model_error: "#4a5568", verifier_error: "#a0aec0",
  cancelled: "#cbd5e0", internal_error: "#1a202c", sandbox_broken: "#c53030", workspace_destroyed: "#9b2c2c",
};
const reasonColor = (r) => REASON_COLORS[r] || "#888";

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : typeof x === "number" ? String(+x.toFixed(d)) : String(x));
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const yesno = (b) => `<span class="badge ${b ? "yes" : "no"}">${b ? "yes" : "no"}</span>`;
const when = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "–");

async function api(path) {
  const res = await fetch("api/" + path, { credentials: "same-origin" });
  if (!res.ok) {
    let detail = res.statusText;
    try { detail = (await res.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new Error(`${res.status}: ${detail}`);
  }
  return res.json();
}

function setCrumbs(parts) {
  crumbs.innerHTML = parts
    .map(([label, href]) => (href ? `<a href="${href}">${esc(label)}</a>` : `<span>${esc(label)}</span>`))
    .join('<span class="sep">/</span>');
}

function poll(fn) {
  if (pollTimer) clearInterval(pollTimer);
  pollTimer = null;
  if (!fn) { liveBadge.classList.add("off"); liveBadge.textContent = "static"; return; }
  liveBadge.classList.remove("off");
  liveBadge.textContent = "live";
  const seq = routeSeq;
  pollTimer = setInterval(async () => {
    if (seq !== routeSeq) return;
    try { await fn(); liveBadge.classList.remove("err"); } catch (e) { liveBadge.classList.add("err"); }
  }, pollMs);
}

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), params: new URLSearchParams(query || "") };
}

async function route() {
  routeSeq += 1;
  poll(null);
  tip.hidden = true;
  const { parts, params } = parseHash();
  try {
    if (parts[0] === "run" && parts[2] === "ep" && parts[5] === "tokens") await tokenPage(+parts[1], parts[3], +parts[4], params);
    else if (parts[0] === "run" && parts[2] === "ep") await episodePage(+parts[1], parts[3], +parts[4]);
    else if (parts[0] === "run") await episodesPage(+parts[1], params);
    else if (parts[0] === "train") await trainingPage(parts[1] || "");
    else await runsPage();
  } catch (e) {
    view.innerHTML = `<p class="err">${esc(e.message)}</p>`;
  }
}

// ---------------------------------------------------------------------------------------- runs
function exitBar(reasons, total) {
  const entries = Object.entries(reasons || {});
  const bar = entries
    .map(([r, n]) => `<span style="width:${(100 * n) / Math.max(total, 1)}%;background:${reasonColor(r)}" title="${esc(r)}: ${n}"></span>`)
    .join("");
  const legend = entries.map(([r, n]) => `<span><i style="background:${reasonColor(r)}"></i>${esc(r)} ${n}</span>`).join("");
  return `<div class="bar">${bar}</div><div class="legend exit-legend">${legend}</div>`;
}

function rewardChart(series, width = 640, height = 170) {
  const pad = { l: 34, r: 10, t: 10, b: 24 };
  const pts = series.filter((p) => p.reward !== null && p.reward !== undefined);
  if (!pts.length) return `<p class="muted">no rewards yet</p>`;
  const ys = pts.map((p) => p.reward);
  const lo = Math.min(0, ...ys), hi = Math.max(1, ...ys);
  const n = Math.max(series.length - 1, 1);
  const X = (i) => pad.l + ((width - pad.l - pad.r) * i) / n;
  const Y = (v) => pad.t + (height - pad.t - pad.b) * (1 - (v - lo) / (hi - lo || 1));
  let sum = 0;
  const mean = pts.map((p, k) => { sum += p.reward; return `${X(p.i).toFixed(1)},${Y(sum / (k + 1)).toFixed(1)}`; });
  const dots = pts
    .map((p) => `<circle cx="${X(p.i).toFixed(1)}" cy="${Y(p.reward).toFixed(1)}" r="3" fill="${p.resolved ? "#1a7f37" : "#c0392b"}" fill-opacity=".7"><title>#${p.i} ${esc(p.instance_id)}#${p.sample}: reward ${fmt(p.reward)} (${esc(p.exit_reason)}) at ${when(p.t)}</title></circle>`)
    .join("");
  const grid = [lo, (lo + hi) / 2, hi]
    .map((v) => `<line x1="${pad.l}" x2="${width - pad.r}" y1="${Y(v)}" y2="${Y(v)}" stroke="#e5e5e0"/><text x="4" y="${Y(v) + 3}">${fmt(v, 2)}</text>`)
    .join("");
  return `<svg class="chart reward-chart" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="reward per episode">
    ${grid}
    <polyline points="${mean.join(" ")}" fill="none" stroke="#2f5fb3" stroke-width="2"/>
    ${dots}
    <text x="${pad.l}" y="${height - 6}">episode 0 (first finished)</text>
    <text x="${width - pad.r}" y="${height - 6}" text-anchor="end">${series.length - 1} (${when(series[series.length - 1].t)})</text>
  </svg>
  <div class="legend"><span><i style="background:#1a7f37"></i>resolved</span><span><i style="background:#c0392b"></i>not resolved</span><span><i style="background:#2f5fb3"></i>running mean reward</span></div>`;
}

function runCard(run, series) {
  const s = run.summary;
  const stat = (k, v, cls = "") => `<div class="stat ${cls}"><div class="v">${v}</div><div class="k">${k}</div></div>`;
  return `<div class="card run" data-run="${run.id}">
    <h2><a href="#/run/${run.id}">${esc(run.name)}</a> <span class="muted">${esc(run.path)}</span></h2>
    <div class="muted">model ${esc(run.model)} · tasks ${esc(run.tasks)} · last episode ${when(s.last_finished_at)}</div>
    <div class="stats">
      ${stat("episodes", `<span class="n-episodes">${s.episodes}</span> / ${s.planned}`)}
      ${stat("resolved rate", pct(s.resolved_rate), "resolved-rate")}
      ${stat("mean reward", fmt(s.mean_reward), "mean-reward")}
      ${stat("trainable", pct(s.trainable_fraction), "trainable")}
      ${stat("tokens/s" + (s.tokens_per_s_live ? " (so far)" : ""), fmt(s.tokens_per_s, 1), "tps")}
      ${stat("pass@1", fmt(s["pass@1"]))}
      ${stat("bookkeeping drift", s.episodes_with_bookkeeping_drift)}
      ${stat("sampled retokenized", s.episodes_with_sampled_retokenization)}
      ${s.episodes_with_template_drift ? stat("template drift", s.episodes_with_template_drift) : ""}
    </div>
    <div class="muted">exit reasons</div>
    ${exitBar(s.exit_reasons, s.episodes)}
    <div class="muted" style="margin-top:10px">reward per episode, in the order they finished</div>
    ${rewardChart(series)}
  </div>`;
}

async function runsPage() {
  setCrumbs([["runs", "#/"]]);
  const seq = routeSeq;
  let last = "";
  const render = async () => {
    const runs = await api("runs");
    const series = await Promise.all(runs.map((r) => api(`runs/${r.id}/series`)));
    const html = (runs.length ? `<h1>Runs</h1>` : "") + runs.map((r, i) => runCard(r, series[i])).join("") + (await trainingList());
    if (seq !== routeSeq || html === last) return; // unchanged: keep the page (and any hover) as it is
    last = html;
    view.innerHTML = html;
  };
  await render();
  poll(render);
}

// ------------------------------------------------------------------------------------ episodes
const COLUMNS = [
  ["instance_id", "instance"], ["sample", "sample", "num"], ["exit_reason", "exit reason"], ["reward", "reward", "num"],
  ["resolved", "resolved"], ["trainable", "trainable"], ["turns", "turns", "num"], ["prompt_tokens", "prompt tok", "num"],
  ["completion_tokens", "gen tok", "num"], ["num_segments", "segments", "num"], ["drift", "drift", "num"], ["wall_s", "wall s", "num"],
  ["finished_at", "finished"],
];

async function episodesPage(rid, params) {
  const run = await api(`runs/${rid}`);
  setCrumbs([["runs", "#/"], [run.name, `#/run/${rid}`]]);
  const f = {
    exit: params.get("exit") || "", resolved: params.get("resolved") || "", trainable: params.get("trainable") || "",
    q: params.get("q") || "", sort: params.get("sort") || "finished_at", desc: params.get("desc") === "1",
  };
  view.innerHTML = `<h1>Episodes of ${esc(run.name)}</h1>
    <div class="muted" id="ep-count"></div>
    <div class="filters">
      <label>exit reason <select id="f-exit"><option value="">any</option></select></label>
      <label>resolved <select id="f-resolved"><option value="">any</option><option value="true">yes</option><option value="false">no</option></select></label>
      <label>trainable <select id="f-trainable"><option value="">any</option><option value="true">yes</option><option value="false">no</option></select></label>
      <label>instance <input type="search" id="f-q" placeholder="search instance id"></label>
    </div>
    <table id="episodes"><thead><tr>${COLUMNS.map(([k, label, cls]) => `<th class="sortable ${cls || ""}" data-sort="${k}">${label}</th>`).join("")}</tr></thead><tbody></tbody></table>`;
  const $ = (id) => document.getElementById(id);
  $("f-resolved").value = f.resolved;
  $("f-trainable").value = f.trainable;
  $("f-q").value = f.q;
  let known = null;
  let lastSig = "";
  const seq = routeSeq;

  const syncHash = () => {
    const p = new URLSearchParams();
    for (const k of ["exit", "resolved", "trainable", "q"]) if (f[k]) p.set(k, f[k]);
    if (f.sort !== "finished_at") p.set("sort", f.sort);
    if (f.desc) p.set("desc", "1");
    history.replaceState(null, "", `#/run/${rid}` + (p.toString() ? "?" + p : ""));
  };
  const load = async () => {
    const p = new URLSearchParams({ sort: f.sort, desc: f.desc });
    if (f.exit) p.set("exit_reason", f.exit);
    if (f.resolved) p.set("resolved", f.resolved);
    if (f.trainable) p.set("trainable", f.trainable);
    if (f.q) p.set("q", f.q);
    const data = await api(`runs/${rid}/episodes?${p}`);
    const sig = p.toString() + JSON.stringify(data);
    if (seq !== routeSeq || sig === lastSig) return; // nothing new: leave the table alone
    lastSig = sig;
    const sel = $("f-exit");
    const have = new Set([...sel.options].map((o) => o.value));
    for (const r of data.exit_reasons) if (!have.has(r)) sel.add(new Option(r, r));
    if (f.exit && !have.has(f.exit) && !data.exit_reasons.includes(f.exit)) sel.add(new Option(f.exit, f.exit));
    sel.value = f.exit;
    $("ep-count").textContent = `${data.count} shown of ${data.total} episodes`;
    const keys = data.episodes.map((e) => `${e.instance_id}#${e.sample}`);
    const fresh = known ? new Set(keys.filter((k) => !known.has(k))) : new Set();
    known = new Set([...(known || []), ...keys]);
    document.querySelectorAll("#episodes th").forEach((th) => {
      th.classList.toggle("sorted", th.dataset.sort === f.sort);
      th.classList.toggle("desc", th.dataset.sort === f.sort && f.desc);
    });
    $("episodes").querySelector("tbody").innerHTML = data.episodes
      .map((e, i) => {
        const href = `#/run/${rid}/ep/${encodeURIComponent(e.instance_id)}/${e.sample}`;
        return `<tr data-key="${esc(keys[i])}" class="${fresh.has(keys[i]) ? "new" : ""}">
          <td><a href="${href}">${esc(e.instance_id)}</a></td><td class="num">${e.sample}</td>
          <td><span class="badge ${esc(e.exit_reason)}">${esc(e.exit_reason)}</span></td>
          <td class="num">${fmt(e.reward)}</td><td>${yesno(e.resolved)}</td><td>${yesno(e.trainable)}</td>
          <td class="num">${e.turns}</td><td class="num">${e.prompt_tokens}</td><td class="num">${e.completion_tokens}</td>
          <td class="num">${e.num_segments ?? "–"}</td><td class="num">${fmt(e.drift)}</td><td class="num">${fmt(e.wall_s, 1)}</td><td>${when(e.finished_at)}</td></tr>`;
      })
      .join("");
  };
  const change = () => { syncHash(); load(); };
  $("f-exit").onchange = (e) => { f.exit = e.target.value; change(); };
  $("f-resolved").onchange = (e) => { f.resolved = e.target.value; change(); };
  $("f-trainable").onchange = (e) => { f.trainable = e.target.value; change(); };
  $("f-q").oninput = (e) => { f.q = e.target.value.trim(); change(); };
  document.querySelectorAll("#episodes th.sortable").forEach((th) => {
    th.onclick = () => {
      if (f.sort === th.dataset.sort) f.desc = !f.desc;
      else { f.sort = th.dataset.sort; f.desc = false; }
      change();
    };
  });
  await load();
  poll(load);
}

// ------------------------------------------------------------------------------------- episode
function renderDiff(patch) {
  if (!patch) return `<p class="muted">no patch</p>`;
  const lines = patch.split("\n").map((l) => {
    const cls = l.startsWith("+++") || l.startsWith("---") ? "" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : l.startsWith("@@") ? "hunk" : "";
    return cls ? `<span class="${cls}">${esc(l)}</span>` : esc(l) + "\n";
  });
  return `<pre class="diff" id="patch">${lines.join("")}</pre>`;
}

function renderArgs(raw) {
  // Arguments one per line; string values as they are (a bash script reads as a script).
  let args = raw;
  try { args = typeof raw === "string" ? JSON.parse(raw) : raw; } catch (e) { return `<pre>${esc(raw)}</pre>`; }
  if (!args || typeof args !== "object" || Array.isArray(args)) return `<pre>${esc(JSON.stringify(args, null, 2))}</pre>`;
  const keys = Object.keys(args);
  if (!keys.length) return `<pre class="muted">(no arguments)</pre>`;
  return keys
    .map((k) => {
      const v = args[k];
      return `<div class="arg"><span class="muted">${esc(k)}</span><pre>${esc(typeof v === "string" ? v : JSON.stringify(v, null, 2))}</pre></div>`;
    })
    .join("");
}

function renderMessage(m, i) {
  const role = m.role || "?";
  let body = "";
  const content = Array.isArray(m.content) ? m.content.map((c) => c.text ?? JSON.stringify(c)).join("\n") : m.content;
  const parsed = m.parsed || {};
  if (parsed.tool_calls) {
    // Calls written in the text: the thought, the calls as parsed, and the raw text folded away.
    if (parsed.thought) body += `<pre>${esc(parsed.thought)}</pre>`;
    body += `<details class="raw"><summary class="muted">raw text</summary><pre>${esc(content)}</pre></details>`;
  } else if (content) body += `<pre>${esc(content)}</pre>`;
  if (parsed.format_error) body += `<pre class="err">format error: ${esc(parsed.format_error)}</pre>`;
  for (const c of m.tool_calls || parsed.tool_calls || []) {
    const fn = c.function || c;
    body += `<div class="call"><div class="name">→ ${esc(fn.name)} ${c.id ? `<span class="muted">${esc(c.id)}</span>` : ""}</div>${renderArgs(fn.arguments)}</div>`;
  }
  const extra = [m.name ? `tool ${esc(m.name)}` : "", m.tool_call_id ? `call ${esc(m.tool_call_id)}` : ""].filter(Boolean).join(" · ");
  return `<div class="msg ${esc(role)}" data-role="${esc(role)}"><div class="head"><b>${esc(role)}</b><span class="muted">#${i}</span><span class="muted">${extra}</span></div>${body || '<pre class="muted">(empty)</pre>'}</div>`;
}

function renderVerifier(v) {
  if (!v) return `<p class="muted">no verifier report</p>`;
  if (typeof v !== "object") return `<pre>${esc(v)}</pre>`;
  const rows = Object.entries(v)
    .map(([k, val]) => {
      const text = typeof val === "string" ? val : JSON.stringify(val, null, 2);
      const long = text.length > 80 || text.includes("\n");
      return `<tr><td>${esc(k)}</td><td>${long ? `<pre>${esc(text)}</pre>` : esc(text)}</td></tr>`;
    })
    .join("");
  return `<table class="kv" id="verifier">${rows}</table>`;
}

function renderTimings(ep) {
  const t = ep.timings || {};
  const parts = [["sandbox_start_s", "#718096"], ["setup_s", "#a0aec0"], ["model_s", "#2e8b57"], ["tools_s", "#2f5fb3"], ["verifier_s", "#d69e2e"]];
  const total = parts.reduce((a, [k]) => a + (t[k] || 0), 0) || 1;
  const bar = parts.filter(([k]) => t[k]).map(([k, c]) => `<span style="width:${(100 * t[k]) / total}%;background:${c}" title="${k}: ${fmt(t[k], 2)} s"></span>`).join("");
  const legend = parts.map(([k, c]) => `<span><i style="background:${c}"></i>${k.replace(/_s$/, "").replace("_", " ")} ${fmt(t[k], 2)} s</span>`).join("");
  const turns = ep.turn_table || [];
  const hasReal = turns.some((r) => Object.keys(r).some((k) => k.endsWith("_s") && !k.endsWith("_est")));
  const keys = hasReal ? [...new Set(turns.flatMap((r) => Object.keys(r).filter((k) => k.endsWith("_s"))))] : ["model_s_est"];
  const head = `<tr><th>turn</th><th class="num">segment</th><th class="num">generated tokens</th><th class="num">context tokens after</th><th>finish</th>${keys.map((k) => `<th class="num">${k === "model_s_est" ? "model s (≈, by tokens)" : esc(k)}</th>`).join("")}</tr>`;
  const body = turns.map((r) => `<tr><td>${r.turn}</td><td class="num">${fmt(r.segment)}</td><td class="num">${r.model_tokens}</td><td class="num">${r.context_tokens}</td><td>${esc(r.finish_reason ?? "–")}</td>${keys.map((k) => `<td class="num">${fmt(r[k], 2)}</td>`).join("")}</tr>`).join("");
  return `<div class="timing">${bar}</div><div class="legend">${legend}<span>episode ${fmt(ep.wall_s, 2)} s</span></div>
    <table id="turns">${head}${body}</table>
    ${hasReal ? "" : '<p class="muted">the store records model and tool time per episode; the per-turn model time is apportioned by generated tokens.</p>'}`;
}

async function episodePage(rid, iid, sample) {
  const [run, ep] = await Promise.all([api(`runs/${rid}`), api(`runs/${rid}/episodes/${encodeURIComponent(iid)}/${sample}`)]);
  const base = `#/run/${rid}/ep/${encodeURIComponent(iid)}/${sample}`;
  setCrumbs([["runs", "#/"], [run.name, `#/run/${rid}`], [`${ep.instance_id}#${sample}`, base]]);
  const segs = ep.segments || [];
  const stat = (k, v) => `<div class="stat"><div class="v">${v}</div><div class="k">${k}</div></div>`;
  // One token view per segment: a segment began at the start, or when the history was condensed or rewritten.
  const segLinks = segs
    .map((s) => `<li data-segment="${s.index}"><a class="segment-link" href="${base}/tokens?segment=${s.index}">segment ${s.index}: ${esc(s.reason)}</a>
      <span class="muted">${s.prompt_tokens} prompt + ${s.response_tokens} response tokens (${s.model_tokens} model, ${s.context_tokens} context)${s.drift !== null && s.drift !== undefined ? ` · drift at ${s.drift}${s.drift_kind ? ` (${esc(s.drift_kind)})` : ""}` : ""}${s.versions ? ` · policy version${s.versions[0] === s.versions[1] ? ` v${s.versions[0]}` : `s v${s.versions[0]}–v${s.versions[1]}`}` : ""}</span></li>`)
    .join("");
  view.innerHTML = `<h1 id="ep-title">${esc(ep.instance_id)} <span class="muted">sample ${sample}</span></h1>
    <div class="stats">
      ${stat("exit reason", `<span class="badge ${esc(ep.exit_reason)}" id="ep-exit">${esc(ep.exit_reason)}</span>`)}
      ${stat("reward", fmt(ep.reward))}${stat("resolved", yesno(ep.resolved))}${stat("trainable", yesno(ep.trainable))}
      ${stat("turns", ep.turns)}${stat("prompt / generated tokens", `${ep.prompt_tokens} / ${ep.completion_tokens}`)}
      ${stat("drift at token", fmt(ep.drift))}${stat("attempts", ep.attempts)}
      ${stat("segments", `<span id="ep-segments">${ep.num_segments}</span>`)}
    </div>
    ${ep.has_trajectory ? `<p><a id="token-link" href="${base}/tokens">Token view →</a> <span class="muted" id="segment-reasons">${segs.length} segment${segs.length === 1 ? "" : "s"}: ${segs.map((s) => esc(s.reason)).join(", ")}</span></p><ul id="segments">${segLinks}</ul>` : '<p class="muted">no token trajectory stored (a text-level model, or the episode ended before its first turn)</p>'}
    ${ep.error ? `<h2>Error</h2><pre class="err">${esc(ep.error)}</pre>` : ""}
    <h2>Timings</h2>${renderTimings(ep)}
    <div class="grid2">
      <div><h2>Conversation</h2><div id="conversation">${(ep.messages || []).map(renderMessage).join("")}</div></div>
      <div><h2>Patch</h2>${renderDiff(ep.patch)}
        ${ep.answer ? `<h2>Answer</h2><pre>${esc(ep.answer)}</pre>` : ""}
        <h2>Verifier report</h2>${renderVerifier(ep.verifier)}</div>
    </div>`;
}

// ---------------------------------------------------------------------------------- token view
function shade(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)}, 70%, ${Math.round(88 - 28 * (1 - p))}%)`;
}

// Policy versions: each model token was sampled by one version of the policy (an async trainer's
// engine lags the trainer; a partial rollout switches version mid-turn). Versions alternate between
// two bands so a change is visible; a marker "v3 → v4" stands where the version changes.
function versionLegend(data) {
  const r = data.version_range;
  if (!data.versions) return '<span id="version-legend" class="muted">policy versions unknown (the engine did not say)</span>';
  if (!r) return "";
  if (r[0] === r[1]) return `<span id="version-legend">policy version v${r[0]}</span>`;
  const seen = [];
  data.versions.forEach((v, i) => { if (data.tokens[i][2] && seen[seen.length - 1] !== v) seen.push(v); });
  const band = (v) => `<i class="vband-${((v % 2) + 2) % 2}"></i>`;
  return `<span id="version-legend">policy versions ${seen.map((v) => `${band(v)}v${v}`).join(" → ")}</span>`;
}

function segmentSwitch(base, data) {
  // One link per segment; the address picks the segment, so a view can be linked to.
  if (data.segments.length < 2) return "";
  const links = data.segments
    .map((s) => `<a href="${base}/tokens?segment=${s.index}" data-segment="${s.index}" class="${s.index === data.segment ? "current" : ""}">${s.index}: ${esc(s.reason)}</a>`)
    .join("");
  return `<div class="segment-switch" id="segment-switch"><span class="muted">segment</span>${links}</div>`;
}

async function tokenPage(rid, iid, sample, params) {
  const base = `#/run/${rid}/ep/${encodeURIComponent(iid)}/${sample}`;
  const segment = Math.max(0, parseInt(params.get("segment") || "0", 10) || 0);
  const [run, data] = await Promise.all([api(`runs/${rid}`), api(`runs/${rid}/episodes/${encodeURIComponent(iid)}/${sample}/tokens?segment=${segment}`)]);
  const here = `${base}/tokens?segment=${data.segment}`;
  setCrumbs([["runs", "#/"], [run.name, `#/run/${rid}`], [`${data.instance_id}#${sample}`, base], [`tokens, segment ${data.segment}`, here]]);
  const toks = data.tokens;
  const special = new Set(data.special);
  // Segments: the prompt, then the trajectory's spans (already offset by the prompt length).
  const segs = [{ start: 0, end: data.prompt_len, kind: "prompt", role: "prompt", turn: -1 }, ...data.spans];
  const versions = data.versions;
  const banded = !!(data.version_range && data.version_range[0] !== data.version_range[1]);
  let lastVersion = null;
  const covered = segs.length ? segs[segs.length - 1].end : 0;
  if (covered < toks.length) segs.push({ start: covered, end: toks.length, kind: "context", role: "uncovered", turn: -1 });
  let html = "";
  for (const s of segs) {
    if (s.end <= s.start) continue;
    html += `<span class="seg ${s.kind}" data-kind="${s.kind}" data-start="${s.start}" data-end="${s.end}" data-role="${esc(s.role)}">`;
    for (let i = s.start; i < s.end; i++) {
      const [id, text, m, lp] = toks[i];
      const v = versions && m ? versions[i] : null;
      if (v !== null && lastVersion !== null && v !== lastVersion) {
        html += `<span class="version-marker" data-from="${lastVersion}" data-to="${v}" title="the policy was updated: from here tokens were sampled by v${v}">v${lastVersion} → v${v}</span>`;
      }
      if (v !== null) lastVersion = v;
      if (i === data.drift) html += `<span class="drift-marker" id="drift-marker" title="drift: the running sequence differs from a full render from here">▼ drift</span>`;
      const redacted = id === null;
      const shown = redacted ? text || "▪" : text.replace(/\n/g, "↵\n") || "∅";
      const style = m && !redacted ? ` style="background:${shade(lp)}"` : "";
      const cls = (special.has(id) ? " special" : "") + (i === data.drift ? " drift" : "") + (redacted ? " redacted" : "")
        + (banded && v !== null ? ` vband-${((v % 2) + 2) % 2}` : "");
      const ver = v !== null ? ` data-v="${v}"` : "";
      html += `<span class="t${cls}" data-i="${i}" data-m="${m}"${ver}${style}>${esc(shown)}</span>`;
    }
    html += `</span>`;
  }
  const model = toks.filter((t) => t[2]).length;
  view.innerHTML = `<h1>Tokens of ${esc(data.instance_id)} <span class="muted">sample ${sample} · segment <span id="segment-shown">${data.segment}</span> of ${data.segments.length} (${esc(data.reason)})</span></h1>
    ${segmentSwitch(base, data)}
    <div class="stats">
      <div class="stat"><div class="v">${toks.length}</div><div class="k">tokens</div></div>
      <div class="stat"><div class="v">${data.prompt_len}</div><div class="k">prompt</div></div>
      <div class="stat"><div class="v">${model}</div><div class="k">model (mask 1)</div></div>
      <div class="stat"><div class="v">${toks.length - data.prompt_len - model}</div><div class="k">context in response (mask 0)</div></div>
      <div class="stat"><div class="v">${data.drift === null ? "none" : data.drift}</div><div class="k">drift at</div></div>
      <div class="stat"><div class="v" id="version-range">${!data.versions ? "unknown" : !data.version_range ? "–" : data.version_range[0] === data.version_range[1] ? `v${data.version_range[0]}` : `v${data.version_range[0]}–v${data.version_range[1]}`}</div><div class="k">policy version</div></div>
    </div>
    <div class="legend"><span><i style="background:var(--prompt)"></i>prompt</span><span><i style="background:var(--context)"></i>context (mask 0)</span>
      <span><i style="background:${shade(0)}"></i>model, p≈1</span><span><i style="background:${shade(Math.log(0.5))}"></i>p=0.5</span><span><i style="background:${shade(Math.log(0.05))}"></i>p=0.05</span>
      ${versionLegend(data)}
      <span class="muted">tokenizer: ${esc(data.tokenizer)} · hover a token for id, text, logprob and version</span>
      ${data.drift !== null ? '<a href="#" id="goto-drift">jump to drift</a>' : ""}</div>
    <div id="tokens">${html}</div>`;
  const box = document.getElementById("tokens");
  box.addEventListener("mouseover", (ev) => {
    const el = ev.target.closest(".t");
    if (!el) { tip.hidden = true; return; }
    const i = +el.dataset.i;
    const [id, text, m, lp] = toks[i];
    const seg = el.parentElement.dataset;
    tip.textContent = `#${i}  id ${id === null ? "(redacted)" : id}\ntext ${JSON.stringify(text)}\n${m ? "model" : "context"} (mask ${m}) · ${seg.role}\nlogprob ${m ? lp.toFixed(4) + `  (p=${Math.exp(lp).toFixed(3)})` : "–"}${m ? `\npolicy version ${versions ? "v" + versions[i] : "unknown"}` : ""}${i === data.drift ? "\nDRIFT starts here" : ""}`;
    tip.hidden = false;
  });
  box.addEventListener("mousemove", (ev) => {
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 300) + "px";
    tip.style.top = ev.clientY + 16 + "px";
  });
  box.addEventListener("mouseleave", () => { tip.hidden = true; });
  const jump = document.getElementById("goto-drift");
  if (jump) jump.onclick = (e) => { e.preventDefault(); document.getElementById("drift-marker").scrollIntoView({ block: "center" }); };
}

// ------------------------------------------------------------------------------------------ boot
(async () => {
  try { pollMs = (await api("health")).poll_ms || pollMs; } catch (e) { /* keep the default */ }
  window.addEventListener("hashchange", route);
  route();
})();
