// uniagent dashboard: training runs (a local trainer's output directory). Plain JS, no build step,
// nothing fetched from outside the dashboard; uses api/esc/fmt/pct/when/poll from app.js. Routes:
//   #/train/T        one training run
//   #/train/T,U,...  several overlaid on the same charts (sync vs async)
// Every chart is drawn here as SVG from /api/train/T; a key a run did not log is shown as "–".
"use strict";

const TRAIN_COLORS = ["#2f5fb3", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285", "#5c940d", "#495057"];
const trainColor = (k) => TRAIN_COLORS[k % TRAIN_COLORS.length];
const trainPicked = new Set(); // training runs ticked on the runs page, kept across its re-renders

const TRAIN_CHARTS = [
  // [chart id, title, [[key, style label], ...], fixed [lo, hi] or null]
  ["reward", "reward per step", [["reward_mean", "reward mean"], ["resolved_rate", "resolved rate"]], [0, 1]],
  ["loss", "loss", [["loss", "loss"]], null],
  ["clipfrac", "PPO clipped fraction", [["pg_clipfrac", "pg_clipfrac"]], null],
  ["ppo-kl", "PPO KL (trainer, old → new)", [["ppo_kl", "ppo_kl"]], null],
  ["mismatch", "rollout ↔ trainer mismatch", [["rollout_corr/kl", "KL"], ["training/rollout_logprob_diff_mean", "|Δ logprob| mean"]], null],
  ["is-ratio", "importance ratio (rollout_corr)", [["rollout_corr/rollout_is_mean", "mean"], ["rollout_corr/rollout_is_max", "max"]], null],
  ["step-s", "wall time per step (s)", [["step_s", "step"], ["rollout_s", "rollout"], ["update_s", "update"]], null],
  ["tok-s", "rollout tokens/s", [["rollout_tokens_per_s", "rollout tok/s"]], null],
  ["idle", "idle fraction of the step", [["trainer_idle_frac", "trainer idle"], ["engine_idle_frac", "engine idle"]], [0, 1]],
  ["version", "policy version / oldest lag", [["policy_version", "policy version"], ["staleness_max", "staleness max"]], null],
];
const DASHES = ["", "5 4", "2 3"];

const finite = (v) => typeof v === "number" && Number.isFinite(v);
const lookup = (row, key) => (finite(row[key]) ? row[key] : null);

function lineChart(id, title, runs, keys, range, width = 440, height = 190) {
  // One line per (run, key): colour = run, dash = key. A missing value breaks the line.
  const pad = { l: 44, r: 10, t: 22, b: 24 };
  const lines = [];
  runs.forEach((run, k) => keys.forEach(([key, label], d) => {
    const pts = run.rows.map((r) => [r.step, lookup(r, key)]);
    if (pts.some((p) => p[1] !== null)) lines.push({ run, k, key, label, d, pts });
  }));
  const head = `<div class="train-chart" id="chart-${id}" data-lines="${lines.length}"><div class="muted">${esc(title)}</div>`;
  if (!lines.length) return `${head}<p class="muted nodata">– (not logged by ${runs.length > 1 ? "these runs" : "this run"})</p></div>`;
  const xs = lines.flatMap((l) => l.pts.filter((p) => p[1] !== null).map((p) => p[0]));
  const ys = lines.flatMap((l) => l.pts.filter((p) => p[1] !== null).map((p) => p[1]));
  let lo = Math.min(...ys), hi = Math.max(...ys);
  if (range) { lo = Math.min(range[0], lo); hi = Math.max(range[1], hi); }
  if (hi === lo) { hi += Math.abs(hi) * 0.1 || 1; lo -= range ? 0 : Math.abs(lo) * 0.1; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  const X = (s) => pad.l + ((width - pad.l - pad.r) * (s - x0)) / (x1 - x0 || 1);
  const Y = (v) => pad.t + (height - pad.t - pad.b) * (1 - (v - lo) / (hi - lo || 1));
  const grid = [lo, (lo + hi) / 2, hi]
    .map((v) => `<line x1="${pad.l}" x2="${width - pad.r}" y1="${Y(v).toFixed(1)}" y2="${Y(v).toFixed(1)}" stroke="#e5e5e0"/><text x="${pad.l - 4}" y="${(Y(v) + 3).toFixed(1)}" text-anchor="end">${fmt(v, 3)}</text>`)
    .join("");
  const paths = lines.map((l) => {
    let d = "", pen = false;
    for (const [s, v] of l.pts) {
      if (v === null) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(s).toFixed(1)},${Y(v).toFixed(1)}`;
      pen = true;
    }
    const dots = l.pts.length <= 60
      ? l.pts.filter((p) => p[1] !== null).map(([s, v]) => `<circle cx="${X(s).toFixed(1)}" cy="${Y(v).toFixed(1)}" r="2.5" fill="${trainColor(l.k)}"><title>${esc(l.run.name)} step ${s}: ${esc(l.label)} ${fmt(v, 4)}</title></circle>`).join("")
      : "";
    return `<path class="series" data-run="${l.run.id}" data-key="${esc(l.key)}" d="${d}" fill="none" stroke="${trainColor(l.k)}" stroke-width="2" stroke-dasharray="${DASHES[l.d % DASHES.length]}"/>${dots}`;
  }).join("");
  const legend = lines
    .map((l) => `<span><svg width="22" height="8"><line x1="0" x2="22" y1="4" y2="4" stroke="${trainColor(l.k)}" stroke-width="2" stroke-dasharray="${DASHES[l.d % DASHES.length]}"/></svg>${runs.length > 1 ? esc(l.run.name) + " · " : ""}${esc(l.label)}</span>`)
    .join("");
  return `${head}<svg class="chart" width="100%" viewBox="0 0 ${width} ${height}" role="img" aria-label="${esc(title)}">
    ${grid}${paths}
    <text x="${pad.l}" y="${height - 6}">step ${x0}</text><text x="${width - pad.r}" y="${height - 6}" text-anchor="end">step ${x1}</text>
  </svg><div class="legend">${legend}</div></div>`;
}

function stalenessChart(runs, width = 440, height = 190) {
  // Episodes trained at each lag (versions behind the trainer), summed over the run: bars per run.
  const hists = runs.map((r) => r.summary.staleness_hist);
  const head = `<div class="train-chart" id="chart-staleness"><div class="muted">staleness histogram (episodes trained per lag, whole run)</div>`;
  if (!hists.some((h) => h)) return `${head}<p class="muted nodata">– (no staleness logged: a sync run)</p></div>`;
  const lags = [...new Set(hists.flatMap((h) => Object.keys(h || {}).map(Number)))].sort((a, b) => a - b);
  const top = Math.max(1, ...hists.flatMap((h) => Object.values(h || {})));
  const pad = { l: 44, r: 10, t: 12, b: 24 };
  const slot = (width - pad.l - pad.r) / Math.max(lags.length, 1);
  const bw = (slot * 0.8) / runs.length;
  const Y = (v) => pad.t + (height - pad.t - pad.b) * (1 - v / top);
  let bars = "";
  lags.forEach((lag, i) => {
    runs.forEach((run, k) => {
      const n = (hists[k] || {})[String(lag)];
      if (n === undefined) return;
      const x = pad.l + slot * i + slot * 0.1 + bw * k;
      bars += `<rect class="stale-bar" data-run="${run.id}" data-lag="${lag}" data-n="${n}" x="${x.toFixed(1)}" y="${Y(n).toFixed(1)}" width="${bw.toFixed(1)}" height="${(Y(0) - Y(n)).toFixed(1)}" fill="${trainColor(k)}"><title>${esc(run.name)}: ${n} episodes ${lag} version(s) behind</title></rect>`;
    });
    bars += `<text x="${(pad.l + slot * (i + 0.5)).toFixed(1)}" y="${height - 8}" text-anchor="middle">lag ${lag}</text>`;
  });
  const grid = [0, top / 2, top].map((v) => `<line x1="${pad.l}" x2="${width - pad.r}" y1="${Y(v).toFixed(1)}" y2="${Y(v).toFixed(1)}" stroke="#e5e5e0"/><text x="${pad.l - 4}" y="${(Y(v) + 3).toFixed(1)}" text-anchor="end">${fmt(v, 1)}</text>`).join("");
  const legend = runs.map((r, k) => `<span><i style="background:${trainColor(k)}"></i>${esc(r.name)}${hists[k] ? "" : " –"}</span>`).join("");
  return `${head}<svg class="chart" width="100%" viewBox="0 0 ${width} ${height}" role="img" aria-label="staleness histogram">${grid}${bars}</svg><div class="legend">${legend}</div></div>`;
}

const TRAIN_ROWS = [
  // [label, (summary) => shown]
  ["mode", (s) => esc(s.mode ?? "–")],
  ["policy version", (s) => fmt(s.policy_version)],
  ["steps", (s) => fmt(s.steps)],
  [`reward, first ${5} steps`, (s) => fmt(s.reward_first)],
  [`reward, last ${5} steps`, (s) => fmt(s.reward_last)],
  ["resolved, last 5", (s) => pct(s.resolved_last)],
  ["s / step", (s) => fmt(s.step_s_mean, 2)],
  ["rollout tok/s", (s) => fmt(s.rollout_tokens_per_s_mean, 1)],
  ["trainer idle", (s) => pct(s.trainer_idle_frac_mean)],
  ["engine idle", (s) => pct(s.engine_idle_frac_mean)],
  ["staleness max", (s) => fmt(s.staleness_max)],
  ["interrupted", (s) => fmt(s.interrupted)],
  ["groups dropped (zero var.)", (s) => fmt(s.groups_dropped_zero_variance)],
  ["episodes stale-dropped", (s) => fmt(s.episodes_stale_dropped)],
  ["episodes no gradient", (s) => fmt(s.episodes_no_gradient)],
  ["wall s", (s) => fmt(s.wall_s, 1)],
];

function trainSummaryTable(runs) {
  // One column per run, one row per figure: two runs side by side read as a comparison.
  const head = `<tr><th></th>${runs.map((r, k) => `<th class="num" data-train="${r.id}"><i class="swatch" style="background:${trainColor(k)}"></i><a href="#/train/${r.id}">${esc(r.name)}</a></th>`).join("")}</tr>`;
  const body = TRAIN_ROWS
    .map(([label, f]) => `<tr data-row="${esc(label)}"><td>${esc(label)}</td>${runs.map((r) => `<td class="num" data-train="${r.id}">${f(r.summary)}</td>`).join("")}</tr>`)
    .join("");
  return `<table id="train-summary">${head}${body}</table>`;
}

function overlayPicker(all, ids) {
  // One chip per training run: click to add it to (or take it off) the charts.
  if (all.length < 2) return "";
  const chips = all
    .map((r) => {
      const on = ids.includes(r.id);
      const next = on ? ids.filter((i) => i !== r.id) : [...ids, r.id];
      const href = next.length ? `#/train/${next.join(",")}` : "#/";
      return `<a class="${on ? "current" : ""}" data-train="${r.id}" href="${href}">${esc(r.name)}</a>`;
    })
    .join("");
  return `<div class="segment-switch" id="train-overlay"><span class="muted">overlay</span>${chips}</div>`;
}

async function trainingPage(idsText) {
  const ids = [...new Set(String(idsText).split(",").filter((x) => x !== "").map(Number))];
  const seq = routeSeq;
  let last = "";
  const render = async () => {
    const [all, ...runs] = await Promise.all([api("train"), ...ids.map((i) => api(`train/${i}`))]);
    const sig = JSON.stringify(runs);
    if (seq !== routeSeq || sig === last) return; // nothing new: keep the page (and any hover)
    last = sig;
    const names = runs.map((r) => r.name).join(" vs ");
    setCrumbs([["runs", "#/"], [`training: ${names}`, `#/train/${ids.join(",")}`]]);
    const notes = runs
      .filter((r) => r.skipped_lines)
      .map((r) => `<p class="muted">${esc(r.name)}: ${r.skipped_lines} line(s) of metrics.jsonl are not JSON rows and were skipped</p>`)
      .join("");
    const files = runs
      .map((r) => `<div class="muted">${esc(r.name)}: ${esc(r.path)} · ${r.checkpoints.length} checkpoint(s)${r.checkpoints.length ? ` (last ${esc(r.checkpoints[r.checkpoints.length - 1])})` : ""}${r.has_curve ? ` · <a href="api/train/${r.id}/reward_curve.png" target="_blank">reward_curve.png</a>` : ""}</div>`)
      .join("");
    view.innerHTML = `<h1 id="train-title">Training ${runs.length > 1 ? "runs" : "run"}: ${esc(names)}</h1>
      ${overlayPicker(all, ids)}${files}${notes}
      ${trainSummaryTable(runs)}
      <div class="train-grid">${TRAIN_CHARTS.map(([id, title, keys, range]) => lineChart(id, title, runs, keys, range)).join("")}${stalenessChart(runs)}</div>`;
  };
  if (!ids.length) throw new Error("no training run picked: #/train/0 or #/train/0,1");
  await render();
  poll(render);
}

function compareLink(ids) {
  return ids.length
    ? `<a id="train-compare" href="#/train/${ids.join(",")}">compare ${ids.length} selected on one chart →</a>`
    : `<span class="muted" id="train-compare">tick runs to compare them on one chart</span>`;
}

async function trainingList() {
  // The runs page's section for training runs (empty when the dashboard was given none).
  const runs = await api("train");
  if (!runs.length) return "";
  const pickedIds = runs.filter((r) => trainPicked.has(r.id)).map((r) => r.id);
  const cards = runs
    .map((r) => {
      const s = r.summary;
      const stat = (k, v) => `<div class="stat"><div class="v">${v}</div><div class="k">${k}</div></div>`;
      return `<div class="card train" data-train="${r.id}">
        <h2><label><input type="checkbox" class="train-pick" data-train="${r.id}" ${trainPicked.has(r.id) ? "checked" : ""}></label>
          <a href="#/train/${r.id}">${esc(r.name)}</a> <span class="muted">${esc(r.path)}</span></h2>
        <div class="stats">${stat("mode", esc(s.mode ?? "–"))}${stat("steps", `<span class="n-steps">${s.steps}</span>`)}${stat("policy version", fmt(s.policy_version))}
          ${stat("reward, last 5 steps", fmt(s.reward_last))}${stat("s / step", fmt(s.step_s_mean, 2))}${stat("last step", when(s.last_time))}</div>
      </div>`;
    })
    .join("");
  return `<h1>Training runs</h1><p>${compareLink(pickedIds)}</p>${cards}`;
}

// The runs page re-renders as runs progress; ticks live in trainPicked, the link follows them.
document.addEventListener("change", (ev) => {
  const box = ev.target.closest && ev.target.closest("input.train-pick");
  if (!box) return;
  const id = +box.dataset.train;
  if (box.checked) trainPicked.add(id); else trainPicked.delete(id);
  const ids = [...document.querySelectorAll("input.train-pick:checked")].map((b) => +b.dataset.train);
  const link = document.getElementById("train-compare");
  if (link) link.outerHTML = compareLink(ids);
});
