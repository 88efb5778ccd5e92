// The search page: one form, POST /search, hits rendered with highlighted words and channel bars.
"use strict";
const COLORS = { sparse: "#4e79a7", bm25: "#f28e2b", encoder: "#59a14f", dense: "#b07aa1", "dense-ef": "#9c755f" };
const $ = (id) => document.getElementById(id);

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem("apiKey");
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function escapeHtml(s) {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function escapeRegex(s) { return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }

// the snippet as HTML, every occurrence of a matched word (a whole word) wrapped in <mark>
function highlight(text, words) {
  const safe = escapeHtml(text);
  const ws = words.filter((w) => w.length > 1).sort((a, b) => b.length - a.length).map((w) => escapeRegex(escapeHtml(w)));
  if (!ws.length) return safe;
  return safe.replace(new RegExp("(^|[^\\p{L}\\p{N}])(" + ws.join("|") + ")(?![\\p{L}\\p{N}])", "giu"), "$1<mark>$2</mark>");
}

// one bar per hit, as long as its score relative to the top hit's, split by each channel's share
function bar(channels, score, top) {
  const total = Object.values(channels).reduce((a, b) => a + b, 0) || score || 1;
  const width = top > 0 ? Math.max(4, 100 * score / top) : 100;
  return '<div class="bar-box"><div class="bar" style="width:' + width.toFixed(1) + '%" title="' + escapeHtml(Object.entries(channels).map(([c, v]) => c + " " + (100 * v / total).toFixed(0) + "%").join(", ")) + '">'
    + Object.entries(channels).map(([c, v]) =>
      '<span class="share" data-channel="' + c + '" style="width:' + (100 * v / total).toFixed(1) + "%;background:" + (COLORS[c] || "#999") + '"></span>').join("")
    + "</div></div>";
}

function number(v) { return Math.abs(v) >= 10 ? v.toFixed(0) : v.toPrecision(2); }

function words(matched) {
  return Object.entries(matched).slice(0, 8).map(([w, v]) => "<code>" + escapeHtml(w) + " " + number(v) + "</code>").join("");
}

function render(data, jsonHref) {
  const list = $("hits");
  const top = data.hits.length ? data.hits[0].score : 0;
  list.innerHTML = data.hits.map((h) =>
    '<li class="hit"><div class="hit-head">'
    + (h.title ? '<span class="title">' + escapeHtml(h.title) + "</span>" : "")
    + (h.title !== h.id ? '<span class="id">' + escapeHtml(h.id) + "</span>" : "")
    + '<span class="score">' + h.score.toFixed(3) + "</span></div>"
    + (h.snippet ? '<p class="snippet">' + highlight(h.snippet, h.highlight) + "</p>" : "")
    + (Object.keys(h.channels).length ? bar(h.channels, h.score, top) : "")
    + '<div class="words">' + words(h.matched) + "</div></li>").join("");
  $("status").innerHTML = data.hits.length + " hit(s), mode " + escapeHtml(data.mode) + ", " + data.took_ms.toFixed(1)
    + ' ms · <a id="json-link" href="' + jsonHref + '">JSON</a>';
}

async function search(event) {
  if (event) event.preventDefault();
  const query = $("query").value;
  const body = { query: query, k: parseInt($("k").value, 10) };
  if ($("mode").value) body.mode = $("mode").value;
  const params = new URLSearchParams({ q: query, k: body.k });
  if (body.mode) params.set("mode", body.mode);
  $("status").textContent = "searching…";
  const res = await fetch("/search", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const data = await res.json();
  if (!res.ok) {
    $("hits").innerHTML = "";
    $("status").innerHTML = '<span class="error">' + res.status + ": " + escapeHtml(String(data.detail)) + "</span>";
    if (res.status === 401) $("key-row").hidden = false;
    return;
  }
  render(data, "/search?" + params.toString());
}

async function loadInfo() {
  const res = await fetch("/info", { headers: headers() });
  if (res.status === 401) { $("key-row").hidden = false; $("info").textContent = "API key needed"; return; }
  const info = await res.json();
  $("info").textContent = info.documents + " documents · " + info.describe + " · model " + info.model.name
    + (info.adapter ? " + " + info.adapter.path : "") + (info.encoder ? " · encoder " + info.encoder : "");
  for (const m of info.modes) {
    const o = document.createElement("option");
    o.value = m; o.textContent = m; $("mode").appendChild(o);
  }
  $("legend").innerHTML = info.channels.map((c) => '<span><i style="background:' + (COLORS[c] || "#999") + '"></i>' + c + "</span>").join("");
  document.body.dataset.ready = "1";
}

$("search-form").addEventListener("submit", search);
$("api-key").addEventListener("change", (e) => { sessionStorage.setItem("apiKey", e.target.value); loadInfo(); });
loadInfo();
