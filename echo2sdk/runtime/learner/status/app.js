// The echo2 status page: polls /api/status every second and redraws. Plain DOM and SVG; every value from
// the run goes in through textContent (worker ids are chosen by the workers).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const POLL_MS = 1000;

function $(id) { return document.getElementById(id); }

function svg(tag, attrs, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

// A fraction as a percentage, as the page shows every rate (the filter rate, accuracy).
function pct(x) {
  return x === null || x === undefined ? "-" : `${fmt(100 * x, 1)} %`;
}

function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); }

function drawFacts(s) {
  const run = s.run, L = s.learner;
  $("run-name").textContent = run.name;
  $("step").textContent = `${run.step} / ${run.steps}`;
  $("version").textContent = String(run.version);
  $("budget").textContent = `${run.S} / ${run.kappa} / ${run.R}`;
  $("bubble").textContent = `${fmt(100 * L.bubble_ratio, 1)} %`;
  $("wait").textContent = `${fmt(L.last_wait_s, 2)} s / ${fmt(L.last_train_s, 2)} s`;
  const c = L.wait_by_cause_s;
  $("wait-causes").textContent = `${fmt(c.filtered, 1)} / ${fmt(c.snapshot, 1)} / ${fmt(c.empty, 1)} s`;
  $("tbcast").textContent = `${fmt(s.broadcast.t_bcast_s, 2)} s / ${fmt(s.broadcast.t_bcast_all_s, 2)} s`;
  $("cost").textContent = `$${fmt(s.cost.usd, 4)} (${fmt(s.cost.usd_per_hour, 2)} $/h)`;
  const b = s.bill;
  $("per-point").textContent = b.gain_points > 0
    ? `${fmt(b.rollouts_per_point, 1)} rollouts, ${fmt(b.machine_hours_per_point, 4)} h, $${fmt(b.usd_per_point, 4)}`
    : "no gain yet";
  const f = s.failures;
  $("failures").textContent = f.last ? `${f.last} (${fmt(100 * f.rate, 1)} %) / ${f.total}` : `0 / ${f.total}`;
  $("progress-bar").style.width = `${run.steps ? (100 * run.step) / run.steps : 0}%`;
  drawPromptFilter(s.prompt_filter);
}

// Pre-rollout prompt skipping at the last step: "off" where the filter is off, "-" before the first step.
function drawPromptFilter(p) {
  const off = p.enabled === false, r = p.skipped_by_reason;
  $("skipped").textContent = off ? "off" : p.enabled
    ? `${p.skipped ?? 0} (${r.all_correct ?? 0} / ${r.all_wrong ?? 0} / ${r.all_same ?? 0})` : "-";
  $("filter-rate").textContent = `${pct(p.filter_rate)} / ${off ? "off" : pct(p.filter_rate_unskipped)}`;
  $("per-useful").textContent = fmt(p.rollouts_per_useful, 2);
  $("explore").textContent = off ? "off" : pct(p.explore);
}

function drawWorkers(workers) {
  const body = $("workers").querySelector("tbody");
  clear(body);
  for (const w of workers) {
    const tr = document.createElement("tr");
    tr.dataset.worker = w.id;
    tr.className = `state-${w.state}`;
    const cells = [w.id, w.state, `v${w.version}`, String(w.lag), fmt(w.mu, 2), fmt(w.price, 2),
                   String(w.trajectories), String(w.rejected)];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      if (i === 1) {
        const badge = document.createElement("span");
        badge.className = `badge ${w.state}`;
        badge.textContent = text;
        td.appendChild(badge);
      } else {
        td.textContent = text;
      }
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

// Learner on the left, one row per chain, relays left to right; rollout-only leaves under their parent.
function drawChains(b, workers) {
  const el = $("chains");
  clear(el);
  const label = b.topology === "direct" ? "direct push (star)" : `${b.topology}, ${b.chains.length} chain(s)`;
  $("bcast-info").textContent = b.version === null ? label : `${label}, plan of v${b.version}`;
  const state = Object.fromEntries(workers.map((w) => [w.id, w.state]));
  const rows = b.chains.length + (b.leaves.length ? 1 : 0);
  const height = Math.max(120, 40 + rows * 44);
  el.setAttribute("viewBox", `0 0 400 ${height}`);
  const src = { x: 40, y: 30 + ((rows - 1) * 44) / 2 };
  const pos = { [b.source]: src };
  const longest = Math.max(1, ...b.chains.map((c) => c.length));
  const step = Math.min(90, 330 / longest);
  b.chains.forEach((chain, i) => {
    const y = 30 + i * 44;
    chain.forEach((id, j) => { pos[id] = { x: 110 + j * step, y }; });
  });
  b.leaves.forEach(([id], j) => { pos[id] = { x: 110 + j * step, y: 30 + b.chains.length * 44 }; });
  const edges = [];
  for (const chain of b.chains) chain.forEach((id, j) => edges.push([j ? chain[j - 1] : b.source, id]));
  for (const [id, parent] of b.leaves) edges.push([parent, id]);
  for (const [a, c] of edges) {
    if (!pos[a] || !pos[c]) continue;
    el.appendChild(svg("line", { x1: pos[a].x, y1: pos[a].y, x2: pos[c].x, y2: pos[c].y, class: "edge" }));
  }
  el.appendChild(svg("circle", { cx: src.x, cy: src.y, r: 16, class: "node source" }));
  el.appendChild(svg("text", { x: src.x, y: src.y + 30, class: "node-label" }, "learner"));
  for (const [id, p] of Object.entries(pos)) {
    if (id === b.source) continue;
    el.appendChild(svg("circle", { cx: p.x, cy: p.y, r: 10, class: `node ${state[id] || "gone"}` }));
    el.appendChild(svg("text", { x: p.x, y: p.y - 14, class: "node-label" }, id.length > 14 ? id.slice(0, 13) + "…" : id));
  }
}

function drawStaleness(st) {
  const el = $("staleness");
  clear(el);
  const S = st.S;
  const counts = [];
  for (let d = 0; d <= S; d++) counts.push(st.hist[String(d)] || 0);
  const top = Math.max(1, ...counts);
  const w = 360 / counts.length;
  counts.forEach((n, d) => {
    const h = (110 * n) / top;
    el.appendChild(svg("rect", { x: 30 + d * w + 4, y: 130 - h, width: w - 8, height: h, class: "bar" }));
    el.appendChild(svg("text", { x: 30 + d * w + w / 2, y: 148, class: "axis-label" }, `Δ=${d}`));
    el.appendChild(svg("text", { x: 30 + d * w + w / 2, y: 124 - h, class: "bar-label" }, String(n)));
  });
  el.appendChild(svg("line", { x1: 30, y1: 130, x2: 390, y2: 130, class: "axis" }));
}

// Reward (solid) and accuracy (dashed) against the learner step; y from 0 to the largest value seen (at least 1).
function drawReward(points) {
  const el = $("reward-curve");
  clear(el);
  el.dataset.points = String(points.length);
  const W = Math.max(300, el.clientWidth || 800), H = 220, left = 44, right = 12, top = 12, bottom = 28;
  el.setAttribute("viewBox", `0 0 ${W} ${H}`);  // drawn at the element's own width: text is never stretched
  const maxStep = Math.max(1, ...points.map((p) => p[0]));
  const minStep = points.length ? points[0][0] : 0;
  const ys = points.flatMap((p) => [p[2], p[3]]).filter((v) => v !== null);
  const lo = Math.min(0, ...ys), hi = Math.max(1, ...ys);
  const X = (s) => left + ((s - minStep) / Math.max(1, maxStep - minStep)) * (W - left - right);
  const Y = (v) => H - bottom - ((v - lo) / (hi - lo)) * (H - top - bottom);
  for (const v of [lo, (lo + hi) / 2, hi]) {
    el.appendChild(svg("line", { x1: left, y1: Y(v), x2: W - right, y2: Y(v), class: "grid" }));
    el.appendChild(svg("text", { x: left - 6, y: Y(v) + 4, class: "y-label" }, fmt(v, 2)));
  }
  el.appendChild(svg("text", { x: left, y: H - 8, class: "x-label" }, `step ${minStep}`));
  el.appendChild(svg("text", { x: W - right, y: H - 8, class: "x-label end" }, `step ${maxStep}`));
  el.appendChild(svg("line", { x1: W / 2 - 110, y1: H - 12, x2: W / 2 - 90, y2: H - 12, class: "reward" }));
  el.appendChild(svg("text", { x: W / 2 - 84, y: H - 8, class: "x-label" }, "reward"));
  el.appendChild(svg("line", { x1: W / 2 + 10, y1: H - 12, x2: W / 2 + 30, y2: H - 12, class: "accuracy" }));
  el.appendChild(svg("text", { x: W / 2 + 36, y: H - 8, class: "x-label" }, "accuracy"));
  if (!points.length) {
    el.appendChild(svg("text", { x: W / 2, y: H / 2, class: "empty" }, "waiting for the first learner step"));
    return;
  }
  const line = (i) => points.filter((p) => p[i] !== null).map((p) => `${X(p[0]).toFixed(1)},${Y(p[i]).toFixed(1)}`).join(" ");
  el.appendChild(svg("polyline", { points: line(3), class: "accuracy" }));
  el.appendChild(svg("polyline", { points: line(2), class: "reward" }));
  for (const p of points.slice(-200).filter((p) => p[2] !== null)) {
    el.appendChild(svg("circle", { cx: X(p[0]), cy: Y(p[2]), r: 2.5, class: "reward-point" }));
  }
}

// A mixture's components (metrics "tasks"): one row each; the card stays hidden for a single task.
function drawTasks(tasks) {
  $("tasks-card").hidden = !tasks.length;
  const body = $("tasks").querySelector("tbody");
  clear(body);
  for (const t of tasks) {
    const tr = document.createElement("tr");
    tr.dataset.task = t.name;
    for (const text of [t.name, String(t.groups_completed ?? 0), pct(t.rollout_accuracy), fmt(t.rollout_reward_mean, 3),
                        pct(t.filter_rate), String(t.trajectories), pct(t.accuracy)]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

async function poll() {
  try {
    const r = await fetch("/api/status", { credentials: "same-origin", cache: "no-store" });
    if (r.status === 401) throw new Error("401: open the URL printed at start (with ?token=)");
    const s = await r.json();
    if (!r.ok) throw new Error(s.error || `HTTP ${r.status}`);
    drawFacts(s);
    drawWorkers(s.workers);
    drawChains(s.broadcast, s.workers);
    drawStaleness(s.staleness);
    drawReward(s.reward);
    drawTasks(s.tasks);
    $("connection").textContent = "live";
    $("connection").className = "pill live";
  } catch (e) {
    $("connection").textContent = e.message.startsWith("401") ? e.message : "run not reachable";
    $("connection").className = "pill down";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
